//! An alert that is logged when it is raised, reminded while it stays raised and logged
//! once when it clears: the dead-letter alerts and the CDC slot's lag alert share it.

use std::time::Duration;

/// What an observation changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Crossed the threshold: log it.
    Raised,
    /// Still over it a whole reminder period after the last log: log it again.
    Reminder,
    /// Under the threshold again.
    Cleared,
}

/// An alert that is logged when raised, again every reminder period while it stays raised,
/// and once when it clears: a pure state machine over (over the threshold, time)
/// observations. Times are durations since an origin the caller keeps (the Unix epoch, an
/// `Instant` it took), so a wall clock and a monotonic one serve alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoggedAlert {
    raised_at: Option<Duration>,
    logged_at: Option<Duration>,
}

impl LoggedAlert {
    pub fn is_raised(&self) -> bool {
        self.raised_at.is_some()
    }

    /// When it was raised, while it is.
    pub fn raised_at(&self) -> Option<Duration> {
        self.raised_at
    }

    /// Feeds whether the watched value is `over` the threshold at `now`; while it stays
    /// over, it is logged again once `remind` has passed since the last log.
    pub fn observe(&mut self, over: bool, now: Duration, remind: Duration) -> Option<Change> {
        match (over, self.logged_at) {
            (true, None) => {
                self.raised_at = Some(now);
                self.logged_at = Some(now);
                Some(Change::Raised)
            }
            (true, Some(logged)) if now.saturating_sub(logged) >= remind => {
                self.logged_at = Some(now);
                Some(Change::Reminder)
            }
            (true, Some(_)) => None,
            (false, Some(_)) => {
                *self = Self::default();
                Some(Change::Cleared)
            }
            (false, None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_once_reminded_after_the_period_then_cleared() {
        let (mut alert, remind) = (LoggedAlert::default(), Duration::from_secs(60));
        let at = Duration::from_secs;
        assert_eq!(alert.observe(false, at(0), remind), None);
        assert_eq!(alert.observe(true, at(10), remind), Some(Change::Raised));
        assert_eq!(alert.raised_at(), Some(at(10)));
        assert_eq!(
            alert.observe(true, at(69), remind),
            None,
            "within the period"
        );
        assert_eq!(alert.observe(true, at(70), remind), Some(Change::Reminder));
        assert_eq!(
            alert.raised_at(),
            Some(at(10)),
            "a reminder keeps when it was raised"
        );
        assert_eq!(alert.observe(false, at(80), remind), Some(Change::Cleared));
        assert!(!alert.is_raised());
        assert_eq!(alert.observe(false, at(90), remind), None, "cleared once");
    }
}
