//! Issue 23 §2.8, secrets at rest: the SQLite store (which holds the header-seal key) is
//! created readable by its owner only, and `[security] seal_key_file` replaces the key kept
//! in the store: the gateway believes exactly the copies sealed with that key.

use crate::support::{
    Client, Gateway, assert_reason_starts_with, json_props, retry_table, route_config, unique,
    wait_for,
};
use carteiro::broker::seal::SealKey;
use lapin::types::{AMQPValue, FieldTable};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_store_and_its_wal_are_created_readable_by_their_owner_only() {
    let (queue, exchange) = (unique("private"), unique("in"));
    let client = Client::connect().await;
    let gw = Gateway::start(&route_config(&queue, "fixture-mixed", &exchange, "", "")).await;
    client.wait_for_consumer(&queue).await;
    client
        .publish(&exchange, "k", json_props("private-1"), b"fine")
        .await;
    wait_for("the delivery's commit", WAIT, || async {
        gw.store
            .kv_get("fixture-mixed", "done/private-1")
            .await
            .ok()
            .flatten()
    })
    .await;
    let db = gw.dir.path().join("carteiro.db");
    assert_eq!(mode(&db), 0o600, "{}", db.display());
    for side in ["carteiro.db-wal", "carteiro.db-shm"] {
        let path = gw.dir.path().join(side);
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seal_key_file_replaces_the_stores_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key: [u8; 32] = rand::random();
    std::fs::write(dir.path().join("seal.key"), hex::encode(key)).expect("write key");
    let (queue, exchange) = (unique("sealed"), unique("in"));
    let client = Client::connect().await;
    client.sink(&exchange).await;
    let retry = retry_table(3, &["100ms"]);
    let toml = format!(
        "{}\n[security]\nseal_key_file = \"seal.key\"\n",
        route_config(&queue, "fixture-mixed", &exchange, "", &retry)
    );
    let gw = Gateway::start_in(dir, &toml, Default::default()).await;
    client.wait_for_consumer(&queue).await;

    // A copy at its last attempt, as a gateway holding `seal` would seal it, and the dead
    // letter it ends as.
    let filter = carteiro::store::DeadLetterFilter {
        route: Some(queue.clone()),
        ..Default::default()
    };
    let dead_letter_of = async |seal: &SealKey, id: &str, body: &[u8]| {
        let mut table = FieldTable::default();
        table.insert("x-carteiro-attempt".into(), AMQPValue::LongLongInt(3));
        let props = seal.seal(&queue, json_props(id).with_headers(table), body);
        client.publish(&exchange, "k", props, body).await;
        wait_for(&format!("the dead letter of {id}"), WAIT, || async {
            let rows = gw.store.dead_letters_list(&filter).await.ok()?;
            rows.into_iter()
                .find(|d| d.letter.body == body)
                .map(|d| d.letter)
        })
        .await
    };
    let file_key = SealKey::new(&key);
    let believed = dead_letter_of(&file_key, "file-key", b"retry-until-10".as_slice()).await;
    assert!(
        !believed
            .headers
            .iter()
            .any(|(k, _)| k.starts_with("x-untrusted-carteiro-")),
        "the file key's seal was not believed: {:?}",
        believed.headers
    );
    assert_reason_starts_with(&believed.reason, "retries exhausted after 3 attempts");

    // The control: the same copy sealed with another key is not believed.
    let other_key = SealKey::new(&rand::random::<[u8; 32]>());
    let doubted = dead_letter_of(&other_key, "other-key", b"retry-until-11".as_slice()).await;
    assert!(
        doubted
            .headers
            .iter()
            .any(|(k, v)| k == "x-untrusted-carteiro-attempt" && v == "3"),
        "{:?}",
        doubted.headers
    );

    // The store's own key was never made.
    let url = format!("sqlite://{}", gw.dir.path().join("carteiro.db").display());
    let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
        .await
        .expect("open the SQLite store");
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM carteiro_secrets")
        .fetch_one(&mut conn)
        .await
        .expect("count secrets");
    assert_eq!(rows, 0, "the seal key was written to the store");

    // `carteiro check` says where the key comes from.
    let mut check = crate::resilience::carteiro();
    check
        .arg("check")
        .arg("-c")
        .arg(gw.dir.path().join("carteiro.toml"));
    let out = crate::resilience::run_to_end(check, WAIT).await;
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("header-seal key from [security] seal_key_file"),
        "{}",
        out.stdout
    );
    gw.stop().await;
}
