//! Edit and retry: an operator changes a dead letter's body or its own headers and sends the
//! edited copy to the route's queue — only the edited copy, never the original as well.
//!
//! - [`prepare`] checks the edit and builds the copy. Carteiro's own headers
//!   (`x-carteiro-*`), the AMQP properties the archive keeps as pseudo-headers
//!   (`:message-id`, ...) and the broker's records (`x-death`, ...) cannot be set or unset.
//!   An edited JSON body (content type `application/json` or `*+json`, or an archived body
//!   that parsed as JSON) must parse, else the answer is the parse error with its line and
//!   column. An edit that changes nothing is refused (that is a replay). The copy keeps the
//!   archived message id unless a new one is asked for.
//! - [`EditContext::send`] first asks the route's inbox ([`Dedup`]): a copy whose idempotency
//!   key already committed would be acked as a duplicate without running the handler, so it
//!   is refused (a new message id helps when the route deduplicates by message id). Then it
//!   takes the row's replay claim (migration 0006: a replay running at the same time skips the
//!   row, and an edit never takes a row a replay holds) and the claim of the copy's key
//!   (`claim`: the inbox cannot see an earlier edit's copy still in the queue, so a second copy
//!   with the same key waits until the first settles), publishes the copy (sealed, with a
//!   publisher confirm) and records the edit in one transaction: the row counts as replayed
//!   and edited — no later replay sends its original — and its history keeps who edited it,
//!   when, what changed and the body sent. The archived original is never rewritten.
//!
//! Layout: `dedup` ([`Dedup`], the route's key and inbox check), `claim` (the key claim),
//! `error` ([`EditError`]).

mod claim;
mod dedup;
mod error;

use claim::KeyClaim;

pub use claim::SETTLE_MAX;
pub use dedup::Dedup;
pub use error::EditError;

use super::{claim_lease, is_failure_header};
use crate::broker::outgoing::{MAX_SHORT_STRING, is_broker_record, replay_properties};
use crate::broker::seal::{PREFIX, SealKey};
use crate::broker::{ConfirmedPublisher, Outgoing};
use crate::common::header_names::{PROP_CONTENT_TYPE, PROP_CORRELATION_ID, PROP_MESSAGE_ID};
use crate::common::retry;
use crate::store::{DeadLetter, KeyTaken, Store, StoreError};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What an operator asks to change.
#[derive(Debug, Clone, Default)]
pub struct EditRequest {
    /// The new body; `None` keeps the archived one.
    pub body: Option<Vec<u8>>,
    /// Headers to set (added, or replacing the archived value), in order.
    pub set: Vec<(String, String)>,
    /// Headers to remove.
    pub unset: Vec<String>,
    /// Send the copy with a new message id (a UUIDv7) instead of the archived one.
    pub new_id: bool,
}

/// What an edit changed: kept in the dead letter's history, shown on its page.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Changes {
    /// The body sent differs from the archived one.
    pub body_changed: bool,
    /// The archived body's size in bytes.
    pub body_bytes_before: usize,
    /// The sent body's size in bytes.
    pub body_bytes_after: usize,
    /// Headers set (new, or with another value), in order.
    pub set: Vec<(String, String)>,
    /// Headers removed.
    pub unset: Vec<String>,
    /// The message id the copy was sent with.
    pub message_id: Option<String>,
    /// A new message id was chosen.
    pub new_id: bool,
    /// The archived message id.
    pub previous_message_id: Option<String>,
    /// The copy's idempotency key on its route (when it has one).
    pub key: Option<String>,
}

impl Changes {
    /// From a history entry's `detail` (an unreadable one is empty).
    pub fn from_detail(detail: &serde_json::Value) -> Self {
        serde_json::from_value(detail.clone()).unwrap_or_default()
    }

    /// One line for people: `body changed (120 → 134 bytes); set x-a; unset x-b; new id ..`.
    pub fn summary(&self) -> String {
        let mut parts = vec![if self.body_changed {
            format!(
                "body changed ({} → {} bytes)",
                self.body_bytes_before, self.body_bytes_after
            )
        } else {
            format!("body unchanged ({} bytes)", self.body_bytes_after)
        }];
        for (name, value) in &self.set {
            parts.push(format!("set {name} = {value:?}"));
        }
        for name in &self.unset {
            parts.push(format!("unset {name}"));
        }
        match (&self.message_id, self.new_id) {
            (Some(id), true) => parts.push(format!("new message id {id}")),
            (Some(id), false) => parts.push(format!("message id {id} kept")),
            (None, _) => parts.push("no message id".to_owned()),
        }
        parts.join("; ")
    }
}

