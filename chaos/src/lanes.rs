//! The campaign's two lanes of faults: short ones one at a time, each waiting for progress
//! to resume before the next; long ones (store outages, an unroutable event type) in the
//! background beside them, so that they do not hold the rate down. A fault that healed
//! while a background one lasts has its recovery measured once that one heals too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use serde::Serialize;

use crate::faults::{self, Fault};

/// Longest the campaign waits for progress after a fault before it calls it a stall.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(120);
/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub fault: Fault,
    pub target: String,
    pub start_ms: u64,
    /// When it healed, and every background fault beside it did too: from then on,
    /// progress is what recovery waits for.
    pub healed_ms: u64,
    /// First progress after healing; `None`: none within [`RECOVERY_BOUND`].
    pub recovered_ms: Option<u64>,
}

impl FaultRecord {
    /// The record, printed as the campaign's log line for it.
    pub fn new(
        fault: Fault,
        target: String,
        start_ms: u64,
        healed_ms: u64,
        recovered_ms: Option<u64>,
    ) -> Self {
        println!(
            "chaos: {:>7.1} s  {:<24} {:<36} recovered in {}",
            start_ms as f64 / 1e3,
            fault.name(),
            target,
            recovered_ms.map_or("NEVER".to_owned(), |r| format!(
                "{:.2} s",
                (r - healed_ms) as f64 / 1e3
            ))
        );
        Self {
            fault,
            target,
            start_ms,
            healed_ms,
            recovered_ms,
        }
    }
}

/// A fault's record: complete, or still waiting for its fault to heal or its recovery.
pub enum Recorded {
    Done(FaultRecord),
    Pending(tokio::task::JoinHandle<anyhow::Result<FaultRecord>>),
}

/// The background faults not yet healed.
#[derive(Clone, Default)]
pub struct Active(Arc<std::sync::Mutex<Vec<Fault>>>);

impl Active {
    pub fn now(&self) -> Vec<Fault> {
        self.0.lock().expect("not poisoned").clone()
    }

    pub fn add(&self, fault: Fault) {
        self.0.lock().expect("not poisoned").push(fault);
    }

    pub fn remove(&self, fault: Fault) {
        let mut active = self.0.lock().expect("not poisoned");
        if let Some(i) = active.iter().position(|f| *f == fault) {
            active.remove(i);
        }
    }
}

/// The next fault: the scheduled one when its turn has come and it fits beside the
/// background faults, else one drawn by weight that fits (a gateway kill fits beside any).
pub fn next_fault(
    scheduled: &mut Vec<(usize, Fault)>,
    injected: usize,
    active: &[Fault],
    rng: &mut StdRng,
    weights: &[(Fault, u32)],
) -> Fault {
    if let Some(&(nth, fault)) = scheduled.last()
        && injected >= nth
        && fault.fits_beside(active)
    {
        scheduled.pop();
        return fault;
    }
    (0..32)
        .map(|_| faults::pick(rng, weights))
        .find(|f| f.fits_beside(active))
        .unwrap_or(Fault::KillGateway)
}

/// When progress first resumes after a healed fault.
pub async fn recovery(processed: &AtomicU64, started: Instant) -> Option<u64> {
    let before = processed.load(Ordering::Relaxed);
    let deadline = Instant::now() + RECOVERY_BOUND;
    while Instant::now() < deadline {
        if processed.load(Ordering::Relaxed) > before {
            return Some(started.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Longest a fault's recovery waits for the background faults beside it to heal: their
/// longest hold plus their healing's bound.
const BESIDE_BOUND: Duration = Duration::from_secs(480);

/// Waits until no background fault is active any more, then for [`recovery`]. Returns when
/// the background cleared (the moment this fault's recovery counts from) and the recovery.
pub async fn recovery_beside(
    active: &Active,
    processed: &AtomicU64,
    started: Instant,
) -> (u64, Option<u64>) {
    let deadline = Instant::now() + BESIDE_BOUND;
    while !active.now().is_empty() {
        if Instant::now() > deadline {
            return (started.elapsed().as_millis() as u64, None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cleared = started.elapsed().as_millis() as u64;
    (cleared, recovery(processed, started).await)
}

/// The record of `fault` (its kind, target and start), complete once no background fault is
/// active and progress resumed after that.
pub async fn record_beside(
    active: &Active,
    processed: &AtomicU64,
    started: Instant,
    (fault, target, start_ms): (Fault, String, u64),
) -> FaultRecord {
    let (healed_ms, recovered_ms) = recovery_beside(active, processed, started).await;
    FaultRecord::new(fault, target, start_ms, healed_ms, recovered_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_scheduled_fault_waits_for_its_turn_and_for_room_beside_the_background() {
        let weights = faults::weights(false, false, false);
        let mut rng = StdRng::seed_from_u64(3);
        let mut scheduled = vec![(5, Fault::SqliteLockLong)];
        let active = Active::default();
        let drawn = next_fault(&mut scheduled, 4, &active.now(), &mut rng, &weights);
        assert_ne!(drawn, Fault::SqliteLockLong, "before its turn");
        active.add(Fault::SqliteLockLong);
        for _ in 0..200 {
            let f = next_fault(&mut scheduled, 5, &active.now(), &mut rng, &weights);
            assert!(
                f.fits_beside(&[Fault::SqliteLockLong]),
                "{f:?} beside a held lock"
            );
        }
        assert_eq!(scheduled.len(), 1, "kept until it fits");
        active.remove(Fault::SqliteLockLong);
        let f = next_fault(&mut scheduled, 5, &active.now(), &mut rng, &weights);
        assert_eq!((f, scheduled.len()), (Fault::SqliteLockLong, 0));
    }
}
