/** The delivery a handler receives: {@link Message} and its headers. @module */

import { decodeUtf8, parseJson } from './json.js';

const encoder = new TextEncoder();

/** Headers as {name, value} objects, from an array of those, [name, value] pairs or a plain object. */
export function toHeaders(headers) {
  if (headers === undefined || headers === null) return [];
  const entries = Array.isArray(headers) || typeof headers[Symbol.iterator] === 'function'
    ? [...headers]
    : Object.entries(headers);
  return entries.map((h) => (Array.isArray(h)
    ? Object.freeze({ name: String(h[0]), value: String(h[1]) })
    : Object.freeze({ name: String(h.name), value: String(h.value) })));
}

/** Bytes from a Uint8Array, ArrayBuffer view or string (UTF-8). */
export function toBytes(value) {
  if (typeof value === 'string') return encoder.encode(value);
  if (value instanceof Uint8Array) return value;
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  throw new TypeError(`expected bytes (Uint8Array) or a string, not ${typeof value}`);
}

/**
 * The message being handled. The host builds it from the AMQP delivery; tests build it with
 * `new Message({...})`, {@link Message.fromJson} or {@link Message.fromText}.
 */
export class Message {
  constructor({
    id = undefined,
    exchange = '',
    routingKey = '',
    headers = [],
    contentType = undefined,
    body = new Uint8Array(0),
    attempt = 1,
    redelivered = false,
  } = {}) {
    /** The AMQP `message-id`, if the publisher set one. */
    this.id = id ?? undefined;
    /** Exchange the message was originally published to (`''` is the default exchange). */
    this.exchange = exchange;
    /** Routing key the message was originally published with. */
    this.routingKey = routingKey;
    /** AMQP headers flattened to text, in the order they came: `{ name, value }`. */
    this.headers = Object.freeze(toHeaders(headers));
    /** The AMQP `content-type` property, if set. */
    this.contentType = contentType ?? undefined;
    /** The raw body. */
    this.body = toBytes(body);
    /** 1 on the first delivery; counted by Carteiro across retries. */
    this.attempt = attempt;
    /** The broker redelivered this message (a consumer died holding it). */
    this.redelivered = redelivered;
    Object.freeze(this);
  }

  /** A message whose body is `value` as JSON, content type `application/json`. */
  static fromJson(routingKey, value, fields = {}) {
    const body = JSON.stringify(value);
    if (body === undefined) throw new TypeError('value cannot be encoded as JSON');
    return new Message({ contentType: 'application/json', ...fields, routingKey, body });
  }

  /** A message whose body is `text` in UTF-8. */
  static fromText(routingKey, text, fields = {}) {
    return new Message({ ...fields, routingKey, body: String(text) });
  }

  /** The value of the first header called `name` (exact, case-sensitive), or `undefined`. */
  header(name) {
    const found = this.headers.find((h) => h.name === name);
    return found === undefined ? undefined : found.value;
  }

  /** The body as UTF-8 text; throws a `BodyError` if it is not. */
  text() {
    return decodeUtf8(this.body);
  }

  /**
   * The body decoded from JSON; throws a `BodyError` whose `description` uses the Rust
   * SDK's words (e.g. ``key must be a string``).
   */
  json() {
    return parseJson(this.body);
  }
}
