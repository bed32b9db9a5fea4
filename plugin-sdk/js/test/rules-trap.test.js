import assert from 'node:assert/strict';
import { test } from 'node:test';

import { rules } from 'carteiro-sdk';
import { frames, trapSummary } from '../src/handler.js';

test('kv key rules', () => {
  assert.equal(rules.kvKeyProblem('a', 4), undefined);
  assert.equal(rules.kvKeyProblem('abcd', 4), undefined);
  assert.match(rules.kvKeyProblem('', 4), /empty/);
  assert.match(rules.kvKeyProblem('abcde', 4), /5 bytes; at most 4/);
  assert.match(rules.kvKeyProblem('a\0b', 4), /NUL/);
  assert.equal(rules.kvKeyProblem('matricula/42'), undefined);
});

test('event rules', () => {
  const long = 'x'.repeat(rules.MAX_SHORT_STRING + 1);
  assert.equal(rules.eventProblem('ex', 'rk', [{ name: 'h', value: 'v' }]), undefined);
  assert.equal(rules.eventProblem('', '', []), undefined);
  assert.match(rules.eventProblem(long, 'rk'), /^exchange is 256 bytes/);
  assert.match(rules.eventProblem('ex', 'r\0k'), /^routing key/);
  assert.match(rules.eventProblem('ex', 'rk', [{ name: '', value: 'v' }]), /1-255/);
  assert.match(rules.eventProblem('ex', 'rk', [{ name: 'h', value: 'v\0' }]), /`h`/);
});

test('trap summary: where, then what, in the two lines the gateway reads', () => {
  function inner() { throw new TypeError('boom\nsecond line'); }
  function outer() { inner(); }
  let summary;
  try { outer(); } catch (e) { summary = trapSummary(e); }
  const [where, what] = summary.split('\n');
  assert.match(where, /^js handler panicked at inner \(.*rules-trap\.test\.js:\d+:\d+\) < outer \(/);
  assert.ok(where.endsWith(':'));
  assert.equal(what, 'TypeError: boom second line');
  assert.equal(trapSummary('just a string'), 'js handler panicked at <unknown>:\nuncaught string: just a string');
});

test('SpiderMonkey stacks are read too, without the glue and constructor frames', () => {
  const error = { name: 'FixtureError', stack: 'FixtureError@b.js:1:1\nfail@b.js:2:8\nhandle<@b.js:3:30\ncarteiroHandle@b.js:4:1\nexport_handle@/tmp/x/sources/initializer.js:700:15\n' };
  assert.deepEqual(frames(error), ['fail (b.js:2:8)', 'handle (b.js:3:30)']);
});
