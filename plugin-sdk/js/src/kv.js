/**
 * Key-value state, namespaced per plugin, read and written inside the message's
 * transaction. Writes become visible to other messages only if this message acks; a retry
 * or dead-letter discards them. The host may re-run the handler when a concurrent message
 * wrote a key this one read, so a handler must be deterministic given its message, kv reads
 * and config. Every function throws a `KvError` (`InvalidKey`, `ValueTooLarge`,
 * `StoreUnavailable`, or the SDK-side `InvalidValue`).
 * @module
 */

import * as host from '#host';
import { InvalidValue } from './errors.js';
import { toBytes } from './message.js';
import { utf8ValidUpTo } from './json.js';

const decoder = new TextDecoder();
const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;

/** The value stored under `key` (a Uint8Array), or `undefined`. */
export function get(key) {
  return host.kvGet(String(key)) ?? undefined;
}

/** Stores `value` (bytes, or a string as UTF-8) under `key`; committed if the message acks. */
export function set(key, value) {
  host.kvSet(String(key), toBytes(value));
}

/** Deletes `key`; deleting a missing key is not an error. */
function kvDelete(key) {
  host.kvDelete(String(key));
}
export { kvDelete as delete };

/** True when `key` holds a value. */
export function contains(key) {
  return get(key) !== undefined;
}

/** The value under `key` decoded as UTF-8 text, or `undefined`. */
export function getText(key) {
  const raw = get(key);
  if (raw === undefined) return undefined;
  if (utf8ValidUpTo(raw) !== raw.length) throw new InvalidValue(`value of \`${key}\` is not UTF-8`);
  return decoder.decode(raw);
}

/** The value under `key` decoded from JSON, or `undefined` when missing. */
export function getJson(key) {
  const text = getText(key);
  if (text === undefined) return undefined;
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new InvalidValue(`value of \`${key}\` is not the expected JSON: ${e.message}`);
  }
}

/** Stores `value` under `key` as JSON (compact, as the Rust SDK writes it). */
export function setJson(key, value) {
  const text = JSON.stringify(value);
  if (text === undefined) throw new TypeError(`cannot encode the value of \`${key}\` as JSON`);
  set(key, text);
}

function readCounter(key) {
  const raw = get(key);
  if (raw === undefined) return 0n;
  const text = utf8ValidUpTo(raw) === raw.length ? decoder.decode(raw).trim() : '';
  if (!/^[+-]?[0-9]+$/.test(text)) throw new InvalidValue(`value of \`${key}\` is not an integer`);
  return BigInt(text);
}

function addChecked(key, current, by) {
  const next = current + by;
  if (next < I64_MIN || next > I64_MAX) throw new InvalidValue(`counter \`${key}\` overflows i64`);
  return next;
}

/**
 * Adds `by` to the signed 64-bit integer under `key` (missing counts as 0) and returns the
 * new value as a BigInt. Stored as decimal text (`"42"`) like the Rust SDK's counters.
 */
export function incrBig(key, by = 1n) {
  const next = addChecked(key, readCounter(key), BigInt(by));
  set(key, next.toString());
  return next;
}

/**
 * {@link incrBig} for counters that stay within JavaScript's safe integers (±2^53 - 1),
 * returning a number; beyond that it throws `InvalidValue` (use `incrBig`).
 */
export function incr(key, by = 1) {
  if (!Number.isSafeInteger(by)) throw new RangeError(`incr needs a safe integer step, not ${by}`);
  const next = addChecked(key, readCounter(key), BigInt(by));
  if (next > BigInt(Number.MAX_SAFE_INTEGER) || next < BigInt(Number.MIN_SAFE_INTEGER)) {
    throw new InvalidValue(`counter \`${key}\` is beyond JavaScript's safe integers; use kv.incrBig`);
  }
  set(key, next.toString());
  return Number(next);
}
