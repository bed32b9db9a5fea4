//! Why an edit was refused or failed.

use crate::store::StoreError;

/// Why an edit was refused or failed. Every refusal says that nothing was sent.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// A header that cannot be edited, or a name AMQP cannot carry.
    #[error("header `{name}` cannot be edited: {why}; nothing was sent")]
    Header { name: String, why: String },
    /// The same header both set and unset.
    #[error("header `{name}` is both set and unset; nothing was sent")]
    SetAndUnset { name: String },
    /// A header to unset that the dead letter does not have.
    #[error("dead letter #{id} has no header `{name}` to unset; nothing was sent")]
    NoSuchHeader { id: i64, name: String },
    /// The edited body should be JSON and does not parse.
    #[error("the edited body is not valid JSON ({why}): {error}; nothing was sent")]
    InvalidJson {
        /// Why it must be JSON.
        why: String,
        /// The parser's message, with the line and column.
        error: String,
        line: usize,
        column: usize,
    },
    /// Nothing differs from the archived message.
    #[error(
        "nothing to send: the body and headers are as archived and no new message id was \
         asked for (to send the original as it is, replay it); nothing was sent"
    )]
    Unchanged,
    /// The dead letter's route is not in the config.
    #[error(
        "route `{route}` is not in the config, so how its inbox deduplicates cannot be \
         checked; nothing was sent"
    )]
    UnknownRoute { route: String },
    /// The copy has no idempotency key and the route dead-letters such messages.
    #[error(
        "the edited copy has no idempotency key on route `{route}` ({why}), and the route \
         dead-letters such messages; nothing was sent"
    )]
    MissingKey { route: String, why: String },
    /// The copy's key already committed on the route: it would be acked as a duplicate.
    #[error(
        "route `{route}` already applied a message with {by} `{key}` (its inbox keeps that \
         key), so this copy would be acked as a duplicate without running the handler; \
         nothing was sent. {hint}"
    )]
    AlreadyApplied {
        route: String,
        by: String,
        key: String,
        hint: String,
    },
    /// An earlier edit's copy with the same key has not settled: a second copy would be acked
    /// as its duplicate without running the handler.
    #[error("{0}")]
    Unsettled(Box<UnsettledCopy>),
    /// A replay or another edit holds the row right now.
    #[error(
        "dead letter #{id} is being replayed or edited by someone else right now; nothing was \
         sent (try again in a moment)"
    )]
    Busy { id: i64 },
    /// AMQP cannot carry the copy.
    #[error("the edited copy cannot be published: {0}; nothing was sent")]
    Unpublishable(String),
    /// The publish failed or no confirm came.
    #[error("the edited copy of dead letter #{id} was not sent to queue `{route}`: {why}")]
    NotSent { id: i64, route: String, why: String },
    /// The store failed before anything was sent.
    #[error("the store failed, nothing was sent: {0}")]
    Store(#[from] StoreError),
    /// Sent and confirmed, but the record of the edit did not reach the store.
    #[error(
        "the edited copy of dead letter #{id} was sent to queue `{route}` and confirmed, but \
         recording the edit failed: {source}; the dead letter does not show the edit (the \
         route's inbox keeps the copy's effects once)"
    )]
    Unrecorded {
        id: i64,
        route: String,
        #[source]
        source: StoreError,
    },
}

impl EditError {
    /// The edit itself is refused (the operator can change it), as opposed to the store or
    /// the broker failing.
    pub fn is_refusal(&self) -> bool {
        !matches!(
            self,
            EditError::Store(_) | EditError::NotSent { .. } | EditError::Unrecorded { .. }
        )
    }
}

/// The earlier edit's copy that holds a key, for the refusal.
#[derive(Debug)]
pub struct UnsettledCopy {
    pub(super) route: String,
    /// What the route's key is (`message id`, ...).
    pub(super) by: String,
    pub(super) key: String,
    /// The dead letter it is a copy of.
    pub(super) of: i64,
    /// When it was sent, and when its claim lapses.
    pub(super) since: String,
    pub(super) until: String,
    /// What to do.
    pub(super) hint: String,
}

impl std::fmt::Display for UnsettledCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            route,
            by,
            key,
            of,
            since,
            until,
            hint,
        } = self;
        write!(
            f,
            "an edited copy of dead letter #{of} with {by} `{key}` was sent to queue `{route}` \
             at {since} and has not settled yet (neither applied by the route nor \
             dead-lettered again): a second copy with that key would be acked as a duplicate \
             of it without running the handler, so nothing was sent. {hint} The first copy's \
             claim lapses at {until} at the latest."
        )
    }
}
