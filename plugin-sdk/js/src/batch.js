/**
 * `batchHandler(fn)`: a handler that takes several messages in one call (a route with
 * `batch`). Import it from `carteiro-sdk/batch`, so that plain handlers never import the
 * batch-handler world's `batch` interface:
 *
 * ```js
 * import { batchHandler } from 'carteiro-sdk/batch';
 * export const { handle, handleBatch } = batchHandler((batch) => batch.map(handleOne));
 * ```
 *
 * Taking message `i` from the {@link Batch} (iterating, `map`, `at(i)`) tells the host that
 * the kv, outbox and log calls that follow belong to message `i`: its kv writes and events
 * commit only if its own verdict is ack; its kv reads see the committed store and its own
 * writes only. Isolation is per batch, not per message: module state set while handling one
 * message is seen by the next ones.
 * @module
 */

import * as host from '#host';
import { batchItem } from '#host-batch';
import { checkVerdict, fromWit, reportTrapOf, toWit } from './handler.js';
import { Verdict } from './verdict.js';

/** The property of `handleBatch` holding the author's function (used by `testing.runBatch`). */
export const BATCH_HANDLER = Symbol.for('carteiro.batchHandler');

/** The messages of one batch, in delivery order. */
export class Batch {
  #messages;
  #attribute;

  constructor(messages, { attribute = true } = {}) {
    this.#messages = [...messages];
    this.#attribute = attribute;
  }

  /** How many messages. */
  get length() { return this.#messages.length; }

  /** Message `index`; host calls from now on belong to it. */
  at(index) {
    const i = index < 0 ? index + this.#messages.length : index;
    const message = this.#messages[i];
    if (message !== undefined && this.#attribute) batchItem(i);
    return message;
  }

  * [Symbol.iterator]() {
    for (let i = 0; i < this.#messages.length; i += 1) yield this.at(i);
  }

  /** `fn(message, index)` for each message in order, its host calls attributed to it. */
  map(fn) {
    const out = [];
    for (let i = 0; i < this.#messages.length; i += 1) out.push(fn(this.at(i), i));
    return out;
  }
}

/** `verdicts` if it is an array of Verdicts; a TypeError naming `fn` otherwise. */
export function checkVerdicts(fn, verdicts) {
  if (!Array.isArray(verdicts)) {
    throw new TypeError(`batch handler ${fn.name || '(anonymous)'} returned ${String(verdicts)}; it must return an array of Verdicts, one per message`);
  }
  return verdicts.map((v) => checkVerdict(fn, v));
}

function wrongLength(got, want) {
  return Verdict.retry(`the batch handler returned ${got} verdicts for ${want} messages`);
}

/**
 * Marks `fn(batch: Batch) => Verdict[]` as the component's batch handler. Export both
 * results: `handleBatch` (world batch-handler) and `handle` (a batch of one, for routes
 * without `batch`). A thrown exception is a trap that fails the whole batch.
 */
export function batchHandler(fn) {
  if (typeof fn !== 'function') throw new TypeError(`batchHandler() needs a function, not ${typeof fn}`);
  if (fn.constructor && fn.constructor.name === 'AsyncFunction') {
    throw new TypeError('a batch handler is synchronous: (batch) => Verdict[]');
  }
  host.installConsole();
  function run(raws, attribute) {
    const verdicts = checkVerdicts(fn, fn(new Batch(raws.map(fromWit), { attribute })));
    if (verdicts.length !== raws.length) return raws.map(() => toWit(wrongLength(verdicts.length, raws.length)));
    return verdicts.map(toWit);
  }
  function carteiroHandleBatch(raws) {
    try {
      return run(raws, true);
    } catch (e) {
      reportTrapOf(e);
      throw e;
    }
  }
  function carteiroHandle(raw) {
    try {
      return run([raw], false)[0];
    } catch (e) {
      reportTrapOf(e);
      throw e;
    }
  }
  carteiroHandleBatch[BATCH_HANDLER] = fn;
  return { handle: carteiroHandle, handleBatch: carteiroHandleBatch };
}
