/**
 * The plugin's variables from the operator's TOML (`[plugins.NAME.variables]`) — the only
 * configuration a handler sees (no environment, filesystem, network or arguments).
 * @module
 */

import * as host from '#host';

/** The variable called `name`, or `fallback` (default `undefined`) when it is not set. */
export function get(name, fallback = undefined) {
  const value = host.configGet(String(name));
  return value === undefined || value === null ? fallback : value;
}

/** Every variable, as an object sorted by name. */
export function all() {
  const pairs = [...host.configAll()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return Object.fromEntries(pairs);
}
