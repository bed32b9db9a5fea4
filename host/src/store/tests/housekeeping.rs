//! Retention as `carteiro run` does it once a minute (`housekeeping::sweep`): kv tombstones
//! older than `KV_TOMBSTONE_RETENTION` go, younger ones and live rows stay; inbox records and
//! published outbox rows go after their configured periods.

use std::path::Path;

use super::{TestDb, both_backends, event, request, write};
use crate::housekeeping::{KV_TOMBSTONE_RETENTION, Swept, sweep};
use crate::store::now_ms;

both_backends!(sweep_purges_what_is_old_enough);

async fn sweep_purges_what_is_old_enough(db: &TestDb) {
    let s = &db.store;
    let config = crate::config::load_str(
        "version = 1\n[broker]\nurl = \"amqp://localhost\"\n[store]\ninbox_retention = \"1h\"\n",
        Path::new("carteiro.toml"),
        Path::new("."),
    )
    .unwrap();
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

    // Nothing is old enough yet.
    assert_eq!(sweep(&config, s, now_ms()).await, Swept::default());

    // The "old" tombstone and the live row were last written long ago.
    let long_ago = now_ms() - i64::try_from(KV_TOMBSTONE_RETENTION.as_millis()).unwrap() - 1_000;
    sqlx::query("UPDATE kv SET updated_at = $1 WHERE key IN ('old', 'live')")
        .bind(long_ago)
        .execute(s.pool())
        .await
        .unwrap();
    let swept = sweep(&config, s, now_ms()).await;
    assert_eq!(swept.kv_tombstones, 1, "only the old tombstone");
    let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM kv ORDER BY key")
        .fetch_all(s.pool())
        .await
        .unwrap();
    assert_eq!(keys, ["live", "young"]);
    assert!(s.kv_get("ns", "live").await.unwrap().is_some());

    // Two hours later: the inbox (1 h) goes, the published row (1 day) stays; after two
    // days it goes too, with the young tombstone.
    let swept = sweep(&config, s, now_ms() + 2 * 3_600_000).await;
    assert_eq!((swept.inbox, swept.outbox, swept.kv_tombstones), (2, 0, 0));
    let swept = sweep(&config, s, now_ms() + 2 * 86_400_000).await;
    assert_eq!((swept.outbox, swept.kv_tombstones), (1, 1));
}
