//! Archiving a dead letter ([`Store::dead_letter_insert`]): its row, in the lossless
//! encoding of `text`, the fields it will be found by (`search`) and, for an edited copy
//! that came back, the end of its edit's claim (`edit_claims`), in one transaction.

use sqlx::AssertSqlSafe;

use super::text::{self, NewDeadLetter};
use super::{edit_claims, search};
use crate::common::header_names::{PROP_MESSAGE_ID, REPLAY_OF};
use crate::store::{Store, StoreError};

impl Store {
    /// Archives one dead letter; returns its id.
    ///
    /// Accepts any `NewDeadLetter`: its text is stored in the lossless encoding of
    /// `text`, so the row always fits the schema, and the only error is
    /// [`StoreError::Unavailable`]: the store is down, too slow, read-only, full, or does
    /// not have the schema Carteiro migrated (any refusal of an encoded row means that).
    /// The caller requeues and pauses; it never needs to park or drop the message.
    ///
    /// What it will be found by is worked out here, once (`search`): its message
    /// and correlation ids, and at most 64 fields of a JSON body, written in the same
    /// transaction (one more statement: the rows of `dead_letter_fields`).
    pub async fn dead_letter_insert(&self, dl: &NewDeadLetter) -> Result<i64, StoreError> {
        Ok(self.dead_letter_insert_once(dl, None).await?.0)
    }

    /// [`Store::dead_letter_insert`], once per `dedupe_key`: when a dead letter with that key
    /// is archived already (a redelivery after a crash between commit and ack), nothing is
    /// written and its id comes back with `false`. The store's unique index decides, so
    /// concurrent archivers cannot both write it. `None`: always a new row.
    pub async fn dead_letter_insert_once(
        &self,
        dl: &NewDeadLetter,
        dedupe_key: Option<&str>,
    ) -> Result<(i64, bool), StoreError> {
        let stored = text::encode(dl);
        let found_by = search::search_columns(dl);
        // A replay or edited copy names the dead letter it came from (a sealed header: the
        // archiver and the pipeline pass only trusted Carteiro headers on).
        let replay_of = dl
            .headers
            .iter()
            .find(|(name, _)| name == REPLAY_OF)
            .and_then(|(_, value)| value.trim().parse::<i64>().ok());
        let insert = "INSERT INTO dead_letters (route, queue, reason, plugin, attempts, headers, \
                      body, first_failed_at, dead_lettered_at, replay_count, original, replay_of, \
                      message_id, correlation_id, dedupe_key) \
                      VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10, $11, $12, $13, $14) \
                      ON CONFLICT (dedupe_key) DO NOTHING RETURNING id";
        let field_rows = search::fields_rows(&found_by.fields);
        let d = self.dialect;
        let fields = format!(
            "SELECT {}, {}, $2 FROM {}",
            d.json_item(0),
            d.json_item(1),
            d.json_array_rows(1)
        );
        let insert_fields =
            d.insert_or_ignore("dead_letter_fields (path, value, dead_letter_id)", &fields);
        self.bounded("dead letter insert", async {
            let mut tx = self.begin_write().await?;
            let inserted: Option<i64> = sqlx::query_scalar(insert)
                .bind(stored.route.as_str())
                .bind(stored.queue.as_str())
                .bind(stored.reason.as_str())
                .bind(stored.plugin.as_deref())
                .bind(dl.attempts)
                .bind(stored.headers.as_str())
                .bind(dl.body.as_slice())
                .bind(dl.first_failed_at)
                .bind(dl.dead_lettered_at)
                .bind(stored.original.as_deref())
                .bind(replay_of)
                .bind(found_by.message_id.as_deref())
                .bind(found_by.correlation_id.as_deref())
                .bind(dedupe_key)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(id) = inserted else {
                let known = "SELECT id FROM dead_letters WHERE dedupe_key = $1";
                let id: i64 = sqlx::query_scalar(known)
                    .bind(dedupe_key)
                    .fetch_one(&mut *tx)
                    .await?;
                return Ok((id, false));
            };
            if let Some(rows) = &field_rows {
                sqlx::query(AssertSqlSafe(insert_fields.as_str()))
                    .bind(rows.as_str())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(of) = replay_of {
                let route = stored.route.as_str();
                let message_id = dl
                    .headers
                    .iter()
                    .find(|(name, _)| name == PROP_MESSAGE_ID)
                    .map(|(_, value)| value.as_str());
                edit_claims::settle(&mut tx, of, route, message_id).await?;
            }
            tx.commit().await?;
            Ok((id, true))
        })
        .await
        .map_err(|e| match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(m),
            other => StoreError::Unavailable(format!(
                "the store refused an encoded dead letter, so its schema or settings are not \
                 the ones Carteiro migrated: {other}"
            )),
        })
    }
}
