/**
 * The real host: the component's imports (`#host` resolves here when the build bundles with
 * the `carteiro-wasm` condition). The WIT bindings never leave this module: WIT errors become
 * the SDK's typed errors here.
 * @module
 */

import * as wit from 'carteiro:handler/kv@0.1.0';
import { emit } from 'carteiro:handler/outbox@0.1.0';
import { log as witLog } from 'carteiro:handler/log@0.1.0';
import * as witConfig from 'carteiro:handler/config@0.1.0';
import {
  InvalidEvent, InvalidKey, KvError, OutboxError, PayloadTooLarge, StoreUnavailable,
  TooManyEvents, ValueTooLarge,
} from '../errors.js';

export const LEVELS = ['trace', 'debug', 'info', 'warn', 'error'];

// A failed import call throws an error whose `payload` is the WIT error variant; `classes`
// maps a family's tags to the SDK's errors, anything else becomes a `Fallback`.
function typedError(e, classes, Fallback, family) {
  const p = e && e.payload;
  if (!p) return e;
  const Class = classes.get(p.tag);
  if (Class) return new Class(p.val);
  return new Fallback(`${family}: unexpected error ${JSON.stringify(p)}`);
}

const KV_ERRORS = new Map([
  ['invalid-key', InvalidKey],
  ['value-too-large', ValueTooLarge],
  ['unavailable', StoreUnavailable],
]);
const OUTBOX_ERRORS = new Map([
  ['invalid-event', InvalidEvent],
  ['too-many-events', TooManyEvents],
  ['payload-too-large', PayloadTooLarge],
]);

const kvError = (e) => typedError(e, KV_ERRORS, KvError, 'kv');
const outboxError = (e) => typedError(e, OUTBOX_ERRORS, OutboxError, 'outbox');

export function kvGet(key) {
  try { return wit.get(key); } catch (e) { throw kvError(e); }
}

export function kvSet(key, value) {
  try { wit.set(key, value); } catch (e) { throw kvError(e); }
}

export function kvDelete(key) {
  try { wit.delete(key); } catch (e) { throw kvError(e); }
}

export function outboxEmit(exchange, routingKey, headers, contentType, payload) {
  try {
    return emit({ exchange, routingKey, headers: headers.map(({ name, value }) => ({ name, value })), contentType, payload });
  } catch (e) {
    throw outboxError(e);
  }
}

export function log(level, message) {
  witLog(LEVELS[level], message);
}

export function configGet(name) {
  return witConfig.get(name);
}

export function configAll() {
  return witConfig.all();
}

// Kept before `installConsole` replaces it: the trap report must reach stderr.
const stderr = console.error.bind(console);

function show(value) {
  if (typeof value === 'string') return value;
  if (value instanceof Error) return value.stack ? `${value.name}: ${value.message}\n${value.stack}` : String(value);
  try {
    const text = JSON.stringify(value, (_, v) => (typeof v === 'bigint' ? `${v}n` : v));
    return text === undefined ? String(value) : text;
  } catch {
    return String(value);
  }
}

/** Sends `console.*` to the host's log import with matching levels. */
export function installConsole() {
  const forward = (level) => (...args) => witLog(LEVELS[level], args.map(show).join(' '));
  console.trace = forward(0);
  console.debug = forward(1);
  console.log = forward(2);
  console.info = forward(2);
  console.warn = forward(3);
  console.error = forward(4);
}

/** Writes the trap summary to stderr, where the gateway reads the failure reason from. */
export function reportTrap(text) {
  stderr(text);
}
