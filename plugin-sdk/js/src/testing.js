/**
 * Test handlers natively with `node --test`: an in-memory mock host, no WebAssembly.
 *
 * Outside the component every `kv`, `outbox`, `config` and `log` call goes to the mock.
 * {@link run} calls a handler the way the gateway does: kv writes and events are kept only
 * if the verdict is ack. The mock applies the gateway's own key and event rules and throws
 * the same typed errors; it does not model timeouts, memory limits or concurrent re-runs
 * (use `carteiro plugin test` on the built component for those).
 * @module
 */

import { Batch, BATCH_HANDLER, checkVerdicts } from './batch.js';
import { checkVerdict, HANDLER } from './handler.js';
import {
  defaultLimits, EmittedEvent, freshState, HostCallLimitExceeded, mock, park,
} from './host/mock.js';
import { Verdict } from './verdict.js';

export { EmittedEvent, HostCallLimitExceeded };

const decoder = new TextDecoder();

/** What one {@link run} produced. */
export class Outcome {
  constructor(verdict, events, kvWrites, logs) {
    /** The handler's verdict. */
    this.verdict = verdict;
    /** Events emitted, in order (committed only if the verdict is ack). */
    this.events = events;
    /** kv changes by key: bytes written, or `null` for a delete (committed only on ack). */
    this.kvWrites = kvWrites;
    /** Lines logged, `{ level, message }` (kept whatever the verdict). */
    this.logs = logs;
  }

  /** The emitted events with this routing key. */
  eventsTo(routingKey) {
    return this.events.filter((e) => e.routingKey === routingKey);
  }
}

function sameBytes(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function diff(before, after) {
  const writes = new Map();
  for (const [key, value] of after) {
    const old = before.get(key);
    if (old === undefined || !sameBytes(old, value)) writes.set(key, value);
  }
  for (const key of before.keys()) if (!after.has(key)) writes.set(key, null);
  return new Map([...writes].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

/**
 * Runs `handler` (the result of `handler(fn)`, or a plain `fn`) on `message` against the
 * current mock. Effects commit only on ack; a thrown error propagates (on the real host it
 * is a trap) and its effects are discarded. A return value that is not a Verdict throws.
 */
export function run(handler, message) {
  const fn = handler[HANDLER] ?? handler;
  const s = mock.state;
  const kvBefore = new Map(s.kv);
  const eventsBefore = s.events.length;
  const logsBefore = s.logs.length;
  s.inMessage = true;
  s.messageEvents = 0;
  s.messageCalls = 0;
  let committed = false;
  try {
    const verdict = checkVerdict(fn, fn(message));
    committed = verdict.isAck;
    return new Outcome(verdict, s.events.slice(eventsBefore), diff(kvBefore, s.kv), s.logs.slice(logsBefore));
  } finally {
    s.inMessage = false;
    s.messageEvents = 0;
    if (!committed) {
      s.kv = kvBefore;
      s.events.length = eventsBefore;
    }
  }
}

/**
 * Runs a batch handler (`batchHandler(fn).handleBatch`, or a plain `fn`) on `messages`
 * against the current mock: one Outcome per message, with the effects made while it was the
 * current message of the Batch; each acked message's kv writes and events commit in message
 * order, the others' are discarded. Another number of verdicts than messages gets, as on
 * the gateway, a retry for every message and no effects. A thrown error propagates.
 */
export function runBatch(handler, messages) {
  const fn = handler[BATCH_HANDLER] ?? handler;
  const s = mock.state;
  const base = new Map(s.kv);
  s.batch = {
    items: messages.map(() => ({ kv: new Map(base), events: [], logs: [], calls: 0, eventCount: 0 })),
    current: 0,
    eventsMark: s.events.length,
    logsMark: s.logs.length,
  };
  s.inMessage = true;
  s.messageEvents = 0;
  s.messageCalls = 0;
  let verdicts;
  let items;
  try {
    verdicts = checkVerdicts(fn, fn(new Batch(messages)));
    park();
    items = s.batch.items;
  } finally {
    s.batch = undefined;
    s.inMessage = false;
    s.messageEvents = 0;
    s.kv = new Map(base);
  }
  if (verdicts.length !== messages.length) {
    const reason = `the batch handler returned ${verdicts.length} verdicts for ${messages.length} messages`;
    return messages.map(() => new Outcome(Verdict.retry(reason), [], new Map(), []));
  }
  return verdicts.map((verdict, i) => {
    const item = items[i];
    const writes = diff(base, item.kv);
    s.logs.push(...item.logs);
    if (verdict.isAck) {
      for (const [key, value] of writes) {
        if (value === null) s.kv.delete(key);
        else s.kv.set(key, value);
      }
      s.events.push(...item.events);
    }
    return new Outcome(verdict, item.events, writes, item.logs);
  });
}

/** The mock host's controls. Creating one resets the mock, so each test starts clean. */
export class MockHost {
  constructor() {
    mock.state = freshState();
  }

  /** The enforced limits (defaults = the gateway's). */
  get limits() { return { ...mock.state.limits }; }

  /** Replaces some limits: `host.limits = { maxEvents: 1 }` (the others keep their defaults). */
  set limits(limits) { mock.state.limits = { ...defaultLimits(), ...limits }; }

  /** Sets a config variable, as `[plugins.NAME.variables]` would. */
  setVar(name, value) { mock.state.vars.set(name, String(value)); }

  /** Unsets a config variable. */
  removeVar(name) { mock.state.vars.delete(name); }

  /**
   * Makes kv reads fail with `StoreUnavailable` carrying `reason` (writes are buffered
   * until commit, as on the real host, so they do not fail); `undefined` heals the store.
   */
  setKvUnavailable(reason) { mock.state.kvUnavailable = reason ?? undefined; }

  /** Seeds (or overwrites) a committed kv value. */
  kvInsert(key, value) {
    mock.state.kv.set(key, typeof value === 'string' ? new TextEncoder().encode(value) : Uint8Array.from(value));
  }

  /** The committed value under `key` (a Uint8Array), or `undefined`. */
  kv(key) { return mock.state.kv.get(key); }

  /** The committed value under `key` as text, or `undefined`. */
  kvText(key) {
    const raw = this.kv(key);
    return raw === undefined ? undefined : decoder.decode(raw);
  }

  /** The committed value under `key` decoded from JSON, or `undefined`. */
  kvJson(key) {
    const text = this.kvText(key);
    return text === undefined ? undefined : JSON.parse(text);
  }

  /** Every committed kv entry (a Map). */
  kvEntries() { return new Map(mock.state.kv); }

  /** Every committed event, in emission order. */
  events() { return [...mock.state.events]; }

  /** Every logged line since the mock was created. */
  logs() { return [...mock.state.logs]; }

  /** {@link run} against this mock. */
  run(handler, message) { return run(handler, message); }

  /** {@link runBatch} against this mock. */
  runBatch(handler, messages) { return runBatch(handler, messages); }
}
