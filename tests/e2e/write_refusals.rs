//! A store that answers reads but refuses writes for longer than any retry loop (a revoked
//! grant on PostgreSQL, a full disk under SQLite): the gate stays closed until a write
//! succeeds, held deliveries are
//! never requeued (so a quorum queue's delivery limit is never spent), no dead letter is
//! dropped, and a gateway started meanwhile waits (healthy, not ready) instead of exiting.

use crate::live::{free_port, http};
use crate::resilience::{Running, carteiro, queue_depth};
use crate::support::{
    Client, Gateway, dead_letters_within, json_props, route_config, unique, wait_for, with_store,
};
use carteiro::common::labels::Outcome;
use carteiro::metrics::Metrics;
use carteiro::store::Store;
use sqlx::Connection;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

/// A database owned by a role of its own (not a superuser, so grants bind it).
struct Restricted {
    /// The gateway's URL: as the role.
    url: String,
    /// A superuser's URL to the same database, to revoke and grant.
    admin: String,
    role: String,
}

async fn restricted_database() -> Restricted {
    let server = std::env::var("CARTEIRO_TEST_POSTGRES_URL").expect("CARTEIRO_TEST_POSTGRES_URL");
    let (base, _) = server.rsplit_once('/').expect("a database in the URL");
    let base = base.replace("postgres@", "");
    let name = format!("e2e_{}", uuid::Uuid::now_v7().simple());
    let role = format!("writer_{}", uuid::Uuid::now_v7().simple());
    let mut admin = sqlx::PgConnection::connect(&server).await.expect("admin");
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("CREATE DATABASE {name} OWNER {role}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .expect("create role and database");
    }
    let (scheme, host) = base.split_once("://").expect("scheme");
    Restricted {
        url: format!("{scheme}://{role}@{host}/{name}"),
        admin: format!("{scheme}://postgres@{host}/{name}"),
        role,
    }
}

/// Revokes (or grants back) every write on the database's tables from its own role.
async fn allow_writes(db: &Restricted, allowed: bool) {
    let mut admin = sqlx::PgConnection::connect(&db.admin).await.expect("admin");
    let sql = if allowed {
        format!(
            "GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}",
            db.role
        )
    } else {
        format!(
            "REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public FROM {}",
            db.role
        )
    };
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&mut admin)
        .await
        .expect("grant or revoke");
}

async fn done(store: &Store, id: &str) -> bool {
    matches!(
        store.kv_get("fixture-mixed", &format!("done/{id}")).await,
        Ok(Some(_))
    )
}

/// The route of these tests: `fixture-mixed` on a quorum queue, on SQLite.
fn quorum_config(queue: &str, exchange: &str) -> String {
    route_config(
        queue,
        "fixture-mixed",
        exchange,
        "",
        "queue_type = \"quorum\"",
    )
}

/// [`quorum_config`] on the store at `url`.
fn quorum_route(queue: &str, exchange: &str, url: &str) -> String {
    with_store(&quorum_config(queue, exchange), url)
}

/// A test client, and a queue named after `prefix` with its input exchange declared.
async fn client_and_names(prefix: &str) -> (Client, String, String) {
    let client = Client::connect().await;
    let (queue, exchange) = (unique(prefix), unique("in"));
    client.sink(&exchange).await;
    (client, queue, exchange)
}

