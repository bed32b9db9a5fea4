// Types of carteiro-sdk/testing: the mock host for `node --test`.
import type { Handle, Header, Message, Verdict } from './index.js';

export interface Limits {
  maxKeyLen: number;
  maxValueLen: number;
  maxEvents: number;
  maxPayloadLen: number;
  maxHostCalls: number;
}

export interface LogRecord {
  readonly level: 'trace' | 'debug' | 'info' | 'warn' | 'error';
  readonly message: string;
}

export class EmittedEvent {
  readonly id: string;
  readonly exchange: string;
  readonly routingKey: string;
  readonly headers: readonly Header[];
  readonly contentType: string | undefined;
  readonly payload: Uint8Array;
  header(name: string): string | undefined;
  text(): string;
  json<T = unknown>(): T;
}

/** Thrown when a handler exceeds `maxHostCalls` (the real host traps). */
export class HostCallLimitExceeded extends Error {}

export class Outcome {
  readonly verdict: Verdict;
  readonly events: EmittedEvent[];
  /** Bytes written, or `null` for a delete. */
  readonly kvWrites: Map<string, Uint8Array | null>;
  readonly logs: LogRecord[];
  eventsTo(routingKey: string): EmittedEvent[];
}

export type Runnable = Handle | ((message: Message) => Verdict);

/** Runs a handler like the gateway: effects commit only on ack. */
export function run(handler: Runnable, message: Message): Outcome;

/** The mock's controls; constructing one resets the mock. */
export class MockHost {
  constructor();
  get limits(): Limits;
  set limits(limits: Partial<Limits>);
  setVar(name: string, value: string): void;
  removeVar(name: string): void;
  setKvUnavailable(reason: string | undefined): void;
  kvInsert(key: string, value: Uint8Array | string): void;
  kv(key: string): Uint8Array | undefined;
  kvText(key: string): string | undefined;
  kvJson<T = unknown>(key: string): T | undefined;
  kvEntries(): Map<string, Uint8Array>;
  events(): EmittedEvent[];
  logs(): LogRecord[];
  run(handler: Runnable, message: Message): Outcome;
}
