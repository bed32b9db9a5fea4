//! A message's journey through its attempts, as the bounded JSON its retry and dead-letter
//! copies carry in `x-carteiro-journey` (sealed like every Carteiro header, so believed only
//! on a copy Carteiro made for the route).
//!
//! Why a header: the pipeline knows an attempt's verdict or failure when it hands the message
//! on (`pipeline::apply`), and a failed attempt publishes a copy anyway (to a retry tier or
//! the dead-letter exchange). Carrying the history on that copy costs no store write per
//! attempt, and the archiver stores it with the dead letter, among its headers. An acked
//! attempt records nothing, so the hot path stays one commit. Bounded: the newest
//! [`MAX_ATTEMPTS`] attempts, each reason cut to [`MAX_REASON_BYTES`], the whole value within
//! [`MAX_HEADER_BYTES`]; older attempts are dropped first and counted in `dropped`.

use serde::{Deserialize, Serialize};

/// Attempts kept per message (the newest).
pub const MAX_ATTEMPTS: usize = 32;
/// Longest reason kept per attempt, in bytes.
pub const MAX_REASON_BYTES: usize = 256;
/// Longest header value, in bytes: small beside AMQP's frame (128 KiB by default).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// One attempt that did not end in an ack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The attempt number (1: the first delivery).
    pub n: u32,
    /// When its verdict or failure was known (unix ms).
    pub at: i64,
    /// The plugin that handled it.
    pub plugin: String,
    /// The sha256 of the plugin's component: the version it ran on.
    pub sha256: String,
    /// The handler's verdict (`retry`, `dead-letter`) or the failure's kind (`trap`,
    /// `timeout`, `missing-key`, ...): the labels of `FailureKind`.
    pub outcome: String,
    /// Why (cut to [`MAX_REASON_BYTES`]).
    pub reason: String,
    /// The retry tier the message then waited in (`Q.retry.<delay>`); none when this attempt
    /// dead-lettered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// The trace id of the attempt's delivery span, when telemetry is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

/// The attempts a copy carries, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journey {
    /// Earlier attempts left out to keep it bounded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped: u32,
    /// The attempts kept, oldest first.
    #[serde(default)]
    pub attempts: Vec<Attempt>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Journey {
    /// The journey in a header's value; an absent or unreadable one is empty.
    pub fn parse(value: Option<&str>) -> Self {
        value
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default()
    }

    /// This journey with `attempt` added last, within the bounds.
    pub fn with(mut self, mut attempt: Attempt) -> Self {
        attempt.reason = cut(&attempt.reason, MAX_REASON_BYTES);
        self.attempts.push(attempt);
        while self.attempts.len() > MAX_ATTEMPTS
            || (self.attempts.len() > 1 && self.value().len() > MAX_HEADER_BYTES)
        {
            self.attempts.remove(0);
            self.dropped = self.dropped.saturating_add(1);
        }
        self
    }

    /// The header's value (JSON).
    pub fn value(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

/// The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
pub fn trace_id(traceparent: &str) -> Option<String> {
    let id = traceparent.split('-').nth(1)?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

/// `text` cut to at most `max` bytes at a character boundary, marked with `…`.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: u32, reason: &str) -> Attempt {
        Attempt {
            n,
            at: 1_000 + i64::from(n),
            plugin: "orders".into(),
            sha256: "ab".repeat(32),
            outcome: "retry".into(),
            reason: reason.into(),
            tier: Some("q.retry.1000ms".into()),
            trace: None,
        }
    }

    #[test]
    fn attempts_accumulate_and_read_back() {
        let one = Journey::parse(None).with(attempt(1, "busy"));
        let two = Journey::parse(Some(&one.value())).with(attempt(2, "still busy"));
        assert_eq!(two.attempts.len(), 2);
        assert_eq!(two.attempts[1].reason, "still busy");
        assert_eq!(two.dropped, 0);
        assert!(!two.value().contains("dropped"), "{}", two.value());
        assert!(!two.value().contains("trace"), "{}", two.value());
        assert_eq!(Journey::parse(Some("not json")), Journey::default());
    }

    #[test]
    fn it_stays_bounded() {
        let mut journey = Journey::default();
        for n in 1..=40 {
            journey = journey.with(attempt(n, &"é".repeat(1_000)));
        }
        assert!(journey.attempts.len() <= MAX_ATTEMPTS);
        assert_eq!(
            journey.attempts.last().map(|a| a.n),
            Some(40),
            "the newest kept"
        );
        assert_eq!(
            journey.dropped as usize + journey.attempts.len(),
            40,
            "every attempt counted"
        );
        assert!(journey.value().len() <= MAX_HEADER_BYTES);
        for a in &journey.attempts {
            assert!(a.reason.len() <= MAX_REASON_BYTES, "{}", a.reason.len());
            assert!(a.reason.ends_with('…'));
        }
    }

    #[test]
    fn trace_ids_come_from_traceparents() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            trace_id(tp).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(trace_id("garbage"), None);
        assert_eq!(trace_id("00-xyz-1-01"), None);
    }
}
