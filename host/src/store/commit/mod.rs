//! Committing what deliveries make durable (G2: effects once): the inbox record, the kv
//! writes and the outbox rows of a delivery commit together or not at all.
//!
//! # Layout
//! - `request`: [`CommitRequest`] and what both commit paths share (checks, key locks,
//!   outbox rows), below them both.
//! - `set`: the set-based fast path, a whole batch in a handful of statements.
//! - `savepoints`: [`Store::commit_batch`](crate::store::Store::commit_batch), which tries
//!   the fast path and falls back to one savepoint per request.
//! - `committer`: [`GroupCommitter`], the task that batches concurrent commits.
//! - `handoff`: immediate dispatch, the committed rows handed to the in-process relay.

mod committer;
pub(crate) mod handoff;
mod request;
mod savepoints;
mod set;

pub use committer::{CommitterConfig, CommitterHandle, GroupCommitter};
pub use handoff::{Handed, Handoff, Room};
#[cfg(test)]
pub(crate) use request::Committed;
pub use request::{
    CommitOutcome, CommitRequest, KvRead, KvWrite, MAX_KV_KEYS_PER_COMMIT, NewOutboxRow,
};
