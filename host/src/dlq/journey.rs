//! A message's journey, read back from the archive, oldest first:
//! - every attempt that did not end in an ack: when, on which plugin version (name and
//!   sha256), the verdict or failure kind with its reason, the retry tier it then waited in,
//!   the trace id when telemetry is on — from the `x-carteiro-journey` header its dead-letter
//!   copy carried (`common::journey`: no store write per attempt);
//! - the dead-lettering (reason, kind, attempts);
//! - each replay and each edit (`dead_letter_events`);
//! - the dead letters its replays became again (`replay_of`, followed both ways, at most
//!   [`MAX_CHAIN`] of them);
//! - the outcome: applied (the route's inbox holds the last copy's key), sent and not applied
//!   yet, or not replayed.

use super::edit::{Changes, Dedup};
use crate::common::header_names::{FAILURE_KIND, JOURNEY, PLUGIN_SHA256, PROP_MESSAGE_ID};
use crate::common::journey::{Attempt, Journey as Carried, MAX_ATTEMPTS};
use crate::common::rfc3339;
use crate::store::{DeadLetter, Store, StoreError};

/// Dead letters of one message followed back and forth from the one asked about.
pub const MAX_CHAIN: usize = 16;

/// One thing that happened to the message.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// When (unix ms).
    pub at: i64,
    /// The dead letter it belongs to.
    pub dead_letter: i64,
    /// What happened.
    pub what: What,
}

/// What happened in a [`Step`].
#[derive(Debug, Clone, PartialEq)]
pub enum What {
    /// An attempt that did not end in an ack.
    Attempt(Attempt),
    /// Earlier attempts the bounded header left out.
    Dropped(u32),
    /// Archived as a dead letter.
    DeadLettered {
        reason: String,
        /// `x-carteiro-failure` (none when the broker dead-lettered it).
        kind: Option<String>,
        attempts: i64,
        plugin: Option<String>,
        sha256: Option<String>,
    },
    /// Replayed as archived.
    Replayed,
    /// An edited copy was sent.
    Edited { actor: String, changes: Changes },
}

impl What {
    /// A short word for the kind of step (`attempt`, `dead-lettered`, `replayed`, `edited`).
    pub fn word(&self) -> &'static str {
        match self {
            What::Attempt(_) | What::Dropped(_) => "attempt",
            What::DeadLettered { .. } => "dead-lettered",
            What::Replayed => "replayed",
            What::Edited { .. } => "edited",
        }
    }

    /// The step for people, in one line.
    pub fn describe(&self) -> String {
        match self {
            What::Attempt(a) => {
                let then = match &a.tier {
                    Some(tier) => format!("waited in {tier}"),
                    None => "then dead-lettered".to_owned(),
                };
                let mut text = format!(
                    "attempt {}: {}: {} (plugin {}, sha256 {}); {then}",
                    a.n, a.outcome, a.reason, a.plugin, a.sha256
                );
                if let Some(trace) = &a.trace {
                    text.push_str("; trace ");
                    text.push_str(trace);
                }
                text
            }
            What::Dropped(n) => format!(
                "attempt …: {n} earlier attempts not kept (a message keeps its newest \
                 {MAX_ATTEMPTS})"
            ),
            What::DeadLettered {
                reason,
                kind,
                attempts,
                plugin,
                sha256,
            } => {
                let by = match (plugin, sha256) {
                    (Some(p), Some(sha)) => format!(", plugin {p}, sha256 {sha}"),
                    (Some(p), None) => format!(", plugin {p}"),
                    _ => String::new(),
                };
                let kind = kind.as_deref().unwrap_or("by the broker");
                format!("dead-lettered after {attempts} attempts ({kind}{by}): {reason}")
            }
            What::Replayed => "replayed as archived".to_owned(),
            What::Edited { actor, changes } => {
                format!("edited by {actor}, edited copy sent: {}", changes.summary())
            }
        }
    }
}

