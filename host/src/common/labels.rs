//! What Carteiro counts deliveries by, as enums: how a delivery ended ([`Outcome`]), why it
//! failed ([`FailureKind`]) and the class of a retry or dead letter ([`ReasonClass`]); and
//! the tables retention purges ([`RetentionTable`]). Each becomes text only where it leaves
//! the process: a metric label (they encode themselves), a span attribute, the
//! `x-carteiro-failure` header of a copy.

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use std::fmt::{self, Write};

/// `Display` and the metric label value of a type with a `label()`: that text.
macro_rules! label_text {
    ($name:ident) => {
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.label())
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
                encoder.write_str(self.label())
            }
        }
    };
}

/// Text for each variant, and the same text as a metric label value and in `Display`.
macro_rules! labelled {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The text of this label (metrics, spans, headers).
            pub fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        label_text!($name);
    };
}

/// How a delivery ended: `outcome` of `carteiro_deliveries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Effects committed, then acked.
    Acked,
    /// Already processed (inbox record found): acked without running the handler.
    Duplicate,
    /// Handed to a retry tier (confirmed), then acked.
    Retried,
    /// Handed to the dead-letter exchange (confirmed), then acked.
    DeadLettered,
    /// Given back to the broker: nothing durable happened.
    Requeued,
    /// Archived straight into the store because no copy of it could be published.
    Archived,
}

labelled!(Outcome {
    Acked => "acked",
    Duplicate => "duplicate",
    Retried => "retried",
    DeadLettered => "dead_lettered",
    Requeued => "requeued",
    Archived => "archived",
});

/// Why a delivery failed: the `x-carteiro-failure` header of its copy, the span's
/// `error.type`, and `kind` of `carteiro_plugin_failures_total` for the plugin's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The handler's `retry` verdict.
    Retry,
    /// The handler's `dead-letter` verdict.
    DeadLetter,
    /// The plugin trapped.
    Trap,
    /// The plugin ran past its timeout.
    Timeout,
    /// The plugin hit its memory cap.
    Memory,
    /// The plugin made too many host calls.
    HostCallLimit,
    /// The plugin went past a per-delivery total (kv bytes, events, logs).
    ResourceLimit,
    /// The plugin could not be instantiated.
    Instantiate,
    /// Refused before the handler ran (a guard), or the store refused its effects.
    Rejected,
    /// The route's idempotency key was missing.
    MissingKey,
    /// The gateway panicked processing it twice.
    Panic,
    /// A copy Carteiro could not publish at all (past AMQP's limits): archived directly.
    Unpublishable,
}

labelled!(FailureKind {
    Retry => "retry",
    DeadLetter => "dead-letter",
    Trap => "trap",
    Timeout => "timeout",
    Memory => "memory",
    HostCallLimit => "host-call-limit",
    ResourceLimit => "resource-limit",
    Instantiate => "instantiate",
    Rejected => "rejected",
    MissingKey => "missing-key",
    Panic => "panic",
    Unpublishable => "unpublishable",
});

impl FailureKind {
    /// The kinds of `carteiro_plugin_failures_total`: the plugin's own classified failures.
    pub const PLUGIN: &'static [FailureKind] = &[
        FailureKind::Trap,
        FailureKind::Timeout,
        FailureKind::Memory,
        FailureKind::HostCallLimit,
        FailureKind::ResourceLimit,
        FailureKind::Instantiate,
    ];

    /// The reason class of a retry or dead letter for this kind: the handler's own verdicts
    /// are [`ReasonClass::Handler`]; every other kind is its own class.
    pub fn class(self) -> ReasonClass {
        match self {
            FailureKind::Retry | FailureKind::DeadLetter => ReasonClass::Handler,
            other => ReasonClass::Kind(other),
        }
    }
}

/// Why a delivery was retried or dead-lettered: `reason_class` of `carteiro_retries_total`
/// and `carteiro_dead_letters_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasonClass {
    /// The handler's own verdict.
    Handler,
    /// The attempt limit was reached.
    RetriesExhausted,
    /// A failure of this kind (never `retry` or `dead-letter`: those are `Handler`).
    Kind(FailureKind),
}

impl ReasonClass {
    /// Every class: the handler's, the attempt limit's, and each kind but the verdicts.
    pub fn all() -> impl Iterator<Item = ReasonClass> {
        let kinds = FailureKind::ALL
            .iter()
            .map(|&kind| kind.class())
            .filter(|class| *class != ReasonClass::Handler);
        [ReasonClass::Handler, ReasonClass::RetriesExhausted]
            .into_iter()
            .chain(kinds)
    }

    /// The text of this label; a kind's class reads as the kind.
    pub fn label(self) -> &'static str {
        match self {
            ReasonClass::Handler => "handler",
            ReasonClass::RetriesExhausted => "retries-exhausted",
            ReasonClass::Kind(kind) => kind.label(),
        }
    }
}

label_text!(ReasonClass);

/// A table retention purges (`housekeeping`): `table` of the `carteiro_retention_*` metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RetentionTable {
    /// Archived dead letters (`[dead_letters] retain`).
    DeadLetters,
    /// Published outbox rows (`[outbox] retain_published`).
    Outbox,
    /// Idempotency records (`[store] inbox_retention`).
    Inbox,
    /// kv delete tombstones (`housekeeping::KV_TOMBSTONE_RETENTION`).
    KvTombstones,
}

labelled!(RetentionTable {
    DeadLetters => "dead_letters",
    Outbox => "outbox",
    Inbox => "inbox",
    KvTombstones => "kv_tombstones",
});

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn labels_are_distinct_and_a_kind_keeps_its_text_as_a_class() {
        let classes: Vec<&str> = [ReasonClass::Handler, ReasonClass::RetriesExhausted]
            .into_iter()
            .chain(FailureKind::ALL.iter().map(|k| k.class()))
            .map(ReasonClass::label)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        for all in [
            Outcome::ALL.iter().map(|o| o.label()).collect::<Vec<_>>(),
            FailureKind::ALL.iter().map(|k| k.label()).collect(),
        ] {
            assert_eq!(
                all.iter().collect::<BTreeSet<_>>().len(),
                all.len(),
                "{all:?}"
            );
        }
        // Every kind but the handler's two verdicts is a class of its own, named alike.
        assert_eq!(classes.len(), 2 + FailureKind::ALL.len() - 2, "{classes:?}");
        for kind in FailureKind::ALL {
            match kind.class() {
                ReasonClass::Kind(k) => assert_eq!(k.class().label(), kind.label()),
                class => assert_eq!(class, ReasonClass::Handler, "{kind}"),
            }
        }
        assert_eq!(FailureKind::DeadLetter.class(), ReasonClass::Handler);
        assert_eq!(Outcome::DeadLettered.to_string(), "dead_lettered");
    }
}
