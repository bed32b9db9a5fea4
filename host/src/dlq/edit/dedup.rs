//! How a route deduplicates, as an edit sees it: the copy's key on the route, and whether
//! the route's inbox already applied it.

use super::{EditError, EditedCopy, replay_headers};
use crate::common::header_names::PROP_MESSAGE_ID;
use crate::config::Config;
use crate::pipeline::key::{self, MissingKey};
use crate::pipeline::{KeySource, MissingKeyPolicy};
use crate::store::{DeadLetter, Store};

/// How a route deduplicates (its `idempotency_key` and `on_missing_key`): what an edit checks
/// before it sends, and what the console says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dedup {
    /// Where the key comes from.
    pub source: KeySource,
    /// What the route does with a message without a key.
    pub on_missing: MissingKeyPolicy,
}

impl Dedup {
    /// Route `route`'s, from `config`; `None` when the config has no such route. A
    /// `[[dead_letter_queues]]` route's consumer is not Carteiro's: its copies are keyed by
    /// message id (so two edits cannot both send one) and never found in Carteiro's inbox.
    pub fn of(config: &Config, route: &str) -> Option<Self> {
        if config
            .dead_letter_queues
            .iter()
            .any(|q| q.route_name() == route)
        {
            return Some(Self {
                source: KeySource::MessageId,
                on_missing: MissingKeyPolicy::Process,
            });
        }
        let r = config.routes.iter().find(|r| r.queue == route)?;
        Some(Self {
            source: KeySource::parse(&r.idempotency_key).ok()?,
            on_missing: r.on_missing_key,
        })
    }

    /// What the key is, for people: `message id`, `header `x-id``, ...
    pub fn describe(&self) -> String {
        match &self.source {
            KeySource::MessageId => "message id".to_owned(),
            KeySource::Header(name) => format!("header `{name}`"),
            KeySource::JsonPointer(pointer) => format!("JSON pointer `{pointer}` of the body"),
        }
    }

    /// A new message id gives a copy a new key.
    pub fn by_message_id(&self) -> bool {
        self.source == KeySource::MessageId
    }

    /// The key a message with these properties has on the route, or why it has none.
    pub fn key(
        &self,
        message_id: Option<&str>,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<String, MissingKey> {
        key::extract(&self.source, message_id, headers, body)
    }

    /// The key a replay of `d` (the archived message) has on its route.
    pub fn key_of(&self, d: &DeadLetter) -> Result<String, MissingKey> {
        let message_id = d.header(PROP_MESSAGE_ID);
        self.key(message_id, &replay_headers(d), &d.letter.body)
    }

    /// Checks `copy` against `route`'s inbox; its key (`None`: it has none, and the route
    /// processes such messages without deduplication).
    pub(super) async fn check(
        &self,
        store: &Store,
        route: &str,
        copy: &EditedCopy,
    ) -> Result<Option<String>, EditError> {
        let key = match self.key(copy.message_id.as_deref(), &copy.headers, &copy.body) {
            Ok(key) => key,
            Err(why) => {
                return match self.on_missing {
                    MissingKeyPolicy::Process => Ok(None),
                    MissingKeyPolicy::DeadLetter => Err(EditError::MissingKey {
                        route: route.to_owned(),
                        why: why.to_string(),
                    }),
                };
            }
        };
        if !store.inbox_contains(route, &key).await? {
            return Ok(Some(key));
        }
        Err(self.already_applied(route, &key))
    }

    /// The refusal for a copy whose key `route` already applied.
    pub(super) fn already_applied(&self, route: &str, key: &str) -> EditError {
        let hint = if self.by_message_id() {
            "Ask for a new message id (`--new-id`, or the console's checkbox) to have it \
             processed as a new message."
        } else {
            "A new message id does not change this route's key: change the key's value in the \
             edit to have it processed as a new message."
        };
        EditError::AlreadyApplied {
            route: route.to_owned(),
            by: self.describe(),
            key: key.to_owned(),
            hint: hint.to_owned(),
        }
    }
}
