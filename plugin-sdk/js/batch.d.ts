import type { Message, Verdict } from './index.js';

/** The messages of one batch; taking message `i` attributes the host calls that follow to it. */
export declare class Batch implements Iterable<Message> {
  readonly length: number;
  at(index: number): Message | undefined;
  map<T>(fn: (message: Message, index: number) => T): T[];
  [Symbol.iterator](): Iterator<Message>;
}

/** The component's `handle` (a batch of one) and `handleBatch` exports. */
export interface BatchExports {
  handle: (message: Message) => Verdict;
  handleBatch: (messages: Message[]) => Verdict[];
}

/** Marks `fn(batch) => Verdict[]` as the component's batch handler; export both results. */
export declare function batchHandler(fn: (batch: Batch) => Verdict[]): BatchExports;