/// The copy an edit sends, checked by [`prepare`].
#[derive(Debug, Clone)]
pub struct EditedCopy {
    /// Its headers (the archive's pseudo-headers are properties again, below).
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: Vec<u8>,
    /// Its AMQP message id.
    pub message_id: Option<String>,
    /// The archived content type.
    pub content_type: Option<String>,
    /// The archived correlation id.
    pub correlation_id: Option<String>,
    /// What differs from the archived message.
    pub changes: Changes,
}

/// The headers a replay or an edited copy of `d` starts from: the archived ones without the
/// failure story and without the pseudo-headers.
pub fn replay_headers(d: &DeadLetter) -> Vec<(String, String)> {
    d.letter
        .headers
        .iter()
        .filter(|(name, _)| !is_failure_header(name))
        .cloned()
        .collect()
}

/// The headers of `d` an operator may edit: [`replay_headers`] without Carteiro's own (the
/// original exchange and routing key a copy keeps).
pub fn editable_headers(d: &DeadLetter) -> Vec<(String, String)> {
    replay_headers(d)
        .into_iter()
        .filter(|(name, _)| !name.to_ascii_lowercase().starts_with(PREFIX))
        .collect()
}

/// The set and unset that turn the editable headers of `d` into `wanted` (every header the
/// copy should carry besides Carteiro's own, as a form lists them).
pub fn header_changes(
    d: &DeadLetter,
    wanted: &[(String, String)],
) -> (Vec<(String, String)>, Vec<String>) {
    let now = editable_headers(d);
    let set = wanted
        .iter()
        .filter(|pair| !now.contains(pair))
        .cloned()
        .collect();
    let unset = now
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !wanted.iter().any(|(n, _)| n == name))
        .collect();
    (set, unset)
}

/// `application/json`, or a structured `*+json` type (parameters ignored).
fn is_json_content_type(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || media.ends_with("+json")
}

fn parses_as_json(body: &[u8]) -> bool {
    serde_json::from_slice::<IgnoredAny>(body).is_ok()
}

