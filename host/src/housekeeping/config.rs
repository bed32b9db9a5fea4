//! `[outbox]` and `[dead_letters]`: how long published outbox rows and archived dead letters
//! are kept, and the checks that concern only them. (The deprecated `[relay] retention`, the
//! old name of `[outbox] retain_published`, is resolved across sections by `config`.)

use serde::Deserialize;
use std::time::Duration;

/// `[outbox]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// Published rows are deleted this long after their publish (default 1 day; read it
    /// through [`OutboxConfig::retain_published`]). Unpublished rows are never deleted.
    #[serde(default, with = "humantime_serde")]
    pub retain_published: Option<Duration>,
}

fn default_retain_published() -> Duration {
    Duration::from_secs(24 * 3600)
}

impl OutboxConfig {
    /// How long published rows are kept: `retain_published`, or its default.
    pub fn retain_published(&self) -> Duration {
        self.retain_published
            .unwrap_or_else(default_retain_published)
    }
}

/// `[dead_letters]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLettersConfig {
    /// Dead letters dead-lettered longer ago than this (`30d`) are deleted, as `expire`
    /// says which. Unset (the default): every dead letter is kept forever.
    #[serde(default, with = "humantime_serde")]
    pub retain: Option<Duration>,
    /// Which dead letters past `retain` are deleted: `"replayed"` (the default) or `"all"`.
    #[serde(default)]
    pub expire: Expire,
}

/// `[dead_letters] expire`: which dead letters past `retain` are deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expire {
    /// Only those replayed at least once (`replayed_at` set): a dead letter nobody acted on
    /// stays, however old.
    #[default]
    Replayed,
    /// Every one, replayed or not.
    All,
}

impl DeadLettersConfig {
    /// `Err((key, message))` with the key under `dead_letters`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.retain.is_some_and(|retain| retain.is_zero()) {
            return Err((
                "retain",
                "must be above zero; leave `retain` out to keep dead letters forever".into(),
            ));
        }
        Ok(())
    }
}
