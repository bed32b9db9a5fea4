//! Acks in runs. A group commit settles many deliveries of one channel at once; a single
//! `basic.ack` with `multiple` then covers the whole contiguous run of delivery tags,
//! instead of one frame, one client round through lapin's RPC thread and one broker-side
//! settle per delivery. A delivery that settles while an earlier one is still running is
//! acked on its own after `HOLD`, so one slow handler never holds the others' acks (and the
//! prefetch window) back.

use lapin::Channel;
use lapin::options::BasicAckOptions;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How long an ack may wait for the deliveries before it to settle and join their run.
const HOLD: Duration = Duration::from_millis(2);

enum Settled {
    /// The delivery's effects are durable: ack it (possibly with others).
    Ack(u64),
    /// The delivery was nacked or rejected on its own; the run may pass it.
    Elsewhere(u64),
}

/// Where a route's deliveries report how they settled. Cheap to clone.
#[derive(Clone)]
pub struct Acks {
    tx: mpsc::UnboundedSender<Settled>,
}

impl Acks {
    /// Starts the acker of `channel`. It ends, after sending every ack it was given, once
    /// every `Acks` clone is dropped.
    pub fn start(channel: Channel, queue: String) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, tokio::spawn(run(channel, queue, rx)))
    }

    /// The delivery with this tag may be acked.
    pub fn ack(&self, delivery_tag: u64) {
        // The acker only stops after every sender is gone, so this cannot fail.
        let _ = self.tx.send(Settled::Ack(delivery_tag));
    }

    /// The delivery with this tag was nacked (or rejected) directly on the channel.
    pub fn settled_elsewhere(&self, delivery_tag: u64) {
        let _ = self.tx.send(Settled::Elsewhere(delivery_tag));
    }
}

async fn run(channel: Channel, queue: String, mut rx: mpsc::UnboundedReceiver<Settled>) {
    let mut plan = AckPlan::default();
    let mut open = true;
    while open {
        // `None` from the timer: nothing new, just send the stragglers' acks below.
        let next = match plan.deadline(HOLD) {
            Some(deadline) => tokio::select! {
                next = rx.recv() => Some(next),
                _ = tokio::time::sleep_until(deadline.into()) => None,
            },
            None => Some(rx.recv().await),
        };
        let mut record = |settled| match settled {
            Settled::Ack(tag) => plan.ack(tag, Instant::now()),
            Settled::Elsewhere(tag) => plan.settled_elsewhere(tag),
        };
        match next {
            Some(Some(settled)) => record(settled),
            Some(None) => open = false,
            None => {}
        }
        while let Ok(settled) = rx.try_recv() {
            record(settled);
        }
        let hold = if open { HOLD } else { Duration::ZERO };
        let mut failed = None;
        for (tag, multiple) in plan.take(Instant::now(), hold) {
            if let Err(e) = channel.basic_ack(tag, BasicAckOptions { multiple }).await {
                failed = Some(e);
            }
        }
        if let Some(e) = failed {
            // The channel died after the effects were made durable; the broker redelivers
            // and the inbox absorbs the duplicates.
            tracing::warn!(queue = %queue, error = %e, "ack failed; the redeliveries will be deduplicated");
        }
    }
}

/// Which acks to send for the deliveries settled so far on one channel (delivery tags are
/// 1, 2, 3, ... per channel; every delivery settles exactly once).
#[derive(Debug, Default)]
struct AckPlan {
    /// Every delivery up to this tag is settled and its ack, if any, sent.
    floor: u64,
    /// Acks decided but not sent yet, with when they were decided.
    pending: BTreeMap<u64, Instant>,
    /// Deliveries above `floor` settled and sent already (nacks, stragglers' acks).
    sent: BTreeSet<u64>,
}

impl AckPlan {
    fn ack(&mut self, tag: u64, now: Instant) {
        self.pending.insert(tag, now);
    }

    fn settled_elsewhere(&mut self, tag: u64) {
        self.sent.insert(tag);
    }

    /// When the oldest waiting ack must go out on its own.
    fn deadline(&self, hold: Duration) -> Option<Instant> {
        self.pending.values().min().map(|at| *at + hold)
    }

    /// The acks to send now, as `(delivery tag, multiple)`: one `multiple` ack ending at
    /// the last pending tag of the contiguous settled run above `floor`, then single acks
    /// for those that waited `hold` behind a delivery still running. The tag of a
    /// `multiple` ack is always one never acked before, as the broker requires.
    fn take(&mut self, now: Instant, hold: Duration) -> Vec<(u64, bool)> {
        let mut out = Vec::new();
        let mut run_end = None;
        loop {
            let next = self.floor + 1;
            if self.pending.remove(&next).is_some() {
                run_end = Some(next);
            } else if !self.sent.remove(&next) {
                break;
            }
            self.floor = next;
        }
        if let Some(tag) = run_end {
            out.push((tag, true));
        }
        let due: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, at)| now.duration_since(**at) >= hold)
            .map(|(tag, _)| *tag)
            .collect();
        for tag in due {
            self.pending.remove(&tag);
            self.sent.insert(tag);
            out.push((tag, false));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_millis(2);

    /// A plan with these tags acked at `at`.
    fn acked(tags: &[u64], at: Instant) -> AckPlan {
        let mut plan = AckPlan::default();
        for &tag in tags {
            plan.ack(tag, at);
        }
        plan
    }

    #[test]
    fn a_contiguous_run_is_one_multiple_ack() {
        let now = Instant::now();
        let mut plan = acked(&[3, 1, 2], now);
        assert_eq!(plan.take(now, HOLD), vec![(3, true)]);
        plan.ack(4, now);
        assert_eq!(plan.take(now, HOLD), vec![(4, true)]);
        assert_eq!(plan.deadline(HOLD), None);
    }

    #[test]
    fn acks_behind_a_running_delivery_wait_then_go_alone() {
        let t0 = Instant::now();
        let mut plan = acked(&[1, 3, 4], t0);
        // 2 still runs: 1 goes now, 3 and 4 wait for it ...
        assert_eq!(plan.take(t0, HOLD), vec![(1, true)]);
        assert_eq!(plan.deadline(HOLD), Some(t0 + HOLD));
        // ... but not beyond the hold.
        assert_eq!(plan.take(t0 + HOLD, HOLD), vec![(3, false), (4, false)]);
        // 2 settles: its run is just itself (3 and 4 were acked already), and the run
        // moves past them so 5 joins the next multiple ack.
        plan.ack(2, t0 + HOLD);
        plan.ack(5, t0 + HOLD);
        assert_eq!(plan.take(t0 + HOLD, HOLD), vec![(5, true)]);
        assert_eq!(plan.floor, 5);
    }

    #[test]
    fn a_nacked_delivery_lets_the_run_pass() {
        let now = Instant::now();
        let mut plan = acked(&[1, 3], now);
        assert_eq!(plan.take(now, HOLD), vec![(1, true)]);
        plan.settled_elsewhere(2);
        assert_eq!(plan.take(now, HOLD), vec![(3, true)]);
        // A run that ends on a nacked delivery ends its ack at the last pending tag.
        plan.ack(4, now);
        plan.settled_elsewhere(5);
        assert_eq!(plan.take(now, HOLD), vec![(4, true)]);
        assert_eq!(plan.floor, 5);
    }

    #[test]
    fn closing_sends_everything() {
        let now = Instant::now();
        let mut plan = acked(&[2, 3], now);
        assert_eq!(plan.take(now, Duration::ZERO), vec![(2, false), (3, false)]);
        assert!(plan.pending.is_empty());
    }
}
