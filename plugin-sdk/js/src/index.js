/**
 * Carteiro handler SDK for JavaScript and TypeScript.
 *
 * ```js
 * import { handler, kv, outbox, Verdict, CarteiroError } from 'carteiro-sdk';
 *
 * export const handle = handler((msg) => {
 *   try {
 *     const order = msg.json();
 *     kv.incr('orders');
 *     outbox.emitJson('carteiro.events', 'order.seen', order);
 *     return Verdict.ack();
 *   } catch (e) {
 *     if (e instanceof CarteiroError) return e.toVerdict(); // store down => retry
 *     throw e; // a bug: the delivery fails (a trap) and the gateway retries it
 *   }
 * });
 * ```
 *
 * Layout: `message.js` (Message, headers), `json.js` (body decoding with the Rust SDK's
 * error words), `verdict.js`, `errors.js` (typed errors with `toVerdict()`), `kv.js`,
 * `outbox.js`, `config.js`, `log.js`, `rules.js` (the gateway's key and event checks),
 * `handler.js` (the export glue and the trap report), `host/` (the backend: `wasm.js` — the
 * only user of the WIT imports — in the component, `mock.js` in Node), `testing.js`.
 * @module
 */

export { Message } from './message.js';
export { Verdict } from './verdict.js';
export {
  BodyError, CarteiroError, InvalidEvent, InvalidKey, InvalidValue, KvError, OutboxError,
  PayloadTooLarge, StoreUnavailable, TooManyEvents, ValueTooLarge,
} from './errors.js';
export { handler } from './handler.js';
export * as kv from './kv.js';
export * as outbox from './outbox.js';
export * as config from './config.js';
export * as log from './log.js';
export * as rules from './rules.js';
