/**
 * The limits and checks the Carteiro host applies to every kv key and outbox event: a port
 * of the Rust SDK's `carteiro_sdk::rules` (the module the gateway itself uses), so the mock
 * host refuses exactly what production refuses, with the same words. Lengths are UTF-8 bytes.
 * @module
 */

/** Longest kv key, in bytes. */
export const MAX_KV_KEY_BYTES = 1024;
/** Largest kv value, in bytes. */
export const MAX_KV_VALUE_BYTES = 4 << 20;
/** Largest outbox event payload, in bytes. */
export const MAX_EVENT_PAYLOAD_BYTES = 8 << 20;
/** AMQP short strings (exchange, routing key, header names) hold at most 255 bytes. */
export const MAX_SHORT_STRING = 255;

const encoder = new TextEncoder();
const utf8Length = (text) => encoder.encode(text).length;

/** Why `key` cannot be a kv key when keys may be `maxLen` bytes long, or `undefined`. */
export function kvKeyProblem(key, maxLen = MAX_KV_KEY_BYTES) {
  if (key === '') return 'kv keys must not be empty';
  const length = utf8Length(key);
  if (length > maxLen) return `kv key is ${length} bytes; at most ${maxLen}`;
  if (key.includes('\0')) return 'kv keys must not contain NUL';
  return undefined;
}

/**
 * Why an event with this exchange, routing key and headers ({name, value}) cannot be
 * published, or `undefined`. The payload's size is checked on its own.
 */
export function eventProblem(exchange, routingKey, headers = []) {
  for (const [what, text] of [['exchange', exchange], ['routing key', routingKey]]) {
    const length = utf8Length(text);
    if (length > MAX_SHORT_STRING) return `${what} is ${length} bytes; AMQP allows ${MAX_SHORT_STRING}`;
    if (text.includes('\0')) return `${what} must not contain NUL`;
  }
  for (const { name, value } of headers) {
    if (name === '' || utf8Length(name) > MAX_SHORT_STRING) {
      return `header names must be 1-${MAX_SHORT_STRING} bytes`;
    }
    if (name.includes('\0') || value.includes('\0')) {
      return `header \`${name.replaceAll('\0', '\\0')}\` must not contain NUL`;
    }
  }
  return undefined;
}
