/** What a handler decided about its message. @module */

/**
 * The handler's decision; build one with {@link Verdict.ack}, {@link Verdict.retry} or
 * {@link Verdict.deadLetter}. Effects (kv writes, events) commit only on ack.
 */
export class Verdict {
  /** @private */
  constructor(kind, reason, delayMs) {
    /** `'ack'`, `'retry'` or `'dead-letter'`. */
    this.kind = kind;
    /** Why (retry and dead-letter); `undefined` for ack. */
    this.reason = reason;
    /** Retry no sooner than this many milliseconds; `undefined` uses the route's backoff. */
    this.delayMs = delayMs;
    Object.freeze(this);
  }

  /** Done: commit this message's kv writes and events, then ack the delivery. */
  static ack() {
    return new Verdict('ack', undefined, undefined);
  }

  /**
   * Transient failure: discard the effects and try again later. `delayMs` asks for at least
   * that long a wait (the host picks the smallest configured backoff tier long enough).
   */
  static retry(reason, { delayMs } = {}) {
    if (delayMs === undefined || delayMs === null) {
      return new Verdict('retry', String(reason), undefined);
    }
    const ms = Number(delayMs);
    if (!Number.isFinite(ms) || ms < 0) {
      throw new RangeError(`retry delay must be a finite, non-negative number of ms, not ${delayMs}`);
    }
    return new Verdict('retry', String(reason), Math.ceil(ms));
  }

  /** Permanent failure: discard the effects and move the message to the dead-letter queue. */
  static deadLetter(reason) {
    return new Verdict('dead-letter', String(reason), undefined);
  }

  get isAck() { return this.kind === 'ack'; }
  get isRetry() { return this.kind === 'retry'; }
  get isDeadLetter() { return this.kind === 'dead-letter'; }

  toString() {
    if (this.kind === 'ack') return 'Verdict.ack()';
    if (this.kind === 'dead-letter') return `Verdict.deadLetter(${JSON.stringify(this.reason)})`;
    const delay = this.delayMs === undefined ? '' : `, { delayMs: ${this.delayMs} }`;
    return `Verdict.retry(${JSON.stringify(this.reason)}${delay})`;
  }
}
