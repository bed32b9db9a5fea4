//! Store tests against real databases: a temporary SQLite file, and a fresh PostgreSQL
//! database per test (created through `CARTEIRO_TEST_POSTGRES_URL`) so tests run in parallel.
//! Every scenario runs on both backends through `both_backends!`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod application_outboxes;
mod commit;
mod concurrency;
mod dead_letter_hours;
mod dead_letters;
mod edit_claims;
mod faults;
mod handoff;
mod housekeeping;
mod outage;
mod outbox;
mod plans;
mod reads;
mod search;
mod search_cost;
mod secrets;
mod set_based;

use super::*;

/// A migrated store that cleans up after itself.
pub(crate) struct TestDb {
    pub store: Store,
    url: String,
    _dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>, // (admin URL, database name)
}

const PG_ENV: &str = "CARTEIRO_TEST_POSTGRES_URL";

impl TestDb {
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = Store::connect(&url, 4).await.unwrap();
        store.migrate().await.unwrap();
        TestDb {
            store,
            url,
            _dir: Some(dir),
            pg: None,
        }
    }

    pub async fn postgres() -> TestDb {
        let admin = std::env::var(PG_ENV).unwrap_or_else(|_| {
            panic!(
                "{PG_ENV} is not set: PostgreSQL tests need a server. Run \
                 `export {PG_ENV}=$(scripts/postgres.sh start)` from the repository root"
            )
        });
        let name = format!("carteiro_t_{}", uuid::Uuid::now_v7().simple());
        on_server(&admin, format!("CREATE DATABASE {name}")).await;
        let url = with_database(&admin, &name);
        let store = Store::connect(&url, 8).await.unwrap();
        store.migrate().await.unwrap();
        TestDb {
            store,
            url,
            _dir: None,
            pg: Some((admin, name)),
        }
    }

    /// Another independent pool on the same database (like a second gateway instance).
    pub async fn second_store(&self) -> Store {
        Store::connect(&self.url, 4).await.unwrap()
    }

    /// Sets `setting` (`name = value`) on the PostgreSQL database for the sessions opened from
    /// now on, as an operator (or a failover) would.
    pub async fn alter_database(&self, setting: &str) {
        let (_, name) = self.pg.as_ref().expect("a PostgreSQL database");
        let sql = format!("ALTER DATABASE {name} SET {setting}");
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(self.store.pool())
            .await
            .unwrap();
    }

    /// Drops the PostgreSQL database (a failed test leaves it behind for inspection).
    pub async fn finish(self) {
        self.store.pool().close().await;
        if let Some((admin, name)) = self.pg {
            on_server(&admin, format!("DROP DATABASE {name} WITH (FORCE)")).await;
        }
    }
}

/// Runs `sql` on the PostgreSQL server at `admin` over a connection of its own: CREATE and
/// DROP DATABASE cannot run inside the database they name.
pub(super) async fn on_server(admin: &str, sql: String) {
    let admin_store = Store::connect(admin, 1)
        .await
        .unwrap_or_else(|e| panic!("{e}: is PostgreSQL up? run scripts/postgres.sh start"));
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(admin_store.pool())
        .await
        .unwrap();
    admin_store.pool().close().await;
}

/// `postgres://u@h:p/db?x` with `db` replaced.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// Runs each `async fn NAME(store: &TestDb)` of the calling module on SQLite and PostgreSQL,
/// as tests `NAME::sqlite` and `NAME::postgres`.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let db = crate::store::tests::TestDb::sqlite().await;
                super::$name(&db).await;
                db.finish().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let db = crate::store::tests::TestDb::postgres().await;
                super::$name(&db).await;
                db.finish().await;
            }
        }
    )*};
}
pub(super) use both_backends;

/// A request with no kv or outbox effects.
pub(super) fn request(route: &str, key: &str) -> CommitRequest {
    CommitRequest {
        route: route.into(),
        inbox_key: key.into(),
        namespace: "ns".into(),
        reads: vec![],
        writes: vec![],
        outbox: vec![],
    }
}

/// A request that read `key` at `observed_version` and writes `value` to it: one
/// read-modify-write of one key.
pub(super) fn read_modify_write(
    route: &str,
    inbox_key: &str,
    key: &str,
    observed_version: Option<i64>,
    value: Option<&[u8]>,
) -> CommitRequest {
    let mut req = request(route, inbox_key);
    req.reads = vec![read(key, observed_version)];
    req.writes = vec![write(key, value)];
    req
}

/// Commits the request `route`/`inbox_key` that only writes `writes` (blindly, no reads),
/// alone in its batch.
pub(super) async fn commit_writes(
    store: &Store,
    route: &str,
    inbox_key: &str,
    writes: Vec<KvWrite>,
) {
    let mut req = request(route, inbox_key);
    req.writes = writes;
    store.commit_batch(&[req]).await.unwrap();
}

pub(super) fn read(key: &str, observed_version: Option<i64>) -> KvRead {
    KvRead {
        key: key.into(),
        observed_version,
    }
}

pub(super) fn write(key: &str, value: Option<&[u8]>) -> KvWrite {
    KvWrite {
        key: key.into(),
        value: value.map(<[u8]>::to_vec),
    }
}

pub(super) fn event(routing_key: &str, payload: &[u8]) -> NewOutboxRow {
    NewOutboxRow {
        event_id: uuid::Uuid::now_v7().to_string(),
        route: "orders".into(),
        plugin: "order-handler".into(),
        exchange: "events".into(),
        routing_key: routing_key.into(),
        headers: vec![("x-trace".into(), "abc".into())],
        content_type: Some("application/json".into()),
        payload: payload.to_vec(),
        ordering_key: String::new(),
    }
}

/// A dead letter of `route` (to `route.dlq`) for `reason`, dead-lettered at `at` (unix ms)
/// after 5 attempts, with a binary body.
pub(super) fn dl(route: &str, reason: &str, at: i64) -> NewDeadLetter {
    NewDeadLetter {
        route: route.into(),
        queue: format!("{route}.dlq"),
        reason: reason.into(),
        plugin: Some("handler".into()),
        attempts: 5,
        headers: vec![("x-carteiro-attempt".into(), "5".into())],
        body: vec![0, 159, 146, 150, 0],
        first_failed_at: Some(at - 10),
        dead_lettered_at: at,
    }
}

/// The routing keys of `rows`, in order.
pub(super) fn keys(rows: &[OutboxRow]) -> Vec<&str> {
    rows.iter().map(|r| r.event.routing_key.as_str()).collect()
}

#[test]
fn replaces_the_database_of_a_url() {
    assert_eq!(
        with_database("postgres://u@h:1/carteiro?x=1", "t"),
        "postgres://u@h:1/t?x=1"
    );
}

#[tokio::test]
async fn unsupported_url_is_invalid() {
    let err = Store::connect("mysql://u:pw@h/db", 1).await.err().unwrap();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert!(!err.to_string().contains("pw"), "{err}");
}
