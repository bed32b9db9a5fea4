import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Message, Verdict, kv, outbox } from 'carteiro-sdk';
import { batchHandler } from 'carteiro-sdk/batch';
import { MockHost } from 'carteiro-sdk/testing';

function handleOne(msg) {
  const seen = kv.getText('count');
  kv.set('count', seen === undefined ? '1' : '2');
  outbox.emit('ex', msg.routingKey, msg.body);
  if (msg.text() === 'retry') return Verdict.retry(`asked (count read ${seen})`);
  if (msg.text() === 'dead') return Verdict.deadLetter('asked');
  return Verdict.ack();
}

const { handle, handleBatch } = batchHandler((batch) => batch.map(handleOne));

test('each message of a batch commits only its own effects', () => {
  const host = new MockHost();
  const messages = ['ok', 'retry', 'dead', 'ok'].map((t, i) => Message.fromText(`rk-${i}`, t));
  const outcomes = host.runBatch(handleBatch, messages);
  assert.deepEqual(outcomes.map((o) => o.verdict.kind), ['ack', 'retry', 'dead-letter', 'ack']);
  // Message 1 read the committed store, not message 0's uncommitted write.
  assert.equal(outcomes[1].verdict.reason, 'asked (count read undefined)');
  for (const o of outcomes) assert.equal(o.events.length, 1);
  assert.deepEqual(host.events().map((e) => e.routingKey), ['rk-0', 'rk-3']);
  assert.equal(host.kvText('count'), '1');
});

test('a wrong number of verdicts retries every message without effects', () => {
  const host = new MockHost();
  const short = batchHandler((batch) => { for (const _ of batch) kv.set('k', 'v'); return [Verdict.ack()]; });
  const outcomes = host.runBatch(short.handleBatch, [Message.fromText('a', '1'), Message.fromText('b', '2')]);
  assert.ok(outcomes.every((o) => o.verdict.kind === 'retry'));
  assert.equal(host.kv('k'), undefined);
});

test('handle runs the batch function on one message without attributing', () => {
  new MockHost();
  const raw = {
    id: undefined, exchange: '', routingKey: 'a', headers: [], contentType: undefined,
    body: new TextEncoder().encode('ok'), attempt: 1, redelivered: false,
  };
  assert.deepEqual(handle(raw), { tag: 'ack' });
});
