/**
 * UTF-8 and JSON decoding whose errors use the Rust SDK's (serde_json's) words, the same in
 * Node (V8) and in the component (SpiderMonkey): dead-letter reasons then read alike in
 * every language. The scanner runs only after `JSON.parse` failed.
 * @module
 */

import { BodyError } from './errors.js';

// Validates natively: scanning the bytes in JS ran in StarlingMonkey's interpreter, a loop
// turn per byte of every body. Only an invalid body is scanned, to say where it breaks.
const strict = new TextDecoder('utf-8', { fatal: true });
// JSON.parse reads a number as ±Infinity only when it has an exponent or 309 digits or more;
// only a text that may hold one pays for the reviver, which JSON.parse calls for every value.
const MAY_OVERFLOW = /\d[eE]|\d{309}/;

/** Length of the longest valid UTF-8 prefix of `bytes` (its length when all valid). */
export function utf8ValidUpTo(bytes) {
  const n = bytes.length;
  let i = 0;
  while (i < n) {
    const b = bytes[i];
    if (b < 0x80) { i += 1; continue; }
    let need;
    let min;
    if (b >= 0xc2 && b <= 0xdf) {
      need = 1; min = 0x80;
    } else if (b >= 0xe0 && b <= 0xef) {
      need = 2; min = 0x800;
    } else if (b >= 0xf0 && b <= 0xf4) {
      need = 3; min = 0x10000;
    } else {
      return i;
    }
    if (i + need > n - 1) return i;
    let cp = b & (0x3f >> need);
    for (let k = 1; k <= need; k += 1) {
      const c = bytes[i + k];
      if ((c & 0xc0) !== 0x80) return i;
      cp = (cp << 6) | (c & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += need + 1;
  }
  return n;
}

/** `bytes` as text, or a {@link BodyError} naming the first invalid byte. */
export function decodeUtf8(bytes) {
  try {
    return strict.decode(bytes);
  } catch {
    throw new BodyError(`body is not UTF-8 (invalid byte at offset ${utf8ValidUpTo(bytes)})`);
  }
}

/** Decodes UTF-8 JSON or throws a {@link BodyError}. */
export function parseJson(bytes) {
  const text = decodeUtf8(bytes);
  try {
    return MAY_OVERFLOW.test(text) ? JSON.parse(text, rejectInfinite) : JSON.parse(text);
  } catch (e) {
    if (e instanceof OutOfRange) throw new BodyError('number out of range');
    const found = describe(text);
    if (found === undefined) throw new BodyError(String(e && e.message));
    const { line, column } = position(text, found.at);
    throw new BodyError(found.description, { line, column });
  }
}

class OutOfRange extends Error {}

// JSON.parse reads 1e400 as Infinity; serde_json (and so the Rust SDK) refuses it.
function rejectInfinite(key, value) {
  if (value === Infinity || value === -Infinity) throw new OutOfRange();
  return value;
}

function position(text, at) {
  let line = 1; let start = 0;
  for (let i = 0; i < at && i < text.length; i += 1) {
    if (text[i] === '\n') { line += 1; start = i + 1; }
  }
  return { line, column: at - start + 1 };
}

class Found {
  constructor(description, at) { this.description = description; this.at = at; }
}

const MAX_DEPTH = 128; // serde_json's recursion limit

/** The first syntax error in `text`, as serde_json words it, or `undefined`. */
export function describe(text) {
  const n = text.length;
  let i = 0;
  let depth = 0;
  const fail = (description) => { throw new Found(description, i); };
  const ws = () => { while (i < n && ' \t\n\r'.includes(text[i])) i += 1; };
  const digits = () => { const s = i; while (i < n && text[i] >= '0' && text[i] <= '9') i += 1; return i - s; };

  function ident(word) {
    for (const ch of word) {
      if (i >= n) fail('EOF while parsing a value');
      if (text[i] !== ch) fail('expected ident');
      i += 1;
    }
  }

  function string() {
    i += 1;
    for (;;) {
      if (i >= n) fail('EOF while parsing a string');
      const c = text[i];
      if (c === '"') { i += 1; return; }
      if (c === '\\') {
        i += 1;
        if (i >= n) fail('EOF while parsing a string');
        if (text[i] === 'u') {
          for (let k = 0; k < 4; k += 1) {
            i += 1;
            if (i >= n) fail('EOF while parsing a string');
            if (!/[0-9a-fA-F]/.test(text[i])) fail('invalid escape');
          }
        } else if (!'"\\/bfnrt'.includes(text[i])) fail('invalid escape');
        i += 1;
      } else if (c.charCodeAt(0) < 0x20) {
        fail('control character (\\u0000-\\u001F) found while parsing a string');
      } else i += 1;
    }
  }

  function number() {
    if (text[i] === '-') {
      i += 1;
      if (i >= n) fail('EOF while parsing a value');
    }
    if (text[i] === '0') {
      i += 1;
      if (i < n && text[i] >= '0' && text[i] <= '9') fail('invalid number');
    } else if (digits() === 0) fail('invalid number');
    if (text[i] === '.') {
      i += 1;
      if (i >= n) fail('EOF while parsing a value');
      if (digits() === 0) fail('invalid number');
    }
    if (text[i] === 'e' || text[i] === 'E') {
      i += 1;
      if (text[i] === '+' || text[i] === '-') i += 1;
      if (i >= n) fail('EOF while parsing a value');
      if (digits() === 0) fail('invalid number');
    }
  }

  function nest(open) {
    depth += 1;
    if (depth > MAX_DEPTH) fail('recursion limit exceeded');
    const close = open === '[' ? ']' : '}';
    const eof = open === '[' ? 'EOF while parsing a list' : 'EOF while parsing an object';
    i += 1;
    ws();
    if (i >= n) fail(eof);
    if (text[i] === close) { i += 1; depth -= 1; return; }
    for (;;) {
      if (open === '{') {
        if (text[i] !== '"') fail('key must be a string');
        string();
        ws();
        if (i >= n) fail(eof);
        if (text[i] !== ':') fail('expected `:`');
        i += 1;
      }
      value();
      ws();
      if (i >= n) fail(eof);
      if (text[i] === close) { i += 1; depth -= 1; return; }
      if (text[i] !== ',') fail(`expected \`,\` or \`${close}\``);
      i += 1;
      ws();
      if (i >= n) fail(open === '[' ? 'EOF while parsing a value' : eof);
      if (text[i] === close) fail('trailing comma');
    }
  }

  function value() {
    ws();
    if (i >= n) fail('EOF while parsing a value');
    const c = text[i];
    if (c === '[' || c === '{') nest(c);
    else if (c === '"') string();
    else if (c === '-' || (c >= '0' && c <= '9')) number();
    else if (c === 't') ident('true');
    else if (c === 'f') ident('false');
    else if (c === 'n') ident('null');
    else fail('expected value');
  }

  try {
    value();
    ws();
    if (i < n) fail('trailing characters');
  } catch (e) {
    if (e instanceof Found) return e;
    throw e;
  }
  return undefined;
}
