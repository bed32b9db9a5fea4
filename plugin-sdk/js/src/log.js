/**
 * Logging into the gateway's tracing, tagged with the plugin's name. In the component
 * `console.*` is forwarded here too (`console.log` at info, `console.warn` at warn, ...).
 * Each line is one host call: do not log in a tight loop.
 * @module
 */

import * as host from '#host';

const LEVELS = { trace: 0, debug: 1, info: 2, warn: 3, error: 4 };

/** Logs `message` at `level` (`'trace' | 'debug' | 'info' | 'warn' | 'error'`). */
export function log(level, message) {
  const n = LEVELS[level];
  if (n === undefined) throw new RangeError(`unknown log level ${JSON.stringify(level)}`);
  host.log(n, String(message));
}

/** Logs at trace level. */
export const trace = (message) => log('trace', message);
/** Logs at debug level. */
export const debug = (message) => log('debug', message);
/** Logs at info level. */
export const info = (message) => log('info', message);
/** Logs at warn level. */
export const warn = (message) => log('warn', message);
/** Logs at error level. */
export const error = (message) => log('error', message);
