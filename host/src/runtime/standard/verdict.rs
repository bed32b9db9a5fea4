//! What a wasi:messaging component's answer means for the delivery: the one place the
//! standard's `result<_, error>` becomes a Carteiro verdict.

use crate::runtime::bindings::types::{RetryRequest, Verdict};
use serde::Deserialize;

/// The `error` a standard component returned from `incoming-handler.handle`, in host terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StandardError {
    /// The operation timed out.
    Timeout,
    /// A connection failed.
    Connection(String),
    /// Not allowed.
    PermissionDenied(String),
    /// Anything else.
    Other(String),
}

impl StandardError {
    /// Timeouts and connection failures pass: they are always retried.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Timeout | Self::Connection(_))
    }

    /// The reason recorded with the retry or the dead letter.
    pub fn reason(&self) -> String {
        match self {
            Self::Timeout => "wasi:messaging error: timeout".to_owned(),
            Self::Connection(why) => format!("wasi:messaging error: connection: {why}"),
            Self::PermissionDenied(why) => {
                format!("wasi:messaging error: permission-denied: {why}")
            }
            Self::Other(why) => format!("wasi:messaging error: other: {why}"),
        }
    }
}

/// A route's `standard_errors`: what `permission-denied` and `other` from a wasi:messaging
/// component become (`timeout` and `connection` are always retried).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StandardErrorPolicy {
    /// Retry with the route's backoff; dead-letter once attempts are exhausted.
    #[default]
    Retry,
    /// Dead-letter at once.
    DeadLetter,
}

/// The verdict of a standard component's answer under a route's policy: `ok` acks,
/// `timeout` and `connection` retry, `permission-denied` and `other` retry or dead-letter as
/// the policy says. A retry takes the route's backoff (the standard has no delay).
pub fn verdict(answer: &Result<(), StandardError>, policy: StandardErrorPolicy) -> Verdict {
    match answer {
        Ok(()) => Verdict::Ack,
        Err(error) if error.is_transient() || policy == StandardErrorPolicy::Retry => {
            Verdict::Retry(RetryRequest {
                delay_ms: None,
                reason: error.reason(),
            })
        }
        Err(error) => Verdict::DeadLetter(error.reason()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdict as text (the generated `Verdict` has no `PartialEq`).
    fn shown(answer: Result<(), StandardError>, policy: StandardErrorPolicy) -> String {
        match verdict(&answer, policy) {
            Verdict::Ack => "ack".to_owned(),
            Verdict::Retry(r) => format!("retry({:?}) {}", r.delay_ms, r.reason),
            Verdict::DeadLetter(reason) => format!("dead-letter {reason}"),
        }
    }

    const BOTH: [StandardErrorPolicy; 2] =
        [StandardErrorPolicy::Retry, StandardErrorPolicy::DeadLetter];

    #[test]
    fn ok_acks_under_either_policy() {
        for policy in BOTH {
            assert_eq!(shown(Ok(()), policy), "ack");
        }
    }

    #[test]
    fn timeout_and_connection_retry_with_the_route_backoff_under_either_policy() {
        for policy in BOTH {
            assert_eq!(
                shown(Err(StandardError::Timeout), policy),
                "retry(None) wasi:messaging error: timeout"
            );
            assert_eq!(
                shown(Err(StandardError::Connection("broker gone".into())), policy),
                "retry(None) wasi:messaging error: connection: broker gone"
            );
        }
    }

    #[test]
    fn permission_denied_and_other_follow_the_policy() {
        let denied = || Err(StandardError::PermissionDenied("no".into()));
        let other = || Err(StandardError::Other("bad input".into()));
        // The same reason under either policy: retried, or dead-lettered at once.
        for (policy, outcome) in [
            (StandardErrorPolicy::Retry, "retry(None)"),
            (StandardErrorPolicy::DeadLetter, "dead-letter"),
        ] {
            assert_eq!(
                shown(denied(), policy),
                format!("{outcome} wasi:messaging error: permission-denied: no")
            );
            assert_eq!(
                shown(other(), policy),
                format!("{outcome} wasi:messaging error: other: bad input")
            );
        }
    }

    #[test]
    fn the_default_policy_is_retry_and_the_config_names_parse() {
        #[derive(Deserialize)]
        struct T {
            p: StandardErrorPolicy,
        }
        assert_eq!(StandardErrorPolicy::default(), StandardErrorPolicy::Retry);
        let parse = |s: &str| toml::from_str::<T>(&format!("p = \"{s}\"")).map(|t| t.p);
        assert_eq!(parse("retry").ok(), Some(StandardErrorPolicy::Retry));
        assert_eq!(
            parse("dead-letter").ok(),
            Some(StandardErrorPolicy::DeadLetter)
        );
        assert!(parse("drop").is_err());
    }
}
