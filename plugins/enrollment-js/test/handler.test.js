// Mirrors plugins/enrollment's tests (and pins the reason texts they share).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Message, Verdict } from 'carteiro-sdk';
import { MockHost } from 'carteiro-sdk/testing';

import {
  ACESSO_LIBERADO, EMAIL_SOLICITADO, FATURA_SOLICITADA, handle,
} from '../src/handler.js';

const text = (bytes) => new TextDecoder().decode(bytes);
const confirmada = (body) => Message.fromJson('matricula.confirmada', body, { id: 'msg-1' });

test('records and emits three events', () => {
  const host = new MockHost();
  host.setVar('events_exchange', 'escola.eventos');
  const body = { matricula_id: 'm-1', usuario_id: 7, curso_id: 'rust-101' };
  const out = host.run(handle, confirmada(body));
  assert.deepEqual(out.verdict, Verdict.ack());
  assert.deepEqual(out.events.map((e) => e.routingKey), [ACESSO_LIBERADO, FATURA_SOLICITADA, EMAIL_SOLICITADO]);
  for (const e of out.events) {
    assert.equal(e.exchange, 'escola.eventos');
    assert.equal(e.contentType, 'application/json');
    assert.deepEqual(e.json(), body);
    assert.deepEqual(e.headers, [{ name: 'x-causation-id', value: 'msg-1' }]);
  }
  // Byte for byte what the Rust plugin stores: fields in declaration order, compact JSON.
  assert.equal(host.kvText('matricula/m-1'), '{"matricula_id":"m-1","usuario_id":7,"curso_id":"rust-101"}');
  assert.equal(text(out.events[0].payload), host.kvText('matricula/m-1'));
  assert.equal(host.events().length, 3);
  assert.deepEqual(out.logs, [{ level: 'info', message: 'matricula m-1 confirmed' }]);
});

test('default exchange, and no causation header without an id', () => {
  const host = new MockHost();
  const out = host.run(handle, Message.fromJson('matricula.confirmada', { curso_id: 3, usuario_id: 2, matricula_id: 1 }));
  assert.ok(out.verdict.isAck);
  assert.deepEqual(new Set(out.events.map((e) => e.exchange)), new Set(['carteiro.events']));
  assert.ok(out.events.every((e) => e.headers.length === 0));
  assert.equal(host.kvText('matricula/1'), '{"matricula_id":1,"usuario_id":2,"curso_id":3}');
});

test('malformed payloads dead-letter naming the problem', () => {
  const host = new MockHost();
  let out = host.run(handle, confirmada({ matricula_id: 'm-1', usuario_id: 'u-1' }));
  assert.deepEqual(out.verdict, Verdict.deadLetter('invalid matricula.confirmada: missing field `curso_id`'));
  out = host.run(handle, Message.fromText('matricula.confirmada', '{oops'));
  assert.ok(out.verdict.isDeadLetter);
  assert.ok(out.verdict.reason.startsWith('invalid matricula.confirmada: key must be a string'));
  out = host.run(handle, confirmada({ matricula_id: true, usuario_id: 1, curso_id: 2 }));
  assert.ok(out.verdict.isDeadLetter);
  assert.equal(host.kvEntries().size, 0);
  assert.equal(host.events().length, 0);
});

