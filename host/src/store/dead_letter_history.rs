//! A dead letter's history beyond its archived row (migration 0010): each replay and each
//! edit (`dead_letter_events`: when, who, what changed, the body an edit sent), and the claim
//! an edit takes — the replay claim of migration 0006 — so an edit and a concurrent replay
//! never both send the row. The archived row itself is never rewritten: the original stays as
//! it was dead-lettered. (The dead letters a replay became again are found by their
//! `replay_of`: `Store::dead_letters_replaying`.)

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Store, StoreError, now_ms, nul_free};

/// `kind` of a replay in `dead_letter_events`.
pub(crate) const EVENT_REPLAY: &str = "replay";
/// `kind` of an edit (an edited copy sent) in `dead_letter_events`.
pub(crate) const EVENT_EDIT: &str = "edit";

/// Events read per dead letter (the oldest first); more is a history nobody reads on a page.
const MAX_EVENTS: i64 = 1_000;

/// One replay or edit of a dead letter.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterEvent {
    /// Event id (in the order they happened).
    pub id: i64,
    /// The dead letter it happened to.
    pub dead_letter_id: i64,
    /// `replay` or `edit`.
    pub kind: String,
    /// When (unix ms).
    pub at: i64,
    /// Who, for an edit: the console's user (`token` for the bearer token) or `cli`.
    pub actor: Option<String>,
    /// What an edit changed (`dlq::edit::Changes` as JSON); `{}` for a replay.
    pub detail: serde_json::Value,
    /// The body an edit sent.
    pub body: Option<Vec<u8>>,
}

impl DeadLetterEvent {
    /// An edited copy was sent (rather than the original replayed).
    pub fn is_edit(&self) -> bool {
        self.kind == EVENT_EDIT
    }
}

impl Store {
    /// The replays and edits of dead letter `id`, oldest first.
    pub async fn dead_letter_events(&self, id: i64) -> Result<Vec<DeadLetterEvent>, StoreError> {
        self.bounded("dead letter events", async {
            let rows = sqlx::query(
                "SELECT id, dead_letter_id, kind, happened_at, actor, detail, body \
                 FROM dead_letter_events WHERE dead_letter_id = $1 ORDER BY id LIMIT $2",
            )
            .bind(id)
            .bind(MAX_EVENTS)
            .fetch_all(self.pool())
            .await?;
            rows.iter().map(event).collect()
        })
        .await
    }

    /// Claims dead letter `id` for an edit by `owner` for `lease_ms` (the database's clock):
    /// the replay claim, so a replay running at the same time skips the row and an edit never
    /// takes a row a replay holds. Unlike a replay's, it takes a row replayed or edited
    /// before (an operator may edit again). False: a replay or another edit holds it now.
    pub async fn dead_letter_claim_edit(
        &self,
        id: i64,
        owner: &str,
        lease_ms: i64,
    ) -> Result<bool, StoreError> {
        self.bounded("dead letter claim for edit", async {
            nul_free::text("edit owner", owner)?;
            let clock = super::outbox::db_clock_ms(self.backend);
            let sql = format!(
                "UPDATE dead_letters SET replaying_by = $2, replaying_until = {clock} + $3 \
                 WHERE id = $1 \
                 AND (replaying_by IS NULL OR replaying_by = $2 OR replaying_until < {clock})"
            );
            let mut tx = self.begin_write().await?;
            let done = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(id)
                .bind(owner)
                .bind(lease_ms)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// Records that an edited copy of `id` was sent (after its confirm): the row counts as
    /// replayed (`replayed_at`, `replay_count + 1`) and edited (`edited_at`), its claim ends,
    /// and the edit joins its history with `actor`, `detail` (what changed, JSON) and the
    /// `body` sent — one transaction. The archived message itself is left as it was.
    pub async fn dead_letter_mark_edited(
        &self,
        id: i64,
        actor: &str,
        detail: &str,
        body: &[u8],
    ) -> Result<(), StoreError> {
        self.bounded("dead letter mark edited", async {
            let now = now_ms();
            let mut tx = self.begin_write().await?;
            let done = sqlx::query(
                "UPDATE dead_letters SET replayed_at = $2, replay_count = replay_count + 1, \
                 edited_at = $2, replaying_by = NULL, replaying_until = NULL WHERE id = $1",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::Invalid(format!("no dead letter with id {id}")));
            }
            sqlx::query(
                "INSERT INTO dead_letter_events \
                 (dead_letter_id, kind, happened_at, actor, detail, body) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(id)
            .bind(EVENT_EDIT)
            .bind(now)
            .bind(nul_free::lossy(actor))
            .bind(nul_free::lossy(detail))
            .bind(body)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Forgets the history of dead letters that are no longer archived (after a purge).
    pub(super) async fn dead_letter_events_forget_purged(&self) -> Result<u64, StoreError> {
        self.bounded("dead letter events purge", async {
            let mut tx = self.begin_write().await?;
            let done = sqlx::query(
                "DELETE FROM dead_letter_events WHERE NOT EXISTS \
                 (SELECT 1 FROM dead_letters d WHERE d.id = dead_letter_events.dead_letter_id)",
            )
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(done.rows_affected())
        })
        .await
    }
}

fn event(row: &AnyRow) -> Result<DeadLetterEvent, StoreError> {
    let detail: String = row.try_get("detail")?;
    Ok(DeadLetterEvent {
        id: row.try_get("id")?,
        dead_letter_id: row.try_get("dead_letter_id")?,
        kind: row.try_get("kind")?,
        at: row.try_get("happened_at")?,
        actor: row.try_get("actor")?,
        detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
        body: row.try_get("body")?,
    })
}
