/**
 * Typed errors thrown by the host calls, mirroring the WIT variants. Their messages are the
 * Rust SDK's, so a reason reads the same whatever language the handler is written in. Each
 * knows its conventional verdict: `error.toVerdict()`.
 * @module
 */

import { Verdict } from './verdict.js';

/** Base class of every error the SDK throws. */
export class CarteiroError extends Error {
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }

  /** True when trying again later may succeed (only {@link StoreUnavailable}). */
  get transient() { return false; }

  /** The conventional verdict: dead-letter with this error's message. */
  toVerdict() { return Verdict.deadLetter(this.message); }
}

/** A kv operation failed. */
export class KvError extends CarteiroError {}

/** The key is empty, too long, or contains a NUL character. */
export class InvalidKey extends KvError {
  constructor(why) { super(`kv: invalid key: ${why}`); this.why = why; }
}

/** The value is larger than the host accepts (`limit`, in bytes). */
export class ValueTooLarge extends KvError {
  constructor(limit) {
    super(`kv: value larger than the ${limit}-byte limit`);
    this.limit = Number(limit);
  }
}

/** The store could not be reached; returning a retry is usually right. */
export class StoreUnavailable extends KvError {
  constructor(why) { super(`kv unavailable: ${why}`); this.why = why; }
  get transient() { return true; }
  /** Retry: the store may answer later. */
  toVerdict() { return Verdict.retry(this.message); }
}

/** SDK-side only: a stored value is not the text, JSON or integer asked for. */
export class InvalidValue extends KvError {
  constructor(why) { super(`kv: ${why}`); this.why = why; }
}

/** An outbox emit failed; outbox errors are permanent for a given message. */
export class OutboxError extends CarteiroError {}

/** An exchange, routing key or header is not acceptable (NUL byte, too long, ...). */
export class InvalidEvent extends OutboxError {
  constructor(why) { super(`outbox: invalid event: ${why}`); this.why = why; }
}

/** This message already emitted the maximum number of events (`limit`). */
export class TooManyEvents extends OutboxError {
  constructor(limit) {
    super(`outbox: too many events for one message (limit ${limit})`);
    this.limit = Number(limit);
  }
}

/** The payload is larger than the host accepts (`limit`, in bytes). */
export class PayloadTooLarge extends OutboxError {
  constructor(limit) {
    super(`outbox: payload larger than the ${limit}-byte limit`);
    this.limit = Number(limit);
  }
}

/**
 * The body is not the expected UTF-8 text or JSON. `description` says what is wrong without
 * the position, in the Rust SDK's words (e.g. ``key must be a string``); `line` and `column`
 * are 1-based (0 when unknown); `isSyntax` is true when the body is not JSON at all.
 */
export class BodyError extends CarteiroError {
  constructor(description, { line = 0, column = 0, isSyntax = true } = {}) {
    super(line === 0 ? description : `${description} at line ${line} column ${column}`);
    this.description = description;
    this.line = line;
    this.column = column;
    this.isSyntax = isSyntax;
  }

  /** Dead-letter: a body that cannot be decoded will not decode on retry either. */
  toVerdict() { return Verdict.deadLetter(`invalid body: ${this.message}`); }
}
