/**
 * The in-memory mock host used outside WebAssembly (`#host` resolves here in Node);
 * `carteiro-sdk/testing` drives it. It applies the gateway's rules and throws the same
 * typed errors as the real host.
 * @module
 */

import {
  InvalidEvent, InvalidKey, PayloadTooLarge, StoreUnavailable, TooManyEvents, ValueTooLarge,
} from '../errors.js';
import * as rules from '../rules.js';

export const LEVELS = ['trace', 'debug', 'info', 'warn', 'error'];

/**
 * The handler made more host calls than one delivery may. The real host traps the
 * component; the mock throws this (not a `CarteiroError`, so `toVerdict` handling skips it).
 */
export class HostCallLimitExceeded extends Error {
  constructor(limit) {
    super(`carteiro mock host: the handler exceeded ${limit} host calls (the real host traps)`);
    this.name = 'HostCallLimitExceeded';
  }
}

/** Limits the mock enforces; the defaults are the gateway's. */
export function defaultLimits() {
  return {
    maxKeyLen: rules.MAX_KV_KEY_BYTES,
    maxValueLen: rules.MAX_KV_VALUE_BYTES,
    maxEvents: 100,
    maxPayloadLen: rules.MAX_EVENT_PAYLOAD_BYTES,
    maxHostCalls: 10_000,
  };
}

/** An event the handler emitted, with the id the mock gave it. */
export class EmittedEvent {
  constructor(id, exchange, routingKey, headers, contentType, payload) {
    this.id = id;
    this.exchange = exchange;
    this.routingKey = routingKey;
    this.headers = headers;
    this.contentType = contentType;
    this.payload = payload;
    Object.freeze(this);
  }

  /** The first header called `name`. */
  header(name) {
    const found = this.headers.find((h) => h.name === name);
    return found === undefined ? undefined : found.value;
  }

  /** The payload as UTF-8 text. */
  text() { return new TextDecoder().decode(this.payload); }

  /** The payload decoded from JSON. */
  json() { return JSON.parse(this.text()); }
}

export function freshState() {
  return {
    kv: new Map(),
    vars: new Map(),
    events: [],
    logs: [],
    kvUnavailable: undefined,
    limits: defaultLimits(),
    inMessage: false,
    messageEvents: 0,
    messageCalls: 0,
    nextEvent: 0,
    /** Inside `testing.runBatch`: the other messages' state. */
    batch: undefined,
  };
}

/** The mock's state; replaced wholesale by `new MockHost()`. */
export const mock = { state: freshState() };

function hostCall() {
  const s = mock.state;
  if (!s.inMessage) return;
  s.messageCalls += 1;
  if (s.messageCalls > s.limits.maxHostCalls) {
    s.inMessage = false;
    throw new HostCallLimitExceeded(s.limits.maxHostCalls);
  }
}

function checkKey(key) {
  const why = rules.kvKeyProblem(key, mock.state.limits.maxKeyLen);
  if (why !== undefined) throw new InvalidKey(why);
}

export function kvGet(key) {
  hostCall();
  checkKey(key);
  // Like the real host: only reads reach the store; writes are buffered until commit.
  if (mock.state.kvUnavailable !== undefined) throw new StoreUnavailable(mock.state.kvUnavailable);
  const value = mock.state.kv.get(key);
  return value === undefined ? undefined : value.slice();
}

export function kvSet(key, value) {
  hostCall();
  checkKey(key);
  if (value.length > mock.state.limits.maxValueLen) throw new ValueTooLarge(mock.state.limits.maxValueLen);
  mock.state.kv.set(key, value.slice());
}

export function kvDelete(key) {
  hostCall();
  checkKey(key);
  mock.state.kv.delete(key);
}

export function outboxEmit(exchange, routingKey, headers, contentType, payload) {
  hostCall();
  const s = mock.state;
  if (s.messageEvents >= s.limits.maxEvents) throw new TooManyEvents(s.limits.maxEvents);
  const why = rules.eventProblem(exchange, routingKey, headers);
  if (why !== undefined) throw new InvalidEvent(why);
  if (payload.length > s.limits.maxPayloadLen) throw new PayloadTooLarge(s.limits.maxPayloadLen);
  s.messageEvents += 1;
  s.nextEvent += 1;
  // Shaped like a UUIDv7 so code that parses ids keeps working in tests.
  const id = `00000000-0000-7000-8000-${s.nextEvent.toString(16).padStart(12, '0')}`;
  s.events.push(new EmittedEvent(id, exchange, routingKey, Object.freeze([...headers]), contentType, payload.slice()));
  return id;
}

export function log(level, message) {
  hostCall();
  mock.state.logs.push(Object.freeze({ level: LEVELS[level], message }));
}

export function configGet(name) {
  hostCall();
  return mock.state.vars.get(name);
}

export function configAll() {
  hostCall();
  return [...mock.state.vars.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
}

/** Nothing to do natively: `console` stays Node's own. */
export function installConsole() {}

/** Natively a trap is just the exception reaching the test. */
export function reportTrap() {}

/** Moves the current batch message's state (kv view, events, logs, counts) into its place. */
export function park() {
  const s = mock.state;
  const b = s.batch;
  if (!b) return;
  const item = b.items[b.current];
  item.kv = new Map(s.kv);
  item.events.push(...s.events.splice(b.eventsMark));
  item.logs.push(...s.logs.splice(b.logsMark));
  item.calls = s.messageCalls;
  item.eventCount = s.messageEvents;
}

/** Host calls from now on belong to message `index` of the batch (the real host traps on a bad one). */
export function batchItem(index) {
  hostCall();
  const s = mock.state;
  if (!s.batch) throw new Error('carteiro mock host: batch item outside a batch (the real host traps)');
  if (!(index >= 0 && index < s.batch.items.length)) {
    throw new Error(`carteiro mock host: batch item ${index} in a batch of ${s.batch.items.length} (the real host traps)`);
  }
  park();
  const item = s.batch.items[index];
  s.kv = new Map(item.kv);
  s.messageCalls = item.calls;
  s.messageEvents = item.eventCount;
  s.batch.current = index;
}
