//! Retention as `carteiro run` does it once a minute (`housekeeping::sweep`): kv tombstones
//! older than `KV_TOMBSTONE_RETENTION` go, younger ones and live rows stay; inbox records and
//! published outbox rows go after their configured periods, unpublished rows never; archived
//! dead letters go after `[dead_letters] retain` (only the replayed ones by default, never one
//! a replay holds); and every purge goes in batches, which two stores purging at once split,
//! each batch with the history (`dead_letter_events`) of the dead letters it deletes.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{TestDb, both_backends, dl, event, request, write};
use crate::housekeeping::{Expire, KV_TOMBSTONE_RETENTION, Policy, Swept, sweep};
use crate::store::{Backend, RETENTION_BATCH, RETENTION_PAUSE, Store, now_ms};

both_backends!(
    sweep_purges_what_is_old_enough,
    replayed_dead_letters_past_retain_are_purged_by_default,
    expire_all_purges_unreplayed_dead_letters_but_not_one_being_replayed,
    only_published_outbox_rows_past_retain_are_purged,
    a_purge_goes_in_paused_batches_until_nothing_is_left,
    a_purge_forgets_each_batch_s_history_with_it,
    two_stores_purging_at_once_split_the_rows
);

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

/// Published outbox rows kept a day, dead letters as given, the inbox an hour.
fn policy(dead_letters: Option<Duration>, expire: Expire) -> Policy {
    Policy {
        inbox: Duration::from_secs(3600),
        outbox: Duration::from_secs(24 * 3600),
        dead_letters,
        expire,
    }
}

fn days(n: u64) -> Option<Duration> {
    Some(Duration::from_secs(n * 24 * 3600))
}

/// Archives a dead letter dead-lettered at `at` (unix ms); returns its id.
async fn archive(s: &Store, at: i64) -> i64 {
    s.dead_letter_insert(&dl("r", "bad input", at))
        .await
        .unwrap()
}

/// Archives `n` dead letters dead-lettered at `at`, replayed at `replayed_at`, in one
/// statement.
async fn archive_many(s: &Store, n: u64, at: i64, replayed_at: i64) {
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
         INSERT INTO dead_letters (route, queue, reason, attempts, headers, body, \
         dead_lettered_at, replayed_at, replay_count) \
         SELECT 'r', 'r.dlq', 'bulk', 1, '[]', $2, $3, $4, 1 FROM n",
    )
    .bind(i64::try_from(n).unwrap())
    .bind(b"{}".as_slice())
    .bind(at)
    .bind(replayed_at)
    .execute(s.pool())
    .await
    .unwrap();
}

/// The ids of `table`'s rows, in order.
async fn ids(s: &Store, table: &str) -> Vec<i64> {
    let sql = format!("SELECT id FROM {table} ORDER BY id");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_all(s.pool())
        .await
        .unwrap()
}

async fn sweep_purges_what_is_old_enough(db: &TestDb) {
    let s = &db.store;
    let config = crate::config::load_str(
        "version = 1\n[broker]\nurl = \"amqp://localhost\"\n[store]\ninbox_retention = \"1h\"\n",
        Path::new("carteiro.toml"),
        Path::new("."),
    )
    .unwrap();
    let policy = config.retention();
    let mut put = request("r", "put");
    put.writes = ["old", "young", "live"]
        .iter()
        .map(|k| write(k, Some(b"v")))
        .collect();
    put.outbox = vec![event("e", b"{}")];
    s.commit_batch(&[put]).await.unwrap();
    let mut del = request("r", "del");
    del.writes = vec![write("old", None), write("young", None)];
    s.commit_batch(&[del]).await.unwrap();
    let rows = s.outbox_pending(10, "relay", 60_000).await.unwrap();
    s.outbox_mark_published(rows[0].id).await.unwrap();
    // Kept forever unless `[dead_letters] retain` says otherwise.
    archive(s, 0).await;

    // Nothing is old enough yet; dead letters are not purged at all.
    let nothing = Swept {
        inbox: Some(0),
        outbox: Some(0),
        kv_tombstones: Some(0),
        dead_letters: None,
    };
    assert_eq!(sweep(&policy, s, now_ms()).await, nothing);

    // The "old" tombstone and the live row were last written long ago.
    let long_ago = now_ms() - i64::try_from(KV_TOMBSTONE_RETENTION.as_millis()).unwrap() - 1_000;
    sqlx::query("UPDATE kv SET updated_at = $1 WHERE key IN ('old', 'live')")
        .bind(long_ago)
        .execute(s.pool())
        .await
        .unwrap();
    let swept = sweep(&policy, s, now_ms()).await;
    assert_eq!(swept.kv_tombstones, Some(1), "only the old tombstone");
    let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM kv ORDER BY key")
        .fetch_all(s.pool())
        .await
        .unwrap();
    assert_eq!(keys, ["live", "young"]);
    assert!(s.kv_get("ns", "live").await.unwrap().is_some());

    // Two hours later: the inbox (1 h) goes, the published row (1 day) stays; after two
    // days it goes too, with the young tombstone. The dead letter stays.
    let swept = sweep(&policy, s, now_ms() + 2 * HOUR).await;
    assert_eq!(
        (swept.inbox, swept.outbox, swept.kv_tombstones),
        (Some(2), Some(0), Some(0))
    );
    let swept = sweep(&policy, s, now_ms() + 2 * DAY).await;
    assert_eq!((swept.outbox, swept.kv_tombstones), (Some(1), Some(1)));
    assert_eq!(ids(s, "dead_letters").await.len(), 1);
}