/// Longer than the old requeue loops took to spend a quorum queue's delivery limit of 20:
/// the archiver's nack-requeue every ~0.7 s, and the pipeline's requeue after 10 rounds.
const REFUSED_FOR: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_grant_holds_quorum_deliveries_and_dead_letters_without_spending_their_limit() {
    let db = restricted_database().await;
    let (client, queue, exchange) = client_and_names("refused").await;
    let metrics = Arc::new(Metrics::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Gateway::start_in(
        dir,
        &quorum_route(&queue, &exchange, &db.url),
        metrics.clone(),
    )
    .await;
    client.wait_for_consumer(&queue).await;

    allow_writes(&db, false).await;
    publish_and_hold(&client, &queue, &exchange, &metrics).await;
    allow_writes(&db, true).await;
    all_settled_once(&client, &queue, &gw, &metrics).await;
    gw.stop().await;
}

/// Publishes three messages the handler acks and two it dead-letters while every store write
/// fails, and checks for [`REFUSED_FOR`] that the gate stays closed (a read-only probe would
/// reopen it at once), nothing is requeued (each requeue spends a quorum queue's delivery
/// limit) and nothing is parked.
async fn publish_and_hold(client: &Client, queue: &str, exchange: &str, metrics: &Metrics) {
    for i in 0..3 {
        let id = format!("good-{i}");
        client.publish(exchange, "k", json_props(&id), b"ok").await;
    }
    for i in 0..2 {
        let id = format!("dead-{i}");
        client
            .publish(exchange, "k", json_props(&id), b"remember")
            .await;
    }
    wait_for("the store gate to close", WAIT, || async {
        (metrics.store.available.get() == 0).then_some(())
    })
    .await;
    let refused_until = tokio::time::Instant::now() + REFUSED_FOR;
    while tokio::time::Instant::now() < refused_until {
        assert_eq!(
            metrics.store.available.get(),
            0,
            "the gate reopened while every write is refused"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        metrics.delivered(queue, Outcome::Requeued),
        0,
        "a held delivery was requeued during the outage (each requeue spends a quorum queue's delivery limit)"
    );
    assert_eq!(queue_depth(client, &format!("{queue}.dlq.parked")).await, 0);
}

/// Once writes succeed again: the three good messages processed, both dead letters archived
/// by the handler's verdict, nothing left in `Q.dlq` or parked, and still no requeue.
async fn all_settled_once(client: &Client, queue: &str, gw: &Gateway, metrics: &Metrics) {
    for i in 0..3 {
        let id = format!("good-{i}");
        wait_for(&format!("{id} processed"), WAIT, || async {
            done(&gw.store, &id).await.then_some(())
        })
        .await;
    }
    let archived = dead_letters_within(&gw.store, queue, 2, WAIT).await;
    assert_eq!(archived.len(), 2, "{archived:?}");
    assert!(
        archived
            .iter()
            .all(|d| d.letter.reason.starts_with("runs ")),
        "only the two dead letters, by the handler's verdict: {archived:?}"
    );
    assert_eq!(queue_depth(client, &format!("{queue}.dlq")).await, 0);
    assert_eq!(queue_depth(client, &format!("{queue}.dlq.parked")).await, 0);
    assert_eq!(metrics.delivered(queue, Outcome::Requeued), 0);
}

/// A small tmpfs of its own (CI and the tests run as root), unmounted on drop: a disk that
/// can be filled to the last byte without touching the machine's.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(bytes: u64) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a {bytes}-byte tmpfs failed ({status}): this test needs root, as CI has"
        );
        Self { dir }
    }

    fn filler(&self) -> std::path::PathBuf {
        self.dir.path().join("filler")
    }

    /// Writes a file until the disk has no byte left (ENOSPC).
    fn fill(&self) {
        use std::io::Write;
        let mut file = std::fs::File::create(self.filler()).expect("create the filler");
        for chunk in [1 << 16, 1 << 12, 1 << 9, 1] {
            let zeros = vec![0u8; chunk];
            while file.write_all(&zeros).is_ok() {}
        }
    }

    /// Gives the filler's space back.
    fn free(&self) {
        std::fs::remove_file(self.filler()).expect("remove the filler");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy: the gateway's store connections may still hold files open.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// SQLite on a full disk answers reads and fails every write with SQLITE_FULL (13): the same
/// hold as a revoked grant, and the same settling once space is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_holds_quorum_deliveries_and_dead_letters_until_space_returns() {
    let disk = SmallDisk::mount(8 << 20);
    let url = format!("sqlite://{}/carteiro.db", disk.dir.path().display());
    let (client, queue, exchange) = client_and_names("full").await;
    let metrics = Arc::new(Metrics::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Gateway::start_in(dir, &quorum_route(&queue, &exchange, &url), metrics.clone()).await;
    client.wait_for_consumer(&queue).await;
    client
        .publish(&exchange, "k", json_props("before"), b"ok")
        .await;
    wait_for(
        "a message processed before the disk fills",
        WAIT,
        || async { done(&gw.store, "before").await.then_some(()) },
    )
    .await;

    disk.fill();
    publish_and_hold(&client, &queue, &exchange, &metrics).await;
    disk.free();
    all_settled_once(&client, &queue, &gw, &metrics).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_while_writes_are_refused_waits_not_ready_then_serves() {
    let db = restricted_database().await;
    let (client, queue, exchange) = client_and_names("startup").await;
    // Migrated and keyed once, as after any earlier run: only writes are refused now.
    let store = Store::connect(&db.url, 2).await.expect("store");
    store.migrate().await.expect("migrate");
    store.header_seal_secret().await.expect("seal key");
    allow_writes(&db, false).await;

    let port = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("carteiro.toml");
    let toml = quorum_route(&queue, &exchange, &db.url).replace(
        "listen = \"\"",
        &format!(
            "listen = \"127.0.0.1:{port}\"\ntoken = \"{}\"",
            crate::live::ADMIN_TOKEN
        ),
    );
    std::fs::write(&config, toml).expect("config");
    let mut cmd = carteiro();
    cmd.args(["run", "-c"]).arg(&config);
    let mut gateway = Running::spawn(cmd);
    gateway
        .wait_stderr("store not ready at start-up", WAIT)
        .await;
    wait_for("the admin address to answer", WAIT, || async {
        let (status, _) = try_http(port, "/healthz").await?;
        (status == 200).then_some(())
    })
    .await;
    let (ready, _) = http(port, "GET", "/readyz").await;
    assert_eq!(ready, 503, "not ready while the store refuses writes");
    // Still waiting, not exited, several tries later.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (ready, _) = http(port, "GET", "/readyz").await;
    assert_eq!(ready, 503);

    allow_writes(&db, true).await;
    wait_for("ready once writes are allowed", WAIT, || async {
        let (status, _) = try_http(port, "/readyz").await?;
        (status == 200).then_some(())
    })
    .await;
    client.wait_for_consumer(&queue).await;
    client
        .publish(&exchange, "k", json_props("after"), b"ok")
        .await;
    wait_for("the message processed", WAIT, || async {
        done(&store, "after").await.then_some(())
    })
    .await;
    let finished = gateway.kill().await;
    assert!(
        finished
            .stderr
            .contains("store takes writes: starting the routes"),
        "{}",
        finished.stderr
    );
}

/// `GET path`, or `None` while nothing listens yet.
async fn try_http(port: u16, path: &str) -> Option<(u16, String)> {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    Some(http(port, "GET", path).await)
}

/// A dead letter the broker parked (returned to a quorum `Q.dlq` past its delivery limit)
/// shows on `/metrics`, and `carteiro dlq unpark` hands it back to the archiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_dead_letter_is_counted_and_unpark_brings_it_to_the_archive() {
    use lapin::options::BasicPublishOptions;
    let (client, queue, exchange) = client_and_names("parked").await;
    let metrics = Arc::new(Metrics::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Gateway::start_in(dir, &quorum_config(&queue, &exchange), metrics.clone()).await;
    client.wait_for_consumer(&queue).await;
    let parked = format!("{queue}.dlq.parked");
    client
        .channel
        .basic_publish(
            "".into(),
            parked.as_str().into(),
            BasicPublishOptions::default(),
            b"parked body",
            json_props("parked-1"),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    let gauge = format!("carteiro_dead_letters_parked{{route=\"{queue}\"}} 1");
    wait_for("the parked gauge", WAIT, || async {
        metrics.encode().contains(&gauge).then_some(())
    })
    .await;

    let config = gw.dir.path().join("carteiro.toml");
    let mut cmd = carteiro();
    cmd.args(["dlq", "-c"])
        .arg(&config)
        .args(["unpark", "--route", &queue]);
    let finished = crate::resilience::run_to_end(cmd, WAIT).await;
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);
    assert!(
        finished.stdout.contains("1 parked dead letters moved back"),
        "{}",
        finished.stdout
    );
    // The unparked dead letter archived.
    let archived = dead_letters_within(&gw.store, &queue, 1, WAIT).await;
    assert_eq!(archived.len(), 1);
    assert_eq!(archived[0].letter.body, b"parked body");
    assert_eq!(queue_depth(&client, &parked).await, 0);
    gw.stop().await;
}
