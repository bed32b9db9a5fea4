//! The claim an edited copy holds on its idempotency key until it settles (migration 0012).
//! The route's inbox knows a key only once a copy carrying it committed; while the copy waits
//! in the queue (or its retry tiers), a second edit keeping the key would pass the inbox check
//! and be sent too, and the route would then ack one of them as a duplicate without running
//! its handler. So an edit claims (route, key) before it publishes, and a claim stops holding
//! once its copy settles:
//! - the route applied the key (its inbox has it): the claim is dropped and the edit refused,
//!   in the claim's own transaction, since the inbox check before it can be stale by then (a
//!   first copy applied while a second edit waited for its turn);
//! - the copy came back as a dead letter of its own (`replay_of` the edited one, the same
//!   message id): archiving it deletes the claim ([`settle`]), so it may be edited again;
//! - or its time ran out (`claimed_until`, the database's clock): a copy that sits unconsumed
//!   longer is no longer guarded.

use sqlx::{AnyConnection, AssertSqlSafe};

use crate::store::{Store, StoreError, nul_free};

/// What an edit asks to claim.
pub struct EditKeyClaim<'a> {
    pub route: &'a str,
    pub key: &'a str,
    /// The dead letter edited.
    pub dead_letter_id: i64,
    /// The copy's message id.
    pub message_id: Option<&'a str>,
    pub owner: &'a str,
    pub lease_ms: i64,
}

/// Why a key could not be claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyTaken {
    /// Another edit's copy holds it and has not settled.
    Held(HeldEditClaim),
    /// The route has applied the key: a copy would be acked as a duplicate.
    Applied,
}

/// A live claim of another edit's copy.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct HeldEditClaim {
    /// The dead letter whose edited copy holds the key.
    pub dead_letter_id: i64,
    /// When it was claimed and when it lapses (unix ms, the database's clock).
    pub claimed_at: i64,
    pub claimed_until: i64,
}

impl Store {
    /// Claims `claim.key` on `claim.route` for an edited copy, unless a live claim of another
    /// copy holds it or the route has applied the key. Lapsed claims are dropped first, and
    /// this key's when the route has applied it. One transaction.
    pub async fn edit_claim_key(
        &self,
        claim: &EditKeyClaim<'_>,
    ) -> Result<Result<(), KeyTaken>, StoreError> {
        self.bounded("edit key claim", async {
            nul_free::text("route", claim.route)?;
            nul_free::text("inbox key", claim.key)?;
            nul_free::text("message id", claim.message_id.unwrap_or(""))?;
            let clock = self.dialect().clock_ms();
            let mut tx = self.begin_write().await?;
            sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM dead_letter_edit_claims WHERE claimed_until < {clock} \
                 OR (route = $1 AND key = $2 AND EXISTS \
                 (SELECT 1 FROM inbox WHERE inbox.route = $1 AND inbox.key = $2))"
            )))
            .bind(claim.route)
            .bind(claim.key)
            .execute(&mut *tx)
            .await?;
            let applied = sqlx::query("SELECT 1 FROM inbox WHERE route = $1 AND key = $2")
                .bind(claim.route)
                .bind(claim.key)
                .fetch_optional(&mut *tx)
                .await?;
            if applied.is_some() {
                tx.commit().await?;
                return Ok(Err(KeyTaken::Applied));
            }
            let inserted = sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO dead_letter_edit_claims (route, key, dead_letter_id, message_id, \
                 claimed_by, claimed_at, claimed_until) \
                 VALUES ($1, $2, $3, $4, $5, {clock}, {clock} + $6) \
                 ON CONFLICT (route, key) DO NOTHING"
            )))
            .bind(claim.route)
            .bind(claim.key)
            .bind(claim.dead_letter_id)
            .bind(claim.message_id)
            .bind(claim.owner)
            .bind(claim.lease_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            let held = match inserted {
                1 => None,
                _ => Some(
                    sqlx::query_as::<_, HeldEditClaim>(
                        "SELECT dead_letter_id, claimed_at, claimed_until \
                         FROM dead_letter_edit_claims WHERE route = $1 AND key = $2",
                    )
                    .bind(claim.route)
                    .bind(claim.key)
                    .fetch_one(&mut *tx)
                    .await?,
                ),
            };
            tx.commit().await?;
            Ok(held.map_or(Ok(()), |held| Err(KeyTaken::Held(held))))
        })
        .await
    }

    /// Gives up `owner`'s claim of `key` on `route` (its copy was not sent).
    pub async fn edit_release_key(
        &self,
        route: &str,
        key: &str,
        owner: &str,
    ) -> Result<(), StoreError> {
        self.bounded("edit key release", async {
            let release = sqlx::query(
                "DELETE FROM dead_letter_edit_claims \
                 WHERE route = $1 AND key = $2 AND claimed_by = $3",
            )
            .bind(route)
            .bind(key)
            .bind(owner);
            self.execute_write(release).await?;
            Ok(())
        })
        .await
    }
}

/// In the transaction that archives a dead letter of `route` that is a copy of dead letter
/// `replay_of` with `message_id`: that copy settled, so its edit's claim ends.
pub(super) async fn settle(
    conn: &mut AnyConnection,
    replay_of: i64,
    route: &str,
    message_id: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "DELETE FROM dead_letter_edit_claims WHERE dead_letter_id = $1 AND route = $2 \
         AND COALESCE(message_id, '') = COALESCE($3, '')",
    )
    .bind(replay_of)
    .bind(route)
    .bind(message_id)
    .execute(conn)
    .await?;
    Ok(())
}
