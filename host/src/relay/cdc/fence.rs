//! The fence of a replication session: it publishes only while it can show that the slot is
//! still read through its own connection.
//!
//! A relay can lose the slot without noticing: paused (SIGSTOP, a VM freeze) until the server
//! ends its walsender, or cut off while a standby takes the slot over. Its publish tasks would
//! then send rows the new reader has published and marked already. So a watcher reads the
//! slot's reader (`pg_replication_slots.active_pid`) every [`CHECK_EVERY`], and each answer
//! naming this session's backend lets the session publish for [`VALID_FOR`] counted from
//! *before* the question was sent. A publish task checks that time has not run out before
//! each run of publishes, and waits for the next answer if it has; an answer naming anyone
//! else ends the session. The monotonic clock keeps running while a process is stopped, so a
//! resumed relay finds its permission expired.
//!
//! The new reader waits [`VALID_FOR`] after it took the slot before it publishes anything
//! ([`grace`]): the old reader's last permission was granted before the slot changed hands,
//! so it has run out by then.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::relay::publish::{self, SlotLost};
use crate::relay::source::SlotSource;

/// How often the watcher asks who reads the slot.
const CHECK_EVERY: Duration = Duration::from_millis(250);
/// How long one answer lets the session publish: a few missed checks (a slow store) pause
/// publishing instead of ending the session.
pub(super) const VALID_FOR: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
enum State {
    /// Publishing is allowed until then.
    ValidUntil(Instant),
    /// Another backend, or none, reads the slot.
    Lost,
}

/// What a publish task asks before each run of publishes.
#[derive(Debug, Clone)]
pub(super) struct Fence {
    slot: String,
    state: watch::Receiver<State>,
}

impl Fence {
    /// Returns once this session may publish now, or why it never may again.
    pub async fn admit(&mut self) -> Result<(), SlotLost> {
        loop {
            match *self.state.borrow_and_update() {
                State::Lost => return Err(SlotLost(self.slot.clone())),
                State::ValidUntil(until) if Instant::now() < until => return Ok(()),
                State::ValidUntil(_) => {}
            }
            if self.state.changed().await.is_err() {
                return Err(SlotLost(self.slot.clone()));
            }
        }
    }
}

impl publish::Fence for Fence {
    async fn admit(&mut self) -> Result<(), SlotLost> {
        Fence::admit(self).await
    }
}

/// Starts the watcher of `slot` in `source`, read by backend `reader` (this session's
/// replication connection), until `stop`.
pub(super) fn watch<S: SlotSource>(
    source: S,
    slot: String,
    reader: i32,
    stop: CancellationToken,
) -> Fence {
    let (tx, rx) = watch::channel(State::ValidUntil(Instant::now()));
    let watched = slot.clone();
    tokio::spawn(async move {
        loop {
            let asked = Instant::now();
            match source.slot_reader(&watched).await {
                Ok(Some(pid)) if pid == reader => {
                    let _ = tx.send(State::ValidUntil(asked + VALID_FOR));
                }
                Ok(now) => {
                    tracing::warn!(slot = %watched, reader = ?now, mine = reader, "the replication slot is no longer read by this relay; it stops publishing");
                    let _ = tx.send(State::Lost);
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the replication slot's reader; publishing pauses until it answers")
                }
            }
            tokio::select! {
                () = tokio::time::sleep(CHECK_EVERY) => {}
                () = stop.cancelled() => return,
            }
        }
    });
    Fence { slot, state: rx }
}

/// A relay that has just taken the slot waits until any earlier reader's permission has run
/// out, before it publishes anything (the backlog drain included).
pub(super) async fn grace(stop: &CancellationToken) {
    tokio::select! {
        () = tokio::time::sleep(VALID_FOR) => {}
        () = stop.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(state: State) -> (watch::Sender<State>, Fence) {
        let (tx, rx) = watch::channel(state);
        let f = Fence {
            slot: "s".into(),
            state: rx,
        };
        (tx, f)
    }

    /// A permission that ran out a moment ago, as a resumed process finds its own.
    fn expired() -> State {
        State::ValidUntil(Instant::now() - Duration::from_millis(1))
    }

    async fn still_waiting(f: &mut Fence) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f.admit())
            .await
            .is_err()
    }

    #[tokio::test]
    async fn an_expired_permission_waits_and_another_reader_ends_the_session() {
        let (tx, mut f) = fence(State::ValidUntil(Instant::now() + VALID_FOR));
        assert!(f.admit().await.is_ok(), "within the permission");
        tx.send(expired()).expect("send");
        assert!(still_waiting(&mut f).await, "an expired permission waits");
        tx.send(State::Lost).expect("send");
        let lost = f.admit().await.map_err(|e| e.to_string());
        assert!(
            lost.is_err_and(|e| e.contains("no longer read by this relay")),
            "another reader ends it"
        );
    }

    #[tokio::test]
    async fn a_renewed_permission_lets_a_waiting_task_go() {
        let (tx, mut f) = fence(expired());
        assert!(still_waiting(&mut f).await);
        tx.send(State::ValidUntil(Instant::now() + VALID_FOR))
            .expect("send");
        assert!(f.admit().await.is_ok());
    }
}