/// How the journey ends, so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// In the archive, never replayed or edited.
    NotReplayed,
    /// The last copy sent committed its effects: the route's inbox holds its key since `at`.
    Applied { key: String, at: i64 },
    /// A copy was sent and is not applied yet (in the queue or being retried), or its inbox
    /// record was purged after the retention; `key` is unknown when the route is not in the
    /// config or the copy has none.
    Sent { key: Option<String> },
}

impl Outcome {
    /// The outcome for people.
    pub fn describe(&self) -> String {
        match self {
            Outcome::NotReplayed => "in the dead-letter archive, not replayed".to_owned(),
            Outcome::Applied { key, at } => format!(
                "applied: the route's inbox holds key `{key}` since {}",
                rfc3339(*at)
            ),
            Outcome::Sent { key: Some(key) } => format!(
                "sent, not applied yet (in the queue or being retried, or its inbox record was \
                 purged after the retention); key `{key}`"
            ),
            Outcome::Sent { key: None } => {
                "sent; whether it was applied is unknown (no idempotency key to look up)".to_owned()
            }
        }
    }
}

/// A message's journey.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageJourney {
    /// The route.
    pub route: String,
    /// The archived message id.
    pub message_id: Option<String>,
    /// The message's dead letters, oldest first (each a replay of the one before).
    pub dead_letters: Vec<i64>,
    /// What happened, dead letter by dead letter, oldest first.
    pub steps: Vec<Step>,
    /// How it ends, so far.
    pub outcome: Outcome,
}

impl MessageJourney {
    /// The journey as lines of text (what `carteiro dlq show ID --journey` prints).
    pub fn lines(&self) -> Vec<String> {
        let ids: Vec<String> = self
            .dead_letters
            .iter()
            .map(|id| format!("#{id}"))
            .collect();
        let mut out = vec![format!(
            "journey of message {} on route {} (dead letters {})",
            self.message_id.as_deref().unwrap_or("(no message id)"),
            self.route,
            ids.join(", ")
        )];
        for step in &self.steps {
            out.push(format!(
                "{}  #{:<6} {}",
                rfc3339(step.at),
                step.dead_letter,
                step.what.describe()
            ));
        }
        out.push(format!("outcome: {}", self.outcome.describe()));
        out
    }
}

/// The journey of the message dead letter `id` belongs to; `None` when there is no such dead
/// letter. `dedup`: how its route deduplicates (to tell whether a replay was applied), when
/// the route is known.
pub async fn read(
    store: &Store,
    id: i64,
    dedup: Option<&Dedup>,
) -> Result<Option<MessageJourney>, StoreError> {
    let Some(asked) = store.dead_letter_get(id).await? else {
        return Ok(None);
    };
    let mut chain = vec![asked];
    // Back to the first dead letter (a replay's row is always newer than its source's)...
    while chain.len() < MAX_CHAIN {
        let Some(first) = chain.first() else { break };
        let Some(parent) = first.replay_of.filter(|p| *p < first.id) else {
            break;
        };
        match store.dead_letter_get(parent).await? {
            Some(p) => chain.insert(0, p),
            None => break,
        }
    }
    // ... and on to the newest dead letter its replays became.
    while chain.len() < MAX_CHAIN {
        let Some(last) = chain.last().map(|d| d.id) else {
            break;
        };
        let children = store.dead_letters_replaying(last).await?;
        match children.into_iter().rev().find(|c| c.id > last) {
            Some(child) => chain.push(child),
            None => break,
        }
    }
    // Dead letter by dead letter, in causal order: what its copy carried, its dead-lettering,
    // then its replays and edits (not sorted by time across dead letters: a replay's mark and
    // the first attempt of its copy are stamped by different clocks, close together).
    let mut steps = Vec::new();
    let mut last_events = Vec::new();
    for d in &chain {
        steps.extend(letter_steps(d));
        let events = store.dead_letter_events(d.id).await?;
        for e in &events {
            let what = if e.is_edit() {
                What::Edited {
                    actor: e.actor.clone().unwrap_or_default(),
                    changes: Changes::from_detail(&e.detail),
                }
            } else {
                What::Replayed
            };
            steps.push(Step {
                at: e.at,
                dead_letter: d.id,
                what,
            });
        }
        last_events = events;
    }
    let Some(last) = chain.last() else {
        return Ok(None);
    };
    let outcome = match last_events.last() {
        None => Outcome::NotReplayed,
        Some(event) => {
            let key = if event.is_edit() {
                Changes::from_detail(&event.detail).key
            } else {
                dedup.and_then(|dedup| dedup.key_of(last).ok())
            };
            let applied = match &key {
                Some(key) => store.inbox_processed_at(&last.letter.route, key).await?,
                None => None,
            };
            match (key, applied) {
                (Some(key), Some(at)) => Outcome::Applied { key, at },
                (key, _) => Outcome::Sent { key },
            }
        }
    };
    let first = chain.first().unwrap_or(last);
    Ok(Some(MessageJourney {
        route: first.letter.route.clone(),
        message_id: first.header(PROP_MESSAGE_ID).map(str::to_owned),
        dead_letters: chain.iter().map(|d| d.id).collect(),
        steps,
        outcome,
    }))
}

