//! A dead letter's history beyond its archived row (migration 0010): each replay and each
//! edit (`dead_letter_events`: when, who, what changed, the body an edit sent), the claim a
//! replay or an edit takes — the replay claim of migration 0006 — so an edit and a concurrent
//! replay never both send the row, and the marks a replay or an edit leaves once sent. The
//! archived row itself is never rewritten: the original stays as it was dead-lettered. (The
//! dead letters a replay became again are found by their `replay_of`:
//! `Store::dead_letters_replaying`.)

use sqlx::AssertSqlSafe;

use crate::store::{Store, StoreError, now_ms, nul_free};

/// `kind` of a replay in `dead_letter_events`.
const EVENT_REPLAY: &str = "replay";
/// `kind` of an edit (an edited copy sent) in `dead_letter_events`.
pub(crate) const EVENT_EDIT: &str = "edit";

/// What a claim on a dead letter is for ([`Store::dead_letter_claim`]).
#[derive(Clone, Copy)]
enum Claim {
    /// A replay: `Some(t)` takes a row replayed before `t` too.
    Replay(Option<i64>),
    /// An edit: it takes a row replayed or edited before.
    Edit,
}

/// The edited copy [`Store::dead_letter_mark_edited`] records.
struct SentEdit<'a> {
    /// The console's user (`token` for the bearer token) or `cli`.
    actor: &'a str,
    /// What changed, as JSON.
    detail: &'a str,
    /// The body sent.
    body: &'a [u8],
}

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
            let rows: Vec<EventRecord> = sqlx::query_as(
                "SELECT id, dead_letter_id, kind, happened_at, actor, detail, body \
                 FROM dead_letter_events WHERE dead_letter_id = $1 ORDER BY id LIMIT $2",
            )
            .bind(id)
            .bind(MAX_EVENTS)
            .fetch_all(self.pool())
            .await?;
            Ok(rows.into_iter().map(DeadLetterEvent::from).collect())
        })
        .await
    }

    /// Claims dead letter `id` for one replay by `owner` for `lease_ms` (the database's
    /// clock): only if no live claim of another replay (or edit) holds it, only if it was not
    /// replayed yet, or (`replayed_before`) was replayed before that moment only, and never
    /// once it was edited (only its edited copy is sent: `dead_letter_claim_edit`). False: a
    /// concurrent replay has it or has replayed it, or it was edited; skip it.
    pub async fn dead_letter_claim_replay(
        &self,
        id: i64,
        owner: &str,
        lease_ms: i64,
        replayed_before: Option<i64>,
    ) -> Result<bool, StoreError> {
        self.dead_letter_claim(id, owner, lease_ms, Claim::Replay(replayed_before))
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
        self.dead_letter_claim(id, owner, lease_ms, Claim::Edit)
            .await
    }

    /// The claim of [`Store::dead_letter_claim_replay`] and [`Store::dead_letter_claim_edit`]:
    /// one statement, the replay's with its conditions on the row's replays and edit added.
    async fn dead_letter_claim(
        &self,
        id: i64,
        owner: &str,
        lease_ms: i64,
        claim: Claim,
    ) -> Result<bool, StoreError> {
        let (what, field, replayed_before) = match claim {
            Claim::Replay(before) => (
                "dead letter claim for replay",
                "replay owner",
                Some(before.unwrap_or(i64::MIN)),
            ),
            Claim::Edit => ("dead letter claim for edit", "edit owner", None),
        };
        self.bounded(what, async {
            nul_free::text(field, owner)?;
            let clock = self.dialect().clock_ms();
            let mut sql = format!(
                "UPDATE dead_letters SET replaying_by = $2, replaying_until = {clock} + $3 \
                 WHERE id = $1 \
                 AND (replaying_by IS NULL OR replaying_by = $2 OR replaying_until < {clock})"
            );
            if replayed_before.is_some() {
                sql.push_str(
                    " AND (replayed_at IS NULL OR replayed_at < $4) AND edited_at IS NULL",
                );
            }
            let mut update = sqlx::query(AssertSqlSafe(sql))
                .bind(id)
                .bind(owner)
                .bind(lease_ms);
            if let Some(before) = replayed_before {
                update = update.bind(before);
            }
            Ok(self.execute_write(update).await? == 1)
        })
        .await
    }

    /// Gives up `owner`'s claims (its replay failed or was stopped), so another run may take
    /// those rows at once: on dead letter `id`, or on every row when `id` is `None`.
    pub async fn dead_letter_release_replay(
        &self,
        id: Option<i64>,
        owner: &str,
    ) -> Result<(), StoreError> {
        self.bounded("dead letter release replay claim", async {
            let release = sqlx::query(
                "UPDATE dead_letters SET replaying_by = NULL, replaying_until = NULL \
                 WHERE replaying_by = $1 AND ($2 IS NULL OR id = $2)",
            )
            .bind(owner)
            .bind(id);
            self.execute_write(release).await?;
            Ok(())
        })
        .await
    }

    /// Records a replay of `id` (after the copy was republished and confirmed), and the
    /// replay in its history (`dead_letter_events`), in one transaction.
    pub async fn dead_letter_mark_replayed(&self, id: i64) -> Result<(), StoreError> {
        self.dead_letter_mark_sent("dead letter mark replayed", id, None)
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
        let edit = SentEdit {
            actor,
            detail,
            body,
        };
        self.dead_letter_mark_sent("dead letter mark edited", id, Some(edit))
            .await
    }

    /// Records that dead letter `id` was sent again (`edit`: an edited copy of it), in one
    /// transaction: the row counts as replayed (`replayed_at`, `replay_count + 1`), and for
    /// an edit as edited (`edited_at`); its claim ends; the replay or edit joins its history.
    /// `what` names the operation in a timeout error.
    async fn dead_letter_mark_sent(
        &self,
        what: &str,
        id: i64,
        edit: Option<SentEdit<'_>>,
    ) -> Result<(), StoreError> {
        self.bounded(what, async {
            let now = now_ms();
            let edited = if edit.is_some() {
                " edited_at = $2,"
            } else {
                ""
            };
            let sql = format!(
                "UPDATE dead_letters SET replayed_at = $2, \
                 replay_count = replay_count + 1,{edited} \
                 replaying_by = NULL, replaying_until = NULL WHERE id = $1"
            );
            let mut tx = self.begin_write().await?;
            let done = sqlx::query(AssertSqlSafe(sql))
                .bind(id)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::Invalid(format!("no dead letter with id {id}")));
            }
            let (kind, actor, detail, body) = match &edit {
                Some(e) => (
                    EVENT_EDIT,
                    Some(nul_free::lossy(e.actor)),
                    nul_free::lossy(e.detail),
                    Some(e.body),
                ),
                None => (EVENT_REPLAY, None, "{}".to_owned(), None),
            };
            sqlx::query(
                "INSERT INTO dead_letter_events \
                 (dead_letter_id, kind, happened_at, actor, detail, body) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(id)
            .bind(kind)
            .bind(now)
            .bind(actor)
            .bind(detail)
            .bind(body)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }
}

/// A row of `dead_letter_events`.
#[derive(sqlx::FromRow)]
struct EventRecord {
    id: i64,
    dead_letter_id: i64,
    kind: String,
    happened_at: i64,
    actor: Option<String>,
    /// JSON text.
    detail: String,
    body: Option<Vec<u8>>,
}

impl From<EventRecord> for DeadLetterEvent {
    fn from(r: EventRecord) -> Self {
        DeadLetterEvent {
            id: r.id,
            dead_letter_id: r.dead_letter_id,
            kind: r.kind,
            at: r.happened_at,
            actor: r.actor,
            detail: serde_json::from_str(&r.detail).unwrap_or(serde_json::Value::Null),
            body: r.body,
        }
    }
}
