//! `[[outboxes]]`: the story's own `outbox_events` table, written by a Python service with
//! SQLAlchemy 2.0 (interleaved transactions, some rolled back) and relayed by the real
//! `carteiro relay` process, SIGKILLed and restarted while rows commit.

mod failures;
mod helper;
mod keyed;
mod story;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::resilience::{Running, carteiro};
use crate::support::{Client, amqp_url, message_id, pg_database, repo, unique, wait_for};

const WAIT: Duration = Duration::from_secs(120);

/// The venv `scripts/test-python-client.sh` builds (SQLAlchemy 2 and psycopg), which
/// `scripts/test.sh` runs before these tests.
pub fn python() -> PathBuf {
    let python = repo().join(".local/outbox-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test-python-client.sh once (scripts/test.sh does)",
        python.display()
    );
    python
}

/// The application's database: the URL Carteiro reads and the one SQLAlchemy takes.
pub struct AppDb {
    pub url: String,
    pub sqlalchemy: String,
    /// The replication slot and publication of `mode = "cdc"`: slots are the server's, not
    /// the database's, so each test has its own.
    pub slot: String,
    _dir: Option<tempfile::TempDir>,
}

impl AppDb {
    pub async fn postgres() -> Self {
        Self::on_postgres(pg_database().await)
    }

    /// A PostgreSQL database that does not exist yet ([`AppDb::create_database`] makes it).
    pub fn postgres_later() -> Self {
        let admin =
            std::env::var("CARTEIRO_TEST_POSTGRES_URL").expect("CARTEIRO_TEST_POSTGRES_URL");
        let (server, _) = admin.rsplit_once('/').expect("a database URL");
        let name = format!("e2e_later_{}", uuid::Uuid::now_v7().simple());
        Self::on_postgres(format!("{server}/{name}"))
    }

    /// Creates the database of [`AppDb::postgres_later`].
    pub async fn create_database(&self) {
        use sqlx::{Connection, Executor};
        let (server, name) = self.url.rsplit_once('/').expect("a database URL");
        let mut admin = sqlx::PgConnection::connect(&format!("{server}/postgres"))
            .await
            .expect("connect to the server");
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .expect("create database");
    }

