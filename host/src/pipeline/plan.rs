//! Deciding what to do with a delivery, as data: a pure function of the delivery's facts,
//! the route's policy and the handler's result. `apply` carries the plan out; nothing here
//! touches the broker, the store or the metrics, so every branch is unit-tested.

use super::config::{FailurePolicy, RetryConfig};
use crate::broker::outgoing::cap_reason;
pub use crate::common::labels::{FailureKind, Outcome, ReasonClass};
use crate::runtime::{PluginFailure, Verdict};
use crate::store::StoreError;
use std::time::Duration;

/// What to do next with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Commit the handler's effects with the inbox record, then ack.
    Commit,
    /// Publish a copy to the retry tier for `delay` with attempt + 1, then ack.
    Retry {
        delay: Duration,
        reason: String,
        /// The `reason_class` label of `carteiro_retries_total`.
        class: ReasonClass,
    },
    /// Publish a copy to the dead-letter exchange, then ack. `kind` goes into the copy's
    /// headers; `class` is the `reason_class` label of `carteiro_dead_letters_total`.
    DeadLetter {
        reason: String,
        kind: FailureKind,
        class: ReasonClass,
    },
    /// The store failed while the handler ran: wait for it, then process again.
    StoreTrouble(StoreError),
}

/// The plan after a handler run. `attempt` is this delivery's (trusted) attempt number.
pub fn after_handler(
    attempt: u32,
    retry: &RetryConfig,
    on_failure: FailurePolicy,
    result: &Result<(Verdict, Option<StoreError>), PluginFailure>,
) -> Plan {
    match result {
        Err(failure) => {
            let reason = failure.to_string();
            match on_failure {
                FailurePolicy::Retry => {
                    retry_or_exhaust(attempt, retry, None, &reason, failure.kind())
                }
                FailurePolicy::DeadLetter => dead_letter(reason, failure.kind()),
            }
        }
        Ok((_, Some(store_error))) => Plan::StoreTrouble(store_error.clone()),
        Ok((Verdict::Ack, None)) => Plan::Commit,
        Ok((Verdict::Retry(request), None)) => retry_or_exhaust(
            attempt,
            retry,
            request.delay_ms.map(Duration::from_millis),
            &request.reason,
            FailureKind::Retry,
        ),
        Ok((Verdict::DeadLetter(reason), None)) => {
            dead_letter(reason.clone(), FailureKind::DeadLetter)
        }
    }
}

/// A retry while attempts remain, otherwise a dead letter saying so.
pub fn retry_or_exhaust(
    attempt: u32,
    retry: &RetryConfig,
    requested: Option<Duration>,
    reason: &str,
    kind: FailureKind,
) -> Plan {
    if attempt >= retry.max_attempts {
        return Plan::DeadLetter {
            reason: cap_reason(&format!(
                "retries exhausted after {attempt} attempts: {reason}"
            )),
            kind,
            class: ReasonClass::RetriesExhausted,
        };
    }
    Plan::Retry {
        delay: requested.unwrap_or_else(|| retry.delay_after(attempt)),
        reason: cap_reason(reason),
        class: kind.class(),
    }
}

/// A dead letter with its reason capped.
pub fn dead_letter(reason: String, kind: FailureKind) -> Plan {
    Plan::DeadLetter {
        reason: cap_reason(&reason),
        kind,
        class: kind.class(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::outgoing::MAX_REASON_BYTES;
    use crate::runtime::RetryRequest;

    fn retry_config() -> RetryConfig {
        RetryConfig {
            max_attempts: 3,
            backoff: vec![Duration::from_secs(1), Duration::from_secs(5)],
        }
    }

    fn run(attempt: u32, policy: FailurePolicy, result: Result<Verdict, PluginFailure>) -> Plan {
        after_handler(attempt, &retry_config(), policy, &result.map(|v| (v, None)))
    }

    #[test]
    fn ack_commits_and_a_store_error_overrides_the_verdict() {
        assert_eq!(run(1, FailurePolicy::Retry, Ok(Verdict::Ack)), Plan::Commit);
        let plan = after_handler(
            1,
            &retry_config(),
            FailurePolicy::Retry,
            &Ok((
                Verdict::Ack,
                Some(StoreError::Unavailable("db down".into())),
            )),
        );
        assert_eq!(
            plan,
            Plan::StoreTrouble(StoreError::Unavailable("db down".into()))
        );
    }

    #[test]
    fn retries_follow_the_backoff_until_the_attempt_limit() {
        let retry = |reason: &str| {
            Verdict::Retry(RetryRequest {
                delay_ms: None,
                reason: reason.into(),
            })
        };
        assert_eq!(
            run(1, FailurePolicy::Retry, Ok(retry("busy"))),
            Plan::Retry {
                delay: Duration::from_secs(1),
                reason: "busy".into(),
                class: ReasonClass::Handler
            }
        );
        assert_eq!(
            run(2, FailurePolicy::Retry, Ok(retry("busy"))),
            Plan::Retry {
                delay: Duration::from_secs(5),
                reason: "busy".into(),
                class: ReasonClass::Handler
            }
        );
        assert_eq!(
            run(3, FailurePolicy::Retry, Ok(retry("busy"))),
            Plan::DeadLetter {
                reason: "retries exhausted after 3 attempts: busy".into(),
                kind: FailureKind::Retry,
                class: ReasonClass::RetriesExhausted
            }
        );
        let asked = Verdict::Retry(RetryRequest {
            delay_ms: Some(250),
            reason: "later".into(),
        });
        assert_eq!(
            run(1, FailurePolicy::Retry, Ok(asked)),
            Plan::Retry {
                delay: Duration::from_millis(250),
                reason: "later".into(),
                class: ReasonClass::Handler
            }
        );
    }

    #[test]
    fn plugin_failures_follow_the_route_policy() {
        let trap = PluginFailure::Trap("boom".into());
        assert!(matches!(
            run(1, FailurePolicy::Retry, Err(trap.clone())),
            Plan::Retry { .. }
        ));
        assert_eq!(
            run(3, FailurePolicy::Retry, Err(trap.clone())),
            Plan::DeadLetter {
                reason: "retries exhausted after 3 attempts: plugin trapped: boom".into(),
                kind: FailureKind::Trap,
                class: ReasonClass::RetriesExhausted
            }
        );
        assert_eq!(
            run(1, FailurePolicy::DeadLetter, Err(trap)),
            Plan::DeadLetter {
                reason: "plugin trapped: boom".into(),
                kind: FailureKind::Trap,
                class: ReasonClass::Kind(FailureKind::Trap)
            }
        );
    }

    #[test]
    fn reasons_are_capped() {
        let huge = "r".repeat(1 << 20);
        let Plan::DeadLetter { reason, kind, .. } =
            run(1, FailurePolicy::Retry, Ok(Verdict::DeadLetter(huge)))
        else {
            panic!("dead letter expected");
        };
        assert!(reason.len() <= MAX_REASON_BYTES);
        assert_eq!(kind, FailureKind::DeadLetter);
    }
}
