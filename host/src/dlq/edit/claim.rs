//! The claim an edited copy takes on its key before it is sent (`store::dead_letters::edit_claims`): the
//! route's inbox does not see a copy still waiting in the queue, so a second edit keeping the
//! key is refused until the first copy settles — applied by the route, dead-lettered again,
//! or [`SETTLE_MAX`] after it was sent.

use super::error::UnsettledCopy;
use super::{Dedup, EditError};
use crate::common::rfc3339;
use crate::store::{EditKeyClaim, HeldEditClaim, KeyTaken, Store};
use std::time::Duration;

/// How long an edited copy's key stays claimed when the copy neither commits nor comes back
/// as a dead letter: longer than a copy normally waits in a queue and its retry tiers; a copy
/// still unconsumed after that is no longer guarded.
pub const SETTLE_MAX: Duration = Duration::from_secs(60 * 60);

/// A key claimed for one edit's copy; released by [`KeyClaim::release`] if it is not sent.
pub(super) struct KeyClaim<'a> {
    store: &'a Store,
    route: &'a str,
    key: String,
    owner: &'a str,
}

impl<'a> KeyClaim<'a> {
    /// Claims `key` on `route` for the copy of dead letter `id` sent with `message_id`.
    pub(super) async fn take(
        store: &'a Store,
        route: &'a str,
        key: &str,
        id: i64,
        message_id: Option<&str>,
        owner: &'a str,
    ) -> Result<Result<KeyClaim<'a>, KeyTaken>, EditError> {
        let claim = EditKeyClaim {
            route,
            key,
            dead_letter_id: id,
            message_id,
            owner,
            lease_ms: i64::try_from(SETTLE_MAX.as_millis()).unwrap_or(i64::MAX),
        };
        Ok(store.edit_claim_key(&claim).await?.map(|()| KeyClaim {
            store,
            route,
            key: key.to_owned(),
            owner,
        }))
    }

    /// Best effort: an unreleased claim lapses on its own.
    pub(super) async fn release(self) {
        let _ = self
            .store
            .edit_release_key(self.route, &self.key, self.owner)
            .await;
    }
}

/// The refusal for a key another edit's copy holds.
pub(super) fn unsettled(route: &str, key: &str, dedup: &Dedup, held: &HeldEditClaim) -> EditError {
    let hint = if dedup.by_message_id() {
        "Wait until the first copy is processed, or ask for a new message id (`--new-id`, or \
         the console's checkbox) to send this one as a new message."
            .to_owned()
    } else {
        format!(
            "Wait until the first copy is processed, or change {} in the edit (a new message \
             id does not change this route's key).",
            dedup.describe()
        )
    };
    EditError::Unsettled(Box::new(UnsettledCopy {
        route: route.to_owned(),
        by: dedup.describe(),
        key: key.to_owned(),
        of: held.dead_letter_id,
        since: rfc3339(held.claimed_at),
        until: rfc3339(held.claimed_until),
        hint,
    }))
}
