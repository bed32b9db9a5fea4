//! The guarantees of `[[outboxes]]` on the story's table: at least once, nothing skipped
//! (a younger id committed first) or invented (a rolled-back row), every row marked, and at
//! most the window sent again per relay crash.

use std::time::Duration;

use super::{AppDb, Story, WAIT, read_written, receive_all, relay};
use crate::support::wait_for;

/// The relay's default window: the rows one crash may send again.
const WINDOW: usize = 256;

/// The story's service commits `rows` transactions (a fifth rolled back, younger ids often
/// committing first) while the relay is SIGKILLed and restarted `kills` times.
async fn relayed_through_kills(db: AppDb, mode: &str, ready: &str, rows: usize, kills: usize) {
    db.create_table();
    let Story {
        client,
        sink,
        dir,
        config,
        ..
    } = Story::new(&db, mode, "").await;
    let written = dir.path().join("written.json");
    let mut writer = db
        .story(&["write", &rows.to_string(), &written.display().to_string()])
        .spawn()
        .expect("the story's service starts");
    let mut running = relay(&config, ready).await;
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(700)).await;
        running.kill().await;
        running = relay(&config, ready).await;
    }
    let status = tokio::task::spawn_blocking(move || writer.wait())
        .await
        .expect("join")
        .expect("writer");
    assert!(status.success(), "the story's service failed");
    // More rows while the last relay runs on: a relay that skips a row whose transaction
    // commits after a younger one (the textbook poller bug) misses some of these for good.
    let more = db.write(&dir.path().join("more.json"), rows, &[]);
    let mut written = read_written(&written);
    written.committed.extend(more.committed);
    written.rolled_back.extend(more.rolled_back);
    assert!(!written.rolled_back.is_empty() && !written.committed.is_empty());
    wait_for("every committed row marked", WAIT, || async {
        (db.unpublished().await == 0).then_some(())
    })
    .await;
    let committed = written.committed;
    let seen = receive_all(&client, &sink, &committed).await;
    running.kill().await;
    let invented: Vec<&String> = written
        .rolled_back
        .iter()
        .filter(|id| seen.contains_key(*id))
        .collect();
    assert!(
        invented.is_empty(),
        "rolled-back rows published: {invented:?}"
    );
    let strangers: Vec<&String> = seen.keys().filter(|id| !committed.contains(*id)).collect();
    assert!(
        strangers.is_empty(),
        "events nobody committed: {strangers:?}"
    );
    let again: usize = seen.values().map(|n| n - 1).sum();
    assert!(
        again <= WINDOW * kills,
        "{again} events sent again over {kills} crashes (at most {WINDOW} each)"
    );
    let rows_in_table = db
        .count("SELECT CAST(COUNT(*) AS BIGINT) FROM outbox_events")
        .await;
    assert_eq!(rows_in_table as usize, committed.len());
    eprintln!(
        "{} committed, {} rolled back, {again} sent again over {kills} kills",
        committed.len(),
        written.rolled_back.len()
    );
}

#[tokio::test]
async fn poll_on_postgres_loses_nothing_and_publishes_no_rollback_through_kills() {
    relayed_through_kills(AppDb::postgres().await, "poll", "(active)", 600, 3).await;
}

#[tokio::test]
async fn poll_on_sqlite_loses_nothing_and_publishes_no_rollback_through_kills() {
    relayed_through_kills(AppDb::sqlite(), "poll", "(active)", 300, 2).await;
}

#[tokio::test]
async fn cdc_on_postgres_loses_nothing_and_publishes_no_rollback_through_kills() {
    let db = AppDb::postgres().await;
    let (url, slot) = (db.url.clone(), db.slot.clone());
    relayed_through_kills(db, "cdc", "CDC relay active", 600, 3).await;
    crate::cdc::drop_slot(&url, &slot).await;
}
