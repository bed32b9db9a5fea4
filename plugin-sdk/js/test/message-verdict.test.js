import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BodyError, Message, Verdict } from 'carteiro-sdk';

const bytes = (s) => new TextEncoder().encode(s);

test('message defaults and builders', () => {
  const msg = Message.fromJson('order.created', { id: 1, name: 'é' }, { id: 'm-1', headers: { 'x-t': 'a' } });
  assert.equal(msg.routingKey, 'order.created');
  assert.deepEqual(msg.body, bytes('{"id":1,"name":"é"}'));
  assert.equal(msg.contentType, 'application/json');
  assert.deepEqual([msg.id, msg.exchange, msg.attempt, msg.redelivered], ['m-1', '', 1, false]);
  assert.deepEqual(msg.headers, [{ name: 'x-t', value: 'a' }]);
  assert.deepEqual(Message.fromText('k', 'hi').body, bytes('hi'));
  assert.equal(new Message().id, undefined);
  assert.ok(Object.isFrozen(msg));
});

test('header is the first exact match', () => {
  const msg = new Message({ headers: [['x-tenant', 'acme'], ['x-tenant', 'other']] });
  assert.equal(msg.header('x-tenant'), 'acme');
  assert.equal(msg.header('X-Tenant'), undefined);
});

test('text rejects non-UTF-8 naming the offset', () => {
  assert.equal(new Message({ body: 'hello' }).text(), 'hello');
  for (const [body, offset] of [[[0x61, 0xff], 1], [[0x61, 0xe2, 0x82], 1], [[0xc0, 0x80], 0], [[0xed, 0xa0, 0x80], 0]]) {
    assert.throws(() => new Message({ body: Uint8Array.from(body) }).text(), (e) => e instanceof BodyError
      && e.message === `body is not UTF-8 (invalid byte at offset ${offset})`);
  }
  assert.equal(new Message({ body: Uint8Array.from([0xf0, 0x9f, 0x98, 0x80]) }).text(), '😀');
});

const jsonErrors = [
  ['{oops', 'key must be a string'],
  ['{', 'EOF while parsing an object'],
  ['', 'EOF while parsing a value'],
  ['[1 2]', 'expected `,` or `]`'],
  ['{"a":1 "b":2}', 'expected `,` or `}`'],
  ['{"a" 1}', 'expected `:`'],
  ['{"a":1,}', 'trailing comma'],
  ['[1,]', 'trailing comma'],
  ['1 2', 'trailing characters'],
  ['"abc', 'EOF while parsing a string'],
  ['NaN', 'expected value'],
  ['hello', 'expected value'],
  ['[1E400]', 'number out of range'],
  ['trux', 'expected ident'],
  ['01', 'invalid number'],
  ['"a\\x"', 'invalid escape'],
  ['"a\u0001"', 'control character (\\u0000-\\u001F) found while parsing a string'],
  ['['.repeat(200), 'recursion limit exceeded'],
];
for (const [body, description] of jsonErrors) {
  test(`JSON error in the Rust SDK's words: ${description}`, () => {
    assert.throws(() => new Message({ body }).json(), (e) => {
      assert.ok(e instanceof BodyError);
      assert.equal(e.description, description);
      assert.ok(e.isSyntax);
      assert.deepEqual(e.toVerdict(), Verdict.deadLetter(`invalid body: ${e.message}`));
      return true;
    });
  });
}

test('JSON error has a position', () => {
  assert.throws(() => new Message({ body: '{\n  "a": }' }).json(), (e) => e.line === 2 && e.column === 8
    && e.message === 'expected value at line 2 column 8');
});

test('valid JSON decodes', () => {
  assert.deepEqual(new Message({ body: '{"a":[1,2.5,"x",null,true]}' }).json(), { a: [1, 2.5, 'x', null, true] });
});

test('verdicts', () => {
  assert.ok(Verdict.ack().isAck);
  assert.equal(Verdict.ack().reason, undefined);
  assert.deepEqual(Verdict.deadLetter('bad'), Verdict.deadLetter('bad'));
  assert.notDeepEqual(Verdict.deadLetter('bad'), Verdict.retry('bad'));
  assert.equal(Verdict.retry('later').delayMs, undefined);
  assert.equal(Verdict.retry('later', { delayMs: 1500 }).delayMs, 1500);
  assert.equal(Verdict.retry('later', { delayMs: 0.2 }).delayMs, 1);
  assert.equal(String(Verdict.retry('x', { delayMs: 2 })), 'Verdict.retry("x", { delayMs: 2 })');
  assert.throws(() => Verdict.retry('x', { delayMs: -1 }), RangeError);
  assert.throws(() => Verdict.retry('x', { delayMs: Infinity }), RangeError);
});