async fn replayed_dead_letters_past_retain_are_purged_by_default(db: &TestDb) {
    let s = &db.store;
    let now = now_ms();
    let old_replayed = archive(s, now - 31 * DAY).await;
    let old_unreplayed = archive(s, now - 31 * DAY).await;
    let young_replayed = archive(s, now - DAY).await;
    for id in [old_replayed, young_replayed] {
        s.dead_letter_mark_replayed(id).await.unwrap();
    }
    let all = [old_replayed, old_unreplayed, young_replayed];

    // Without `retain`, nothing goes, however old.
    let forever = policy(None, Expire::Replayed);
    assert_eq!(sweep(&forever, s, now + 365 * DAY).await.dead_letters, None);
    assert_eq!(ids(s, "dead_letters").await, all);

    // `retain = "30d"`: the replayed one dead-lettered 31 days ago goes.
    let replayed = policy(days(30), Expire::Replayed);
    assert_eq!(sweep(&replayed, s, now).await.dead_letters, Some(1));
    assert_eq!(
        ids(s, "dead_letters").await,
        [old_unreplayed, young_replayed]
    );
    assert_eq!(sweep(&replayed, s, now).await.dead_letters, Some(0));

    // A year on, the young replayed one has gone too; the unreplayed one never goes.
    assert_eq!(
        sweep(&replayed, s, now + 365 * DAY).await.dead_letters,
        Some(1)
    );
    assert_eq!(ids(s, "dead_letters").await, [old_unreplayed]);
}

async fn expire_all_purges_unreplayed_dead_letters_but_not_one_being_replayed(db: &TestDb) {
    let s = &db.store;
    let now = now_ms();
    let old = archive(s, now - 2 * DAY).await;
    let claimed = archive(s, now - 2 * DAY).await;
    let claim_expired = archive(s, now - 2 * DAY).await;
    let young = archive(s, now - HOUR).await;
    let replayed = archive(s, now - 2 * DAY).await;
    s.dead_letter_mark_replayed(replayed).await.unwrap();
    // A running replay holds `claimed`; the replay that claimed `claim_expired` died.
    assert!(
        s.dead_letter_claim_replay(claimed, "replay-1", 60_000, None)
            .await
            .unwrap()
    );
    assert!(
        s.dead_letter_claim_replay(claim_expired, "replay-0", -1_000, None)
            .await
            .unwrap()
    );
    assert_eq!(ids(s, "dead_letters").await.len(), 5);

    let all = policy(days(1), Expire::All);
    assert_eq!(sweep(&all, s, now).await.dead_letters, Some(3));
    assert_eq!(ids(s, "dead_letters").await, [claimed, young]);
    assert!(s.dead_letter_get(old).await.unwrap().is_none());

    // Once the replay gives its claim back, the next pass takes the row.
    s.dead_letter_release_replay(Some(claimed), "replay-1")
        .await
        .unwrap();
    assert_eq!(sweep(&all, s, now).await.dead_letters, Some(1));
    assert_eq!(ids(s, "dead_letters").await, [young]);
}

async fn only_published_outbox_rows_past_retain_are_purged(db: &TestDb) {
    let s = &db.store;
    let mut req = request("r", "events");
    req.outbox = (0..4).map(|i| event(&format!("e{i}"), b"{}")).collect();
    s.commit_batch(&[req]).await.unwrap();
    let rows = s.outbox_pending(10, "relay", 60_000).await.unwrap();
    let row_ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    assert_eq!(row_ids, ids(s, "outbox").await);
    // Every row was committed a month ago; e0 was published three days ago, e1 an hour
    // ago, e2 and e3 never (a broken binding, say).
    let now = now_ms();
    sqlx::query("UPDATE outbox SET created_at = $1")
        .bind(now - 30 * DAY)
        .execute(s.pool())
        .await
        .unwrap();
    for (id, published_at) in [(row_ids[0], now - 3 * DAY), (row_ids[1], now - HOUR)] {
        sqlx::query("UPDATE outbox SET published_at = $1 WHERE id = $2")
            .bind(published_at)
            .bind(id)
            .execute(s.pool())
            .await
            .unwrap();
    }

    let keep_a_day = policy(None, Expire::Replayed);
    assert_eq!(sweep(&keep_a_day, s, now).await.outbox, Some(1));
    assert_eq!(ids(s, "outbox").await, row_ids[1..].to_vec());
    // Years later the other published row has gone too; the unpublished ones stay.
    assert_eq!(
        sweep(&keep_a_day, s, now + 1_000 * DAY).await.outbox,
        Some(1)
    );
    assert_eq!(ids(s, "outbox").await, row_ids[2..].to_vec());
    assert_eq!(s.outbox_status().await.unwrap().pending, 2);
}