/// A header name an edit may set or unset.
fn check_name(name: &str) -> Result<(), EditError> {
    let refuse = |why: &str| -> Result<(), EditError> {
        Err(EditError::Header {
            name: name.to_owned(),
            why: why.to_owned(),
        })
    };
    if name.is_empty() {
        return refuse("a header needs a name");
    }
    if name.len() > MAX_SHORT_STRING {
        return refuse("AMQP header names hold at most 255 bytes");
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with(PREFIX) {
        return refuse(
            "it is one of Carteiro's own headers (x-carteiro-*), which only Carteiro sets \
             (attempts, reasons, the seal); edit the message's own headers",
        );
    }
    if name.starts_with(':') {
        return refuse(
            "it is an AMQP property the archive keeps as a pseudo-header; the copy keeps the \
             archived properties (ask for a new message id instead)",
        );
    }
    if is_broker_record(&lower) {
        return refuse(
            "it is the broker's own dead-letter record (x-death, x-first-death-*, \
             x-last-death-*), which no replay carries",
        );
    }
    Ok(())
}

/// Checks `request` against dead letter `d` and builds the copy it would send (see the
/// module doc). Nothing is sent.
pub fn prepare(d: &DeadLetter, request: EditRequest) -> Result<EditedCopy, EditError> {
    for name in request.set.iter().map(|(n, _)| n).chain(&request.unset) {
        check_name(name)?;
    }
    if let Some(name) = request
        .unset
        .iter()
        .find(|u| request.set.iter().any(|(n, _)| n == *u))
    {
        return Err(EditError::SetAndUnset { name: name.clone() });
    }
    let base = replay_headers(d);
    if let Some(name) = request
        .unset
        .iter()
        .find(|u| !base.iter().any(|(k, _)| k == *u))
    {
        return Err(EditError::NoSuchHeader {
            id: d.id,
            name: name.clone(),
        });
    }
    let mut headers: Vec<(String, String)> = base
        .into_iter()
        .filter(|(k, _)| !request.unset.contains(k))
        .collect();
    let mut set: Vec<(String, String)> = Vec::new();
    for (name, value) in &request.set {
        match headers.iter().position(|(k, _)| k == name) {
            Some(at) if headers[at].1 == *value => continue,
            Some(at) => headers[at].1.clone_from(value),
            None => headers.push((name.clone(), value.clone())),
        }
        set.retain(|(n, _)| n != name);
        set.push((name.clone(), value.clone()));
    }
    let archived_id = d.header(PROP_MESSAGE_ID).map(str::to_owned);
    let content_type = d.header(PROP_CONTENT_TYPE).map(str::to_owned);
    let before = &d.letter.body;
    let body = request.body.unwrap_or_else(|| before.clone());
    let body_changed = body != *before;
    if !body_changed && set.is_empty() && request.unset.is_empty() && !request.new_id {
        return Err(EditError::Unchanged);
    }
    let why_json = match &content_type {
        Some(ct) if is_json_content_type(ct) => Some(format!("its content type is `{ct}`")),
        _ if parses_as_json(before) => Some("the archived body was JSON".to_owned()),
        _ => None,
    };
    if body_changed
        && let Some(why) = why_json
        && let Err(e) = serde_json::from_slice::<IgnoredAny>(&body)
    {
        return Err(EditError::InvalidJson {
            why,
            error: e.to_string(),
            line: e.line(),
            column: e.column(),
        });
    }
    let message_id = if request.new_id {
        Some(uuid::Uuid::now_v7().to_string())
    } else {
        archived_id.clone()
    };
    let changes = Changes {
        body_changed,
        body_bytes_before: before.len(),
        body_bytes_after: body.len(),
        set,
        unset: request.unset,
        message_id: message_id.clone(),
        new_id: request.new_id,
        previous_message_id: archived_id,
        key: None,
    };
    Ok(EditedCopy {
        headers,
        body,
        message_id,
        content_type,
        correlation_id: d.header(PROP_CORRELATION_ID).map(str::to_owned),
        changes,
    })
}

/// What sending an edited copy needs.
pub struct EditContext<'a> {
    pub store: &'a Store,
    pub publisher: &'a ConfirmedPublisher,
    pub seal: &'a SealKey,
    pub publish_timeout: Duration,
}