/// The attempts a dead letter's copy carried, then its dead-lettering.
fn letter_steps(d: &DeadLetter) -> Vec<Step> {
    let carried = Carried::parse(d.header(JOURNEY));
    let mut steps = Vec::new();
    if carried.dropped > 0 {
        let at = carried
            .attempts
            .first()
            .map_or(d.letter.dead_lettered_at, |a| a.at);
        steps.push(Step {
            at,
            dead_letter: d.id,
            what: What::Dropped(carried.dropped),
        });
    }
    for attempt in carried.attempts {
        steps.push(Step {
            at: attempt.at,
            dead_letter: d.id,
            what: What::Attempt(attempt),
        });
    }
    steps.push(Step {
        at: d.letter.dead_lettered_at,
        dead_letter: d.id,
        what: What::DeadLettered {
            reason: d.letter.reason.clone(),
            kind: d.header(FAILURE_KIND).map(str::to_owned),
            attempts: d.letter.attempts,
            plugin: d.letter.plugin.clone(),
            sha256: d.header(PLUGIN_SHA256).map(str::to_owned),
        },
    });
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_read_for_people() {
        let attempt = Attempt {
            n: 2,
            at: 5,
            plugin: "orders".into(),
            sha256: "ab12".into(),
            outcome: "trap".into(),
            reason: "plugin trapped: boom".into(),
            tier: Some("q.retry.1000ms".into()),
            trace: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        };
        assert_eq!(
            What::Attempt(attempt).describe(),
            "attempt 2: trap: plugin trapped: boom (plugin orders, sha256 ab12); waited in \
             q.retry.1000ms; trace 4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let dead = What::DeadLettered {
            reason: "retries exhausted after 3 attempts: busy".into(),
            kind: Some("retry".into()),
            attempts: 3,
            plugin: Some("orders".into()),
            sha256: None,
        };
        assert_eq!(
            dead.describe(),
            "dead-lettered after 3 attempts (retry, plugin orders): retries exhausted after 3 \
             attempts: busy"
        );
        assert_eq!(dead.word(), "dead-lettered");
        let journey = MessageJourney {
            route: "q".into(),
            message_id: Some("m-1".into()),
            dead_letters: vec![4, 9],
            steps: vec![Step {
                at: 0,
                dead_letter: 4,
                what: What::Replayed,
            }],
            outcome: Outcome::NotReplayed,
        };
        assert_eq!(
            journey.lines(),
            vec![
                "journey of message m-1 on route q (dead letters #4, #9)".to_owned(),
                "1970-01-01T00:00:00Z  #4      replayed as archived".to_owned(),
                "outcome: in the dead-letter archive, not replayed".to_owned(),
            ]
        );
    }
}
