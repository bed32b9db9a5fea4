import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  CarteiroError, InvalidEvent, InvalidKey, InvalidValue, KvError, Message, PayloadTooLarge,
  StoreUnavailable, TooManyEvents, ValueTooLarge, Verdict, config, handler, kv, log, outbox,
} from 'carteiro-sdk';
import { HostCallLimitExceeded, MockHost, run } from 'carteiro-sdk/testing';

const text = (b) => new TextDecoder().decode(b);

test('kv round trips', () => {
  const host = new MockHost();
  assert.equal(kv.get('k'), undefined);
  kv.set('k', 'välue');
  assert.equal(text(kv.get('k')), 'välue');
  assert.equal(kv.getText('k'), 'välue');
  assert.ok(kv.contains('k'));
  kv.setJson('doc', { a: [1, 2], b: 'ç' });
  assert.equal(host.kvText('doc'), '{"a":[1,2],"b":"ç"}');
  assert.deepEqual(kv.getJson('doc'), { a: [1, 2], b: 'ç' });
  assert.equal(kv.getJson('missing'), undefined);
  kv.delete('k');
  kv.delete('never-there');
  assert.ok(!kv.contains('k'));
  kv.set('bin', Uint8Array.from([0, 255]));
  assert.deepEqual(kv.get('bin'), Uint8Array.from([0, 255]));
});