const reasons = [
  [{ matricula_id: true, usuario_id: 1, curso_id: 2 }, 'invalid type: boolean `true`, expected a non-empty string or an integer id'],
  [{ matricula_id: '', usuario_id: 1, curso_id: 2 }, 'invalid value: string "", expected a non-empty string or an integer id'],
  [{ matricula_id: 1.5, usuario_id: 1, curso_id: 2 }, 'invalid type: floating point `1.5`, expected a non-empty string or an integer id'],
  [{ matricula_id: null, usuario_id: 1, curso_id: 2 }, 'invalid type: null, expected a non-empty string or an integer id'],
  [{ matricula_id: [1], usuario_id: 1, curso_id: 2 }, 'invalid type: sequence, expected a non-empty string or an integer id'],
  [{ matricula_id: {}, usuario_id: 1, curso_id: 2 }, 'invalid type: map, expected a non-empty string or an integer id'],
  [{ usuario_id: 1 }, 'missing field `matricula_id`'],
  ['text', 'invalid type: string "text", expected struct Matricula'],
  [5, 'invalid type: integer `5`, expected struct Matricula'],
  [null, 'invalid type: null, expected struct Matricula'],
  [[1, 2], 'invalid length 2, expected struct Matricula with 3 elements'],
];
for (const [body, problem] of reasons) {
  test(`reason text matches the Rust plugin: ${problem}`, () => {
    const out = new MockHost().run(handle, confirmada(body));
    assert.deepEqual(out.verdict, Verdict.deadLetter(`invalid matricula.confirmada: ${problem}`));
  });
}

test('integer ids beyond 2^53 are refused, not rounded', () => {
  const out = new MockHost().run(handle, Message.fromText('matricula.confirmada', '{"matricula_id":9007199254740993,"usuario_id":1,"curso_id":2}'));
  assert.ok(out.verdict.isDeadLetter);
  assert.match(out.verdict.reason, /beyond JavaScript's safe integers/);
});

test('a three-element array is a matricula, as in serde', () => {
  const host = new MockHost();
  assert.ok(host.run(handle, confirmada(['m-9', 1, 2])).verdict.isAck);
  assert.deepEqual(host.kvJson('matricula/m-9'), { matricula_id: 'm-9', usuario_id: 1, curso_id: 2 });
});

test('content service down retries without effects', () => {
  const host = new MockHost();
  host.setVar('content_service', 'down');
  const body = { matricula_id: 1, usuario_id: 2, curso_id: 3 };
  const out = host.run(handle, confirmada(body));
  assert.deepEqual(out.verdict, Verdict.retry('content service unavailable'));
  assert.equal(host.kvEntries().size, 0);
  host.setVar('content_service', 'up');
  assert.ok(host.run(handle, confirmada(body)).verdict.isAck);
});

test('kv outage retries', () => {
  const host = new MockHost();
  host.setKvUnavailable('database down');
  const out = host.run(handle, confirmada({ matricula_id: 1, usuario_id: 2, curso_id: 3 }));
  assert.deepEqual(out.verdict, Verdict.retry('kv unavailable: database down'));
  assert.equal(host.events().length, 0);
});

test('duplicate enrollment acks without new events', () => {
  const host = new MockHost();
  const body = { matricula_id: 1, usuario_id: 2, curso_id: 3 };
  assert.ok(host.run(handle, confirmada(body)).verdict.isAck);
  const again = host.run(handle, confirmada(body));
  assert.ok(again.verdict.isAck);
  assert.equal(again.events.length, 0);
  assert.deepEqual(again.logs.map((r) => r.message), ['matricula 1 already confirmed; nothing to do']);
  const out = host.run(handle, confirmada({ matricula_id: 1, usuario_id: 9, curso_id: 3 }));
  assert.deepEqual(out.verdict, Verdict.deadLetter('matricula 1 was already confirmed with a different usuario_id or curso_id'));
  assert.ok(host.run(handle, confirmada({ matricula_id: 1, usuario_id: '2', curso_id: 3 })).verdict.isDeadLetter);
  assert.equal(host.events().length, 3);
});

test('a corrupt stored record dead-letters', () => {
  const host = new MockHost();
  host.kvInsert('matricula/1', 'not json');
  const out = host.run(handle, confirmada({ matricula_id: 1, usuario_id: 2, curso_id: 3 }));
  assert.ok(out.verdict.isDeadLetter);
  assert.ok(out.verdict.reason.startsWith('kv: value of `matricula/1` is not the expected JSON'));
});

test('calling the exported handle natively returns the verdict', () => {
  new MockHost();
  assert.deepEqual(handle(confirmada({ matricula_id: 5, usuario_id: 2, curso_id: 3 })), Verdict.ack());
});
