//! [`Verdict`]: what a handler decided about its message.

use std::time::Duration;

/// What the handler decided. The host acts on it; effects commit only on [`Verdict::Ack`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Done: commit this message's kv writes and outbox events, then ack the delivery.
    Ack,
    /// Transient failure: discard the effects and try again later, up to the route's limit.
    Retry {
        /// Wait at least this long before the next attempt; the route's backoff when `None`.
        delay: Option<Duration>,
        /// Why, for logs and for the dead-letter reason if retries run out.
        reason: String,
    },
    /// Permanent failure: discard the effects and move the message to the dead-letter queue.
    DeadLetter {
        /// Why, stored with the dead letter.
        reason: String,
    },
}

impl Verdict {
    /// Retry with the route's backoff.
    pub fn retry(reason: impl Into<String>) -> Self {
        Self::Retry {
            delay: None,
            reason: reason.into(),
        }
    }

    /// Retry after at least `delay` (the host picks the nearest configured backoff tier).
    pub fn retry_after(delay: Duration, reason: impl Into<String>) -> Self {
        Self::Retry {
            delay: Some(delay),
            reason: reason.into(),
        }
    }

    /// Dead-letter the message with a reason.
    pub fn dead_letter(reason: impl Into<String>) -> Self {
        Self::DeadLetter {
            reason: reason.into(),
        }
    }

    /// True for [`Verdict::Ack`].
    pub fn is_ack(&self) -> bool {
        matches!(self, Self::Ack)
    }

    /// True for [`Verdict::Retry`].
    pub fn is_retry(&self) -> bool {
        matches!(self, Self::Retry { .. })
    }

    /// True for [`Verdict::DeadLetter`].
    pub fn is_dead_letter(&self) -> bool {
        matches!(self, Self::DeadLetter { .. })
    }

    /// The reason of a retry or dead-letter verdict; `None` for ack.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Ack => None,
            Self::Retry { reason, .. } | Self::DeadLetter { reason } => Some(reason),
        }
    }
}

/// Lets a helper returning `Result<Verdict, E>` (or `Result<(), E>`, via
/// [`Verdict::from_result`]) feed a handler, with `?` on SDK errors inside it.
impl<E: Into<Verdict>> From<Result<Verdict, E>> for Verdict {
    fn from(result: Result<Verdict, E>) -> Self {
        result.unwrap_or_else(Into::into)
    }
}

impl Verdict {
    /// `Ok(())` becomes [`Verdict::Ack`], `Err(e)` becomes `e.into()`.
    ///
    /// ```
    /// use carteiro_sdk::{kv, Message, Verdict};
    ///
    /// fn handle(msg: Message) -> Verdict {
    ///     Verdict::from_result(process(&msg))
    /// }
    ///
    /// fn process(msg: &Message) -> Result<(), Verdict> {
    ///     let n = kv::incr("runs", 1)?; // KvError -> Verdict (unavailable => retry)
    ///     if n > 1_000 {
    ///         return Err(Verdict::dead_letter("too many runs"));
    ///     }
    ///     Ok(())
    /// }
    /// # assert!(handle(Message::default()).is_ack());
    /// ```
    pub fn from_result<E: Into<Verdict>>(result: Result<(), E>) -> Self {
        match result {
            Ok(()) => Self::Ack,
            Err(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors() {
        assert_eq!(
            Verdict::retry_after(Duration::from_secs(2), "later"),
            Verdict::Retry {
                delay: Some(Duration::from_secs(2)),
                reason: "later".into()
            }
        );
        assert_eq!(Verdict::dead_letter("bad").reason(), Some("bad"));
        assert!(Verdict::retry("x").is_retry());
        assert_eq!(Verdict::Ack.reason(), None);
    }
}