test('incr stores decimal text', () => {
  const host = new MockHost();
  assert.equal(kv.incr('n'), 1);
  assert.equal(kv.incr('n', 41), 42);
  assert.equal(host.kvText('n'), '42');
  host.kvInsert('m', ' -7 ');
  assert.equal(kv.incr('m', 2), -5);
  for (const bad of ['x', '1_000', '1.5', '']) {
    host.kvInsert('bad', bad);
    assert.throws(() => kv.incr('bad'), (e) => e instanceof InvalidValue && /is not an integer/.test(e.message));
  }
  host.kvInsert('big', String(2n ** 63n - 1n));
  assert.throws(() => kv.incrBig('big'), /overflows i64/);
  host.kvInsert('big', String(2n ** 60n));
  assert.equal(kv.incrBig('big', 2n), 2n ** 60n + 2n);
  assert.throws(() => kv.incr('big'), /beyond JavaScript's safe integers/);
});

test('kv codec errors', () => {
  const host = new MockHost();
  host.kvInsert('bin', Uint8Array.from([0xff]));
  assert.throws(() => kv.getText('bin'), /not UTF-8/);
  host.kvInsert('nj', 'not json');
  assert.throws(() => kv.getJson('nj'), (e) => e instanceof InvalidValue && /not the expected JSON/.test(e.message));
  assert.throws(() => kv.setJson('k', undefined), TypeError);
});

test('invalid keys and limits', () => {
  const host = new MockHost();
  assert.throws(() => kv.set('', 'v'), (e) => e instanceof InvalidKey && e instanceof KvError
    && e.message === 'kv: invalid key: kv keys must not be empty');
  assert.throws(() => kv.get('a\0b'), /NUL/);
  assert.throws(() => kv.get('k'.repeat(1025)), /1025 bytes; at most 1024/);
  assert.throws(() => kv.get('é'.repeat(513)), /1026 bytes/);
  host.limits = { maxValueLen: 3 };
  assert.throws(() => kv.set('k', 'long'), (e) => e instanceof ValueTooLarge && e.limit === 3
    && e.toVerdict().reason === 'kv: value larger than the 3-byte limit' && e.toVerdict().isDeadLetter);
});

test('an unavailable store fails reads only', () => {
  const host = new MockHost();
  host.setKvUnavailable('db down');
  kv.set('k', 'v');
  assert.throws(() => kv.get('k'), (e) => {
    assert.ok(e instanceof StoreUnavailable && e.transient);
    assert.deepEqual(e.toVerdict(), Verdict.retry('kv unavailable: db down'));
    return true;
  });
  host.setKvUnavailable(undefined);
  assert.equal(kv.getText('k'), 'v');
});

test('outbox events and rules', () => {
  const host = new MockHost();
  const id = outbox.emitJson('ex', 'rk', { n: 1 }, { headers: { 'x-a': '1' } });
  assert.match(id, /^00000000-0000-7000-8000-/);
  outbox.emit('ex', 'raw', Uint8Array.from([0, 1]), { contentType: 'application/octet-stream' });
  const [first, second] = host.events();
  assert.deepEqual([first.exchange, first.routingKey, first.contentType], ['ex', 'rk', 'application/json']);
  assert.equal(first.text(), '{"n":1}');
  assert.equal(first.header('x-a'), '1');
  assert.deepEqual(second.payload, Uint8Array.from([0, 1]));
  assert.notEqual(second.id, first.id);
  assert.throws(() => outbox.emit('ex', 'bad\0key', ''), (e) => e instanceof InvalidEvent && /routing key must not contain NUL/.test(e.message));
  assert.throws(() => outbox.emit('x'.repeat(256), 'rk', ''), /exchange is 256 bytes; AMQP allows 255/);
  assert.throws(() => outbox.emit('ex', 'rk', '', { headers: [['', 'v']] }), /header names must be 1-255 bytes/);
  assert.throws(() => outbox.emit('ex', 'rk', '', { headers: [['h\0', 'v']] }), /header `h\\0` must not contain NUL/);
  assert.throws(() => outbox.emitJson('ex', 'rk', undefined), TypeError);
  host.limits = { maxPayloadLen: 2 };
  assert.throws(() => outbox.emit('ex', 'rk', 'abc'), (e) => e instanceof PayloadTooLarge
    && e.message === 'outbox: payload larger than the 2-byte limit');
});

test('too many events', () => {
  const host = new MockHost();
  host.limits = { maxEvents: 1 };
  const two = () => {
    outbox.emit('ex', 'a', '1');
    try {
      outbox.emit('ex', 'b', '2');
    } catch (e) {
      if (e instanceof TooManyEvents && e.limit === 1) return Verdict.deadLetter('limit');
      throw e;
    }
    return Verdict.ack();
  };
  assert.equal(host.run(two, new Message()).verdict.reason, 'limit');
});

test('config', () => {
  const host = new MockHost();
  host.setVar('b', '2');
  host.setVar('a', '1');
  assert.equal(config.get('a'), '1');
  assert.equal(config.get('zzz'), undefined);
  assert.equal(config.get('zzz', 'dflt'), 'dflt');
  assert.deepEqual(Object.entries(config.all()), [['a', '1'], ['b', '2']]);
  host.removeVar('a');
  assert.equal(config.get('a'), undefined);
});

const counting = handler((msg) => {
  const n = kv.incr('runs');
  outbox.emitJson(config.get('out_exchange', 'carteiro.events'), 'counted', { n });
  log.info(`counted ${n}`);
  if (msg.header('verdict') === 'retry') return Verdict.retry('asked to');
  if (msg.header('verdict') === 'dead') return Verdict.deadLetter('asked to');
  return Verdict.ack();
});

test('ack commits kv and events, and captures logs', () => {
  const host = new MockHost();
  host.setVar('out_exchange', 'ex');
  const out = host.run(counting, new Message({ routingKey: 'k', body: 'x' }));
  assert.ok(out.verdict.isAck);
  assert.deepEqual([...out.kvWrites], [['runs', new TextEncoder().encode('1')]]);
  assert.deepEqual(out.events.map((e) => [e.exchange, e.routingKey, e.json()]), [['ex', 'counted', { n: 1 }]]);
  assert.deepEqual(out.logs, [{ level: 'info', message: 'counted 1' }]);
  assert.equal(host.events().length, 1);
  assert.equal(host.kvText('runs'), '1');
  assert.deepEqual(out.eventsTo('counted'), out.events);
  assert.deepEqual(out.eventsTo('other'), []);
});

test('retry and dead-letter discard effects', () => {
  const host = new MockHost();
  host.run(counting, new Message());
  for (const verdict of ['retry', 'dead']) {
    const out = host.run(counting, new Message({ headers: { verdict } }));
    assert.ok(!out.verdict.isAck);
    assert.equal(out.events.length, 1, 'the run still reports what it tried');
    assert.equal(host.kvText('runs'), '1');
    assert.equal(host.events().length, 1);
  }
});

test('a thrown error propagates and discards effects', () => {
  const boom = handler(() => {
    kv.set('k', 'v');
    throw new RangeError('curso_id');
  });
  assert.throws(() => boom(new Message()), RangeError); // called directly, as a test may
  const host = new MockHost();
  assert.throws(() => host.run(boom, new Message()), RangeError);
  assert.equal(host.kvEntries().size, 0);
});

test('a non-verdict or a promise is a type error', () => {
  const host = new MockHost();
  assert.throws(() => host.run(() => { kv.set('k', 'v'); return undefined; }, new Message()), /must return a Verdict/);
  assert.equal(host.kvEntries().size, 0);
  assert.throws(() => run(() => Promise.resolve(Verdict.ack()), new Message()), /returned a Promise/);
});

test('handler() checks what it wraps', () => {
  assert.throws(() => handler(42), /needs a function/);
  assert.throws(() => handler(async () => Verdict.ack()), /is async/);
  assert.throws(() => handler((msg, extra) => Verdict.ack()), /takes 2 arguments/);
  const fn = () => Verdict.ack();
  assert.deepEqual(handler(fn)(new Message()), Verdict.ack());
});

test('the host call cap throws something toVerdict handling does not catch', () => {
  const host = new MockHost();
  host.limits = { maxHostCalls: 3 };
  const flood = () => {
    for (;;) {
      try {
        kv.get('k');
      } catch (e) {
        if (!(e instanceof CarteiroError)) throw e;
      }
    }
  };
  assert.throws(() => host.run(flood, new Message()), (e) => e instanceof HostCallLimitExceeded && /exceeded 3 host calls/.test(e.message));
  for (let i = 0; i < 5; i += 1) kv.set(`seed/${i}`, 'x'); // outside run nothing is counted
});

test('kv writes report deletes', () => {
  const host = new MockHost();
  host.kvInsert('old', '1');
  const out = host.run(() => { kv.delete('old'); kv.set('new', '2'); return Verdict.ack(); }, new Message());
  assert.deepEqual([...out.kvWrites.keys()], ['new', 'old']);
  assert.equal(out.kvWrites.get('old'), null);
  assert.deepEqual([...host.kvEntries().keys()], ['new']);
});

test('log levels', () => {
  const host = new MockHost();
  const out = host.run(() => {
    log.trace('t'); log.debug('d'); log.info('i'); log.warn('w'); log.error('e'); log.log('info', 'l');
    return Verdict.ack();
  }, new Message());
  assert.deepEqual(out.logs.map((r) => `${r.level}:${r.message}`), ['trace:t', 'debug:d', 'info:i', 'warn:w', 'error:e', 'info:l']);
  assert.throws(() => log.log('loud', 'x'), RangeError);
});
