// Types of carteiro-sdk: write Carteiro message handlers in JavaScript or TypeScript.

/** One AMQP header, flattened to text by the host. */
export interface Header {
  readonly name: string;
  readonly value: string;
}

/** Headers as accepted by the constructors: {name, value} objects, [name, value] pairs or an object. */
export type HeadersLike =
  | Iterable<Header | readonly [string, string]>
  | Record<string, string>;

/** Bytes, or a string sent as UTF-8. */
export type BytesLike = Uint8Array | ArrayBufferView | ArrayBuffer | string;

export interface MessageFields {
  id?: string;
  exchange?: string;
  routingKey?: string;
  headers?: HeadersLike;
  contentType?: string;
  body?: BytesLike;
  attempt?: number;
  redelivered?: boolean;
}

/** The message being handled. */
export class Message {
  constructor(fields?: MessageFields);
  /** A message whose body is `value` as JSON, content type `application/json`. */
  static fromJson(routingKey: string, value: unknown, fields?: MessageFields): Message;
  /** A message whose body is `text` in UTF-8. */
  static fromText(routingKey: string, text: string, fields?: MessageFields): Message;
  /** The AMQP `message-id`, if the publisher set one. */
  readonly id: string | undefined;
  /** Exchange the message was originally published to (`''` is the default exchange). */
  readonly exchange: string;
  /** Routing key the message was originally published with. */
  readonly routingKey: string;
  /** AMQP headers flattened to text, in the order they came. */
  readonly headers: readonly Header[];
  readonly contentType: string | undefined;
  readonly body: Uint8Array;
  /** 1 on the first delivery; counted by Carteiro across retries. */
  readonly attempt: number;
  /** The broker redelivered this message (a consumer died holding it). */
  readonly redelivered: boolean;
  /** The first header called `name` (exact, case-sensitive). */
  header(name: string): string | undefined;
  /** The body as UTF-8 text; throws {@link BodyError}. */
  text(): string;
  /** The body decoded from JSON; throws {@link BodyError} (Rust SDK wording). */
  json<T = unknown>(): T;
}

/** What the handler decided; effects commit only on ack. */
export class Verdict {
  private constructor();
  /** Done: commit this message's kv writes and events, then ack. */
  static ack(): Verdict;
  /** Transient failure: discard effects and retry later (no sooner than `delayMs`, if given). */
  static retry(reason: string, options?: { delayMs?: number }): Verdict;
  /** Permanent failure: discard effects and dead-letter the message. */
  static deadLetter(reason: string): Verdict;
  readonly kind: 'ack' | 'retry' | 'dead-letter';
  readonly reason: string | undefined;
  readonly delayMs: number | undefined;
  readonly isAck: boolean;
  readonly isRetry: boolean;
  readonly isDeadLetter: boolean;
}

/** Base class of every error the SDK throws. */
export class CarteiroError extends Error {
  /** True when trying again later may succeed (only {@link StoreUnavailable}). */
  readonly transient: boolean;
  /** The conventional verdict: retry for {@link StoreUnavailable}, dead-letter otherwise. */
  toVerdict(): Verdict;
}
export class KvError extends CarteiroError {}
/** The key is empty, longer than 1 KiB, or contains NUL. */
export class InvalidKey extends KvError { readonly why: string; }
/** The value is larger than the host accepts (4 MiB). */
export class ValueTooLarge extends KvError { readonly limit: number; }
/** The store could not be reached; `toVerdict()` retries. */
export class StoreUnavailable extends KvError { readonly why: string; }
/** SDK-side: a stored value is not the text, JSON or integer asked for. */
export class InvalidValue extends KvError { readonly why: string; }
export class OutboxError extends CarteiroError {}
/** An exchange, routing key or header is not acceptable (NUL, too long, ...). */
export class InvalidEvent extends OutboxError { readonly why: string; }
/** This message already emitted the maximum number of events. */
export class TooManyEvents extends OutboxError { readonly limit: number; }
/** The payload is larger than the host accepts (8 MiB). */
export class PayloadTooLarge extends OutboxError { readonly limit: number; }
/** The body is not the expected UTF-8 text or JSON. */
export class BodyError extends CarteiroError {
  /** What is wrong without the position, in the Rust SDK's words. */
  readonly description: string;
  /** 1-based; 0 when unknown. */
  readonly line: number;
  readonly column: number;
  /** True when the body is not JSON at all. */
  readonly isSyntax: boolean;
}

/** The wrapper `handler()` returns; export it as `handle`. */
export interface Handle {
  /** Natively (tests): runs the handler on a Message and returns its Verdict. */
  (message: Message): Verdict;
}

/** Marks `fn` as the component's handler: `export const handle = handler((msg) => ...)`. */
export function handler(fn: (message: Message) => Verdict): Handle;

/** Key-value state in the message's transaction; throws {@link KvError}. */
export namespace kv {
  export function get(key: string): Uint8Array | undefined;
  export function getText(key: string): string | undefined;
  export function getJson<T = unknown>(key: string): T | undefined;
  export function set(key: string, value: BytesLike): void;
  export function setJson(key: string, value: unknown): void;
  export function contains(key: string): boolean;
  /** Adds `by` to the integer counter (decimal text) and returns it; safe integers only. */
  export function incr(key: string, by?: number): number;
  /** {@link incr} over the full signed 64-bit range. */
  export function incrBig(key: string, by?: bigint): bigint;
  /** Deletes `key` (`kv.delete`); deleting a missing key is fine. */
  function kvDelete(key: string): void;
  export { kvDelete as delete };
}

export interface EmitOptions {
  headers?: HeadersLike;
  contentType?: string;
}

/** Events published after the message commits; throws {@link OutboxError}. */
export namespace outbox {
  export const JSON_CONTENT_TYPE: 'application/json';
  /** Queues an event; returns its id (a UUIDv7, the published AMQP message-id). */
  export function emit(exchange: string, routingKey: string, payload: BytesLike, options?: EmitOptions): string;
  /** Queues `value` as JSON (content type application/json); returns its id. */
  export function emitJson(exchange: string, routingKey: string, value: unknown, options?: { headers?: HeadersLike }): string;
}

/** The plugin's variables from the operator's TOML. */
export namespace config {
  export function get(name: string): string | undefined;
  export function get<T>(name: string, fallback: T): string | T;
  export function all(): Record<string, string>;
}

export type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error';

/** Logging into the gateway's tracing; in the component `console.*` is forwarded here too. */
export namespace log {
  export function log(level: Level, message: string): void;
  export function trace(message: string): void;
  export function debug(message: string): void;
  export function info(message: string): void;
  export function warn(message: string): void;
  export function error(message: string): void;
}

/** The gateway's kv key and event checks (port of the Rust SDK's `rules`). */
export namespace rules {
  export const MAX_KV_KEY_BYTES: number;
  export const MAX_KV_VALUE_BYTES: number;
  export const MAX_EVENT_PAYLOAD_BYTES: number;
  export const MAX_SHORT_STRING: number;
  export function kvKeyProblem(key: string, maxLen?: number): string | undefined;
  export function eventProblem(exchange: string, routingKey: string, headers?: readonly Header[]): string | undefined;
}