impl EditContext<'_> {
    /// Sends `copy` (from [`prepare`] on `d`) to `d`'s route as `actor` (`cli`, or the
    /// console's user): the inbox check, the claim, the confirmed publish and the record of
    /// the edit (see the module doc). Returns what changed, the copy's key included.
    pub async fn send(
        &self,
        d: &DeadLetter,
        mut copy: EditedCopy,
        dedup: &Dedup,
        actor: &str,
    ) -> Result<Changes, EditError> {
        let route = &d.letter.route;
        copy.changes.key = dedup.check(self.store, route, &copy).await?;
        let properties = replay_properties(
            &copy.headers,
            copy.message_id.as_deref(),
            copy.content_type.as_deref(),
            copy.correlation_id.as_deref(),
        )
        .map_err(|e| EditError::Unpublishable(e.to_string()))?;
        // A route's copy is sealed, so the route believes the original exchange and routing
        // key it carries, and a dead letter it becomes again links back to `d`; a foreign
        // one goes back where it came from (`copy_of`).
        let (destination, properties) = super::copy_of(d, properties, &copy.body, self.seal, None);
        let owner = uuid::Uuid::now_v7().to_string();
        let key_claim = self.claim(d, &copy, dedup, &owner).await?;
        let published = self
            .publisher
            .publish(
                Outgoing {
                    exchange: destination.exchange,
                    routing_key: destination.routing_key,
                    properties,
                    body: copy.body.clone(),
                    mandatory: true,
                },
                self.publish_timeout,
            )
            .await;
        if let Err(e) = published {
            self.release(d.id, &owner, key_claim).await;
            return Err(EditError::NotSent {
                id: d.id,
                route: route.clone(),
                why: e.to_string(),
            });
        }
        self.record(d, copy, actor).await
    }

    /// Takes the row's claim, then the claim of the copy's key (if it has one) for `owner`.
    async fn claim<'s>(
        &'s self,
        d: &'s DeadLetter,
        copy: &EditedCopy,
        dedup: &Dedup,
        owner: &'s str,
    ) -> Result<Option<KeyClaim<'s>>, EditError> {
        let lease = claim_lease(self.publish_timeout);
        if !self
            .store
            .dead_letter_claim_edit(d.id, owner, lease)
            .await?
        {
            return Err(EditError::Busy { id: d.id });
        }
        let Some(key) = &copy.changes.key else {
            return Ok(None);
        };
        let route = d.letter.route.as_str();
        let message_id = copy.message_id.as_deref();
        let taken = KeyClaim::take(self.store, route, key, d.id, message_id, owner).await;
        match taken {
            Ok(Ok(claim)) => Ok(Some(claim)),
            Ok(Err(taken)) => {
                self.release(d.id, owner, None).await;
                Err(match taken {
                    KeyTaken::Held(held) => claim::unsettled(route, key, dedup, &held),
                    KeyTaken::Applied => dedup.already_applied(route, key),
                })
            }
            Err(e) => {
                self.release(d.id, owner, None).await;
                Err(e)
            }
        }
    }

    /// Best effort: gives up `owner`'s claims on row `id` and its key (a claim left behind
    /// lapses on its own).
    async fn release(&self, id: i64, owner: &str, key_claim: Option<KeyClaim<'_>>) {
        let _ = self.store.dead_letter_release_replay(Some(id), owner).await;
        if let Some(claim) = key_claim {
            claim.release().await;
        }
    }

    /// Records the edit of `d` whose `copy` was sent and confirmed (retrying a transient
    /// store failure a few times).
    async fn record(
        &self,
        d: &DeadLetter,
        copy: EditedCopy,
        actor: &str,
    ) -> Result<Changes, EditError> {
        let detail = serde_json::to_string(&copy.changes).unwrap_or_else(|_| "{}".to_owned());
        retry::retry_transient(
            retry::AFTER_CONFIRM,
            || {
                self.store
                    .dead_letter_mark_edited(d.id, actor, &detail, &copy.body)
            },
            StoreError::is_transient,
        )
        .await
        .map_err(|source| EditError::Unrecorded {
            id: d.id,
            route: d.letter.route.clone(),
            source,
        })?;
        Ok(copy.changes)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::pipeline::{KeySource, MissingKeyPolicy};

    fn letter(body: &[u8], content_type: Option<&str>) -> DeadLetter {
        let mut headers = vec![
            ("x-tenant".to_owned(), "acme".to_owned()),
            ("x-carteiro-reason".to_owned(), "boom".to_owned()),
            (
                "x-carteiro-original-exchange".to_owned(),
                "orders".to_owned(),
            ),
            ("x-death".to_owned(), "[]".to_owned()),
            (":message-id".to_owned(), "m-1".to_owned()),
        ];
        if let Some(ct) = content_type {
            headers.push((":content-type".to_owned(), ct.to_owned()));
        }
        DeadLetter::fixture(7, headers, body)
    }

    fn body(text: &str) -> EditRequest {
        EditRequest {
            body: Some(text.as_bytes().to_vec()),
            ..Default::default()
        }
    }

    #[test]
    fn an_edit_keeps_the_id_and_the_original_route_story() {
        let d = letter(br#"{"a":1}"#, Some("application/json"));
        let copy = prepare(
            &d,
            EditRequest {
                body: Some(br#"{"a":2}"#.to_vec()),
                set: vec![("x-fixed".into(), "yes".into())],
                unset: vec!["x-tenant".into()],
                new_id: false,
            },
        )
        .unwrap();
        assert_eq!(copy.message_id.as_deref(), Some("m-1"));
        assert_eq!(copy.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            copy.headers,
            vec![
                (
                    "x-carteiro-original-exchange".to_owned(),
                    "orders".to_owned()
                ),
                ("x-fixed".to_owned(), "yes".to_owned()),
            ]
        );
        let c = &copy.changes;
        assert!(c.body_changed);
        assert_eq!((c.body_bytes_before, c.body_bytes_after), (7, 7));
        assert_eq!(c.unset, ["x-tenant"]);
        assert_eq!(
            c.summary(),
            "body changed (7 → 7 bytes); set x-fixed = \"yes\"; unset x-tenant; message id \
             m-1 kept"
        );
        assert_eq!(Changes::from_detail(&serde_json::json!(c)), *c);
        let fresh = prepare(
            &d,
            EditRequest {
                new_id: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_ne!(fresh.message_id.as_deref(), Some("m-1"));
        assert_eq!(fresh.changes.previous_message_id.as_deref(), Some("m-1"));
    }

    #[test]
    fn carteiro_property_and_broker_headers_are_refused() {
        let d = letter(b"{}", None);
        for name in [
            "x-carteiro-attempt",
            "X-Carteiro-Seal",
            ":message-id",
            "x-death",
        ] {
            let set = EditRequest {
                set: vec![(name.into(), "1".into())],
                ..Default::default()
            };
            let err = prepare(&d, set).unwrap_err();
            assert!(matches!(err, EditError::Header { .. }), "{name}: {err}");
            assert!(err.to_string().contains("nothing was sent"), "{err}");
            assert!(err.is_refusal());
        }
        let err = prepare(
            &d,
            EditRequest {
                unset: vec!["x-carteiro-reason".into()],
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("Carteiro's own headers"), "{err}");
        let missing = EditRequest {
            unset: vec!["x-nope".into()],
            ..Default::default()
        };
        assert!(matches!(
            prepare(&d, missing).unwrap_err(),
            EditError::NoSuchHeader { .. }
        ));
    }

    #[test]
    fn json_bodies_must_stay_json() {
        let by_type = letter(b"not json at all", Some("application/vnd.acme+json"));
        let err = prepare(&by_type, body("{\"a\":")).unwrap_err();
        let EditError::InvalidJson { line, column, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(*line, 1);
        assert!(*column >= 4, "{column}");
        assert!(err.to_string().contains("line 1 column"), "{err}");
        assert!(err.to_string().contains("content type"), "{err}");
        let by_body = letter(b"[1, 2]", None);
        let err = prepare(&by_body, body("[1,\n 2")).unwrap_err();
        assert!(
            err.to_string().contains("the archived body was JSON"),
            "{err}"
        );
        assert!(err.to_string().contains("line 2"), "{err}");
        let text = letter(b"plain", Some("text/plain"));
        assert!(prepare(&text, body("{ still not json")).is_ok());
    }

    #[test]
    fn an_edit_must_change_something() {
        let d = letter(b"{}", None);
        assert!(matches!(
            prepare(&d, body("{}")).unwrap_err(),
            EditError::Unchanged
        ));
        let same_value = EditRequest {
            set: vec![("x-tenant".into(), "acme".into())],
            ..Default::default()
        };
        assert!(matches!(
            prepare(&d, same_value).unwrap_err(),
            EditError::Unchanged
        ));
    }

    #[test]
    fn form_rows_become_sets_and_unsets() {
        let d = letter(b"{}", None);
        assert_eq!(
            editable_headers(&d),
            vec![("x-tenant".to_owned(), "acme".to_owned())]
        );
        let (set, unset) = header_changes(&d, &[("x-new".into(), "1".into())]);
        assert_eq!(set, vec![("x-new".to_owned(), "1".to_owned())]);
        assert_eq!(unset, ["x-tenant"]);
        let (set, unset) = header_changes(&d, &[("x-tenant".into(), "acme".into())]);
        assert!(set.is_empty() && unset.is_empty());
    }

    #[test]
    fn the_key_of_a_copy_follows_the_route() {
        let d = letter(br#"{"order":{"id":42}}"#, None);
        let by_id = Dedup {
            source: KeySource::MessageId,
            on_missing: MissingKeyPolicy::DeadLetter,
        };
        assert_eq!(by_id.key_of(&d).unwrap(), "m-1");
        assert!(by_id.by_message_id());
        let by_body = Dedup {
            source: KeySource::JsonPointer("/order/id".into()),
            ..by_id.clone()
        };
        assert_eq!(by_body.key_of(&d).unwrap(), "42");
        assert_eq!(by_body.describe(), "JSON pointer `/order/id` of the body");
        let by_header = Dedup {
            source: KeySource::Header("x-tenant".into()),
            ..by_id
        };
        assert_eq!(by_header.key_of(&d).unwrap(), "acme");
    }
}
