/**
 * Events to publish, committed atomically with the message's kv writes; the gateway's relay
 * publishes them after commit, at least once, with the event id as the AMQP `message-id`.
 * Events of a message that ends in retry or dead-letter are discarded. Every function throws
 * an `OutboxError` (`InvalidEvent`, `TooManyEvents`, `PayloadTooLarge`).
 * @module
 */

import * as host from '#host';
import { toBytes, toHeaders } from './message.js';

/** Content type set by {@link emitJson}. */
export const JSON_CONTENT_TYPE = 'application/json';

/**
 * Queues an event for publication if the message acks; returns its id (a UUIDv7).
 * `payload` is bytes or a string (UTF-8); `headers` an object, [name, value] pairs or
 * {name, value} objects.
 */
export function emit(exchange, routingKey, payload, { headers, contentType } = {}) {
  return host.outboxEmit(String(exchange), String(routingKey), toHeaders(headers), contentType ?? undefined, toBytes(payload));
}

/** Queues `value` as a JSON event (content type `application/json`); returns its id. */
export function emitJson(exchange, routingKey, value, { headers } = {}) {
  const text = JSON.stringify(value);
  if (text === undefined) throw new TypeError('the event payload cannot be encoded as JSON');
  return emit(exchange, routingKey, text, { headers, contentType: JSON_CONTENT_TYPE });
}