async fn a_purge_goes_in_paused_batches_until_nothing_is_left(db: &TestDb) {
    let s = &db.store;
    let now = now_ms();
    // Two and a half batches: two full ones, each followed by a pause, then the rest.
    let n = 2 * RETENTION_BATCH + RETENTION_BATCH / 2;
    archive_many(s, n, now - 2 * DAY, now - DAY).await;
    let unreplayed = archive(s, now - 2 * DAY).await;
    let started = Instant::now();
    let swept = sweep(&policy(days(1), Expire::Replayed), s, now).await;
    assert_eq!(swept.dead_letters, Some(n));
    assert!(
        started.elapsed() >= 2 * RETENTION_PAUSE,
        "two pauses: {:?}",
        started.elapsed()
    );
    assert_eq!(ids(s, "dead_letters").await, [unreplayed]);

    // Published outbox rows likewise, and an unpublished one stays.
    let mut req = request("r", "many");
    req.outbox = (0..=n).map(|i| event(&format!("e{i}"), b"{}")).collect();
    s.commit_batch(&[req]).await.unwrap();
    let last = *ids(s, "outbox").await.last().unwrap();
    sqlx::query("UPDATE outbox SET published_at = $1 WHERE id < $2")
        .bind(now - 2 * DAY)
        .bind(last)
        .execute(s.pool())
        .await
        .unwrap();
    assert_eq!(s.outbox_purge_published_before(now - DAY).await.unwrap(), n);
    assert_eq!(ids(s, "outbox").await, [last]);
}

/// Logs, for each deleted `dead_letter_events` row, how many dead letters there were then
/// (`forget_log`): events deleted by one statement after their dead letters were gone all
/// log the same number.
async fn log_event_deletions(s: &Store) {
    let statements: &[&str] = match s.backend() {
        Backend::Sqlite => &[
            "CREATE TABLE forget_log (letters BIGINT NOT NULL)",
            "CREATE TRIGGER forget_logged AFTER DELETE ON dead_letter_events BEGIN \
             INSERT INTO forget_log SELECT COUNT(*) FROM dead_letters; END",
        ],
        Backend::Postgres => &[
            "CREATE TABLE forget_log (letters BIGINT NOT NULL)",
            "CREATE FUNCTION forget_logged() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             INSERT INTO forget_log SELECT COUNT(*) FROM dead_letters; RETURN OLD; END $$",
            "CREATE TRIGGER forget_logged AFTER DELETE ON dead_letter_events \
             FOR EACH ROW EXECUTE FUNCTION forget_logged()",
        ],
    };
    for statement in statements {
        sqlx::query(sqlx::AssertSqlSafe(*statement))
            .execute(s.pool())
            .await
            .unwrap();
    }
}

/// A retention purge of 2,500 replayed dead letters, each with its replay event: the events
/// go with their batch (at most `RETENTION_BATCH` at once), not in one statement at the end
/// that reads the whole history and deletes every orphan in one transaction.
async fn a_purge_forgets_each_batch_s_history_with_it(db: &TestDb) {
    let s = &db.store;
    let now = now_ms();
    let n = 2 * RETENTION_BATCH + RETENTION_BATCH / 2;
    archive_many(s, n, now - 2 * DAY, now - DAY).await;
    let kept = archive(s, now).await;
    sqlx::query(
        "INSERT INTO dead_letter_events (dead_letter_id, kind, happened_at, detail) \
         SELECT id, 'replay', $1, '{}' FROM dead_letters",
    )
    .bind(now - DAY)
    .execute(s.pool())
    .await
    .unwrap();
    log_event_deletions(s).await;

    assert_eq!(
        s.dead_letters_purge_expired(now - DAY, true).await.unwrap(),
        n
    );
    let most: i64 = sqlx::query_scalar(
        "SELECT COALESCE(MAX(c), 0) FROM \
         (SELECT COUNT(*) AS c FROM forget_log GROUP BY letters) AS g",
    )
    .fetch_one(s.pool())
    .await
    .unwrap();
    assert!(
        most <= i64::try_from(RETENTION_BATCH).unwrap(),
        "{most} events were deleted at once after their dead letters were gone (a batch is \
         {RETENTION_BATCH})"
    );
    let forgotten: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM forget_log")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(
        forgotten,
        i64::try_from(n).unwrap(),
        "every purged one's event"
    );
    assert_eq!(s.dead_letter_events(kept).await.unwrap().len(), 1);
}

async fn two_stores_purging_at_once_split_the_rows(db: &TestDb) {
    let now = now_ms();
    let n = 4 * RETENTION_BATCH + 7;
    archive_many(&db.store, n, now - 2 * DAY, now - DAY).await;
    // Two gateways on one store: on PostgreSQL each batch skips the rows the other locked.
    let other = db.second_store().await;
    let (a, b) = tokio::join!(
        db.store.dead_letters_purge_expired(now - DAY, true),
        other.dead_letters_purge_expired(now - DAY, true),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a + b, n, "each row deleted once: {a} + {b}");
    assert!(ids(&db.store, "dead_letters").await.is_empty());
    other.pool().close().await;
}
