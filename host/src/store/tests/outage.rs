//! PostgreSQL going away and coming back: errors are transient, nothing half-committed, and
//! the same `Store` works again without a restart. Uses its own instance of
//! `scripts/postgres.sh` (the shared one stays up for the other tests).

use std::process::Command;

use crate::store::{CommitOutcome, Store};

use super::{on_server, request, write};

fn script(args: &[&str]) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/postgres.sh");
    let out = Command::new(path)
        .args(args)
        .output()
        .expect("run scripts/postgres.sh");
    assert!(
        out.status.success(),
        "postgres.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_then_back() {
    // Same requirement as the other PostgreSQL tests: fail loudly when PG is not set up.
    let _ = std::env::var(super::PG_ENV).unwrap_or_else(|_| {
        panic!(
            "{} is not set: run `export {0}=$(scripts/postgres.sh start)`",
            super::PG_ENV
        )
    });
    // A fixed name reuses the data folder (no initdb per run, nothing piles up).
    let (name, port) = ("store-outage", "55499");
    let admin = script(&["start", name, port]);
    // A fresh database each run: the folder outlives runs (and schema changes).
    let db = format!("outage_{}", uuid::Uuid::now_v7().simple());
    on_server(&admin, format!("CREATE DATABASE {db}")).await;
    let url = super::with_database(&admin, &db);
    let store = Store::connect(&url, 2).await.unwrap();
    store.migrate().await.unwrap();
    let mut req = request("r", "during-outage");
    req.writes = vec![write("k", Some(b"v"))];

    script(&["stop", name]);
    let err = store
        .commit_batch(std::slice::from_ref(&req))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(store.ping().await.unwrap_err().is_transient());

    script(&["start", name, port]);
    assert!(
        !store.inbox_contains("r", "during-outage").await.unwrap(),
        "nothing committed"
    );
    assert_eq!(
        store.commit_batch(&[req]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );
    store.pool().close().await;
    on_server(&admin, format!("DROP DATABASE {db} WITH (FORCE)")).await;
    script(&["stop", name]);
}
