/** `handler(fn)`: wraps `fn(msg) => Verdict` as the component's `handle` export. @module */

import * as host from '#host';
import { Message } from './message.js';
import { Verdict } from './verdict.js';

/** Property of the wrapper holding the author's function (used by `testing.run`). */
export const HANDLER = Symbol.for('carteiro.handler');

const FRAMES = 3;
const SUMMARY_MAX = 600;
// Frames of the export glue itself, left out of the trap summary.
const GLUE = new Set(['carteiroHandle', 'export_handle', 'carteiroHandleBatch', 'export_handleBatch']);

function nameOf(fn) {
  return fn.name ? `\`${fn.name}\`` : '(anonymous)';
}

/** `verdict` if it is a Verdict; a TypeError naming the handler otherwise. */
export function checkVerdict(fn, verdict) {
  if (verdict instanceof Verdict) return verdict;
  if (verdict && typeof verdict.then === 'function') {
    throw new TypeError(`handler ${nameOf(fn)} returned a Promise; a handler is synchronous: (msg) => Verdict`);
  }
  throw new TypeError(
    `handler ${nameOf(fn)} returned ${String(verdict)}; it must return a Verdict `
    + '(Verdict.ack(), Verdict.retry(reason), Verdict.deadLetter(reason))',
  );
}

/** The SDK message of a WIT message. */
export function fromWit(raw) {
  return new Message({
    id: raw.id,
    exchange: raw.exchange,
    routingKey: raw.routingKey,
    headers: raw.headers,
    contentType: raw.contentType,
    body: raw.body,
    attempt: raw.attempt,
    redelivered: raw.redelivered,
  });
}

/** The WIT verdict of an SDK verdict. */
export function toWit(verdict) {
  if (verdict.kind === 'ack') return { tag: 'ack' };
  if (verdict.kind === 'retry') {
    const delayMs = verdict.delayMs === undefined ? undefined : BigInt(verdict.delayMs);
    return { tag: 'retry', val: { delayMs, reason: verdict.reason } };
  }
  return { tag: 'dead-letter', val: verdict.reason };
}

/** The innermost stack frames of `error` as `name (file:line:col)`, SpiderMonkey or V8 format. */
export function frames(error) {
  const stack = error && typeof error.stack === 'string' ? error.stack : '';
  const found = [];
  for (const line of stack.split('\n')) {
    const sm = /^\s*(.*?)@(.+):(\d+):(\d+)\s*$/.exec(line);
    const v8 = /^\s*at (?:(.+?) \()?(.+?):(\d+):(\d+)\)?\s*$/.exec(line);
    const m = sm || v8;
    if (!m) continue;
    // SpiderMonkey names closures after their parents: `handle<`, `outer/inner<`.
    const name = (m[1] || '').replace(/[</]+$/, '') || '<anonymous>';
    if (GLUE.has(name) || m[2].endsWith('initializer.js')) continue;
    // The error's own constructor (a subclass of Error) is where it was made, not thrown.
    if (found.length === 0 && error && name === error.name) continue;
    found.push(`${name} (${m[2].replace(/^file:\/\//, '')}:${m[3]}:${m[4]})`);
  }
  return found.slice(0, FRAMES);
}

/**
 * The two lines printed before a trap: where, then what. The gateway reads a failure's
 * reason from a line containing "panicked" and the line after it.
 */
export function trapSummary(error) {
  const where = frames(error).join(' < ') || '<unknown>';
  let what = error instanceof Error
    ? `${error.name}: ${error.message}`
    : `uncaught ${typeof error}: ${String(error)}`;
  what = what.split(/\s+/).join(' ');
  if (what.length > SUMMARY_MAX) what = `${what.slice(0, SUMMARY_MAX - 1)}…`;
  return `js handler panicked at ${where}:\n${what}`;
}

/** Prints the trap report of `error` (the component traps next). */
export function reportTrapOf(error) {
  host.reportTrap(trapSummary(error));
}

/**
 * Marks `fn(msg: Message) => Verdict` as the component's handler. Export the result as
 * `handle`: `export const handle = handler((msg) => Verdict.ack());`
 *
 * In the component a thrown exception becomes a trap (a plugin failure of that delivery)
 * whose reason names the error and its innermost frames. Natively, calling the result
 * with a `Message` returns the `Verdict` (or throws), so tests can call it directly.
 */
export function handler(fn) {
  if (typeof fn !== 'function') throw new TypeError(`handler() needs a function, not ${typeof fn}`);
  if (fn.constructor && fn.constructor.name === 'AsyncFunction') {
    throw new TypeError(`handler ${nameOf(fn)} is async; a handler is synchronous: (msg) => Verdict`);
  }
  if (fn.length > 1) {
    throw new TypeError(`handler ${nameOf(fn)} takes ${fn.length} arguments; it takes one, the message`);
  }
  host.installConsole();
  function carteiroHandle(raw) {
    if (raw instanceof Message) return checkVerdict(fn, fn(raw));
    try {
      return toWit(checkVerdict(fn, fn(fromWit(raw))));
    } catch (e) {
      host.reportTrap(trapSummary(e));
      throw e;
    }
  }
  carteiroHandle[HANDLER] = fn;
  return carteiroHandle;
}