    fn on_postgres(url: String) -> Self {
        let sqlalchemy = url.replacen("postgres://", "postgresql+psycopg://", 1);
        Self {
            url,
            sqlalchemy,
            slot: format!("e2e_app_{}", uuid::Uuid::now_v7().simple()),
            _dir: None,
        }
    }

    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("matriculas.db");
        Self {
            url: format!("sqlite://{}", path.display()),
            sqlalchemy: format!("sqlite:///{}", path.display()),
            slot: String::new(),
            _dir: Some(dir),
        }
    }

    /// Runs the story's service: `create` the table, or `write` rows.
    pub fn story(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(python());
        cmd.arg(repo().join("tests/e2e/python/story_outbox.py"))
            .arg(&self.sqlalchemy)
            .args(args);
        cmd
    }

    pub fn create_table(&self) {
        let out = self.story(&["create"]).output().expect("python runs");
        assert!(
            out.status.success(),
            "create_all failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    async fn connection(&self) -> sqlx::AnyConnection {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        sqlx::AnyConnection::connect(&self.url)
            .await
            .expect("connect to the application's database")
    }

    /// Runs SQL on the application's database.
    pub async fn execute(&self, sql: &str) {
        let mut conn = self.connection().await;
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// One number the application's database answers.
    pub async fn count(&self, sql: &str) -> i64 {
        let mut conn = self.connection().await;
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Runs the story's service to its end: `n` transactions (`args` as `story_outbox.py`
    /// takes them); what it committed and rolled back, also kept in `out`.
    pub fn write(&self, out: &Path, n: usize, args: &[&str]) -> Written {
        let done = self
            .story(&["write", &n.to_string(), &out.display().to_string()])
            .args(args)
            .output()
            .expect("the story's service runs");
        assert!(
            done.status.success(),
            "the story's service failed: {}",
            String::from_utf8_lossy(&done.stderr)
        );
        read_written(out)
    }

    /// Rows not yet marked published.
    pub async fn unpublished(&self) -> i64 {
        self.count(
            "SELECT CAST(COUNT(*) AS BIGINT) FROM outbox_events \
             WHERE NOT publicado OR publicado_em IS NULL",
        )
        .await
    }
}

/// The issue's configuration, exactly as written, on `db` and a SQLite store in `dir`.
pub fn story_config(dir: &Path, db: &AppDb, exchange: &str, mode: &str, extra: &str) -> PathBuf {
    let toml = format!(
        r#"version = 1
[broker]
url = "{amqp}"
reconnect_max_backoff = "1s"
[store]
url = "sqlite://{dir}/carteiro.db"
[relay]
enabled = false

[[outboxes]]
name = "matriculas"
url = "{url}"   # the application's database (PostgreSQL or SQLite)
table = "outbox_events"
exchange = "{exchange}"        # must already exist; checked at start, named if missing
mode = "{mode}"                  # or "cdc" (PostgreSQL)
{slot}{extra}
[outboxes.columns]
id = "id"                      # increasing integer key (required)
event_id = "evento_id"         # AMQP message_id (required)
type = "tipo"                  # AMQP type
routing_key = "routing_key"
payload = "payload"            # the body: text, bytea, json or jsonb
published = "publicado"        # set true after the row's own confirm
published_at = "publicado_em"  # set to the confirm's time
"#,
        amqp = amqp_url(),
        dir = dir.display(),
        url = db.url,
        slot = if mode == "cdc" {
            format!("slot = \"{0}\"\npublication = \"{0}\"\n", db.slot)
        } else {
            String::new()
        },
    );
    let path = dir.join("carteiro.toml");
    std::fs::write(&path, toml).expect("config");
    path
}

/// `carteiro relay -c CONFIG`, once it relays (or stands by).
pub async fn relay(config: &Path, ready: &str) -> Running {
    let mut cmd = carteiro();
    cmd.args(["relay", "-c"]).arg(config);
    let mut running = Running::spawn(cmd);
    running.wait_stderr(ready, WAIT).await;
    running
}

/// What the story's service committed and rolled back.
pub struct Written {
    pub committed: HashSet<String>,
    pub rolled_back: Vec<String>,
}

pub fn read_written(path: &Path) -> Written {
    let text = std::fs::read_to_string(path).expect("writer output");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let list = |k: &str| -> Vec<String> {
        v[k].as_array()
            .expect("list")
            .iter()
            .map(|s| s.as_str().expect("id").to_owned())
            .collect()
    };
    Written {
        committed: list("committed").into_iter().collect(),
        rolled_back: list("rolled_back"),
    }
}

/// Reads `sink` until every id of `want` arrived; returns how many times each id came.
pub async fn receive_all(
    client: &Client,
    sink: &str,
    want: &HashSet<String>,
) -> HashMap<String, usize> {
    let seen = std::sync::Mutex::new(HashMap::<String, usize>::new());
    wait_for(
        &format!("{} events on {sink}", want.len()),
        WAIT,
        || async {
            for m in client.drain(sink).await {
                assert_eq!(
                    m.properties.kind().as_ref().map(|t| t.as_str()),
                    Some("matricula.confirmada"),
                    "the type column is the AMQP type"
                );
                *seen
                    .lock()
                    .expect("lock")
                    .entry(message_id(&m))
                    .or_default() += 1;
            }
            let seen = seen.lock().expect("lock");
            want.iter().all(|id| seen.contains_key(id)).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut seen = seen.into_inner().expect("lock");
    for m in client.drain(sink).await {
        *seen.entry(message_id(&m)).or_default() += 1;
    }
    seen
}

/// What each test of the story's table starts with: a client, an exchange with a queue
/// bound to all of it, and the issue's configuration on `db` in a folder of its own.
pub struct Story {
    pub client: Client,
    pub exchange: String,
    pub sink: String,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
}

impl Story {
    pub async fn new(db: &AppDb, mode: &str, extra: &str) -> Self {
        let client = Client::connect().await;
        let exchange = exchange_name();
        let sink = client.sink(&exchange).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let config = story_config(dir.path(), db, &exchange, mode, extra);
        Self {
            client,
            exchange,
            sink,
            dir,
            config,
        }
    }
}

pub fn exchange_name() -> String {
    unique("matriculas")
}
