//! The durable store: idempotency inbox, plugin kv state, transactional outbox and dead
//! letters, on SQLite (embedded default) or PostgreSQL (production), through one sqlx `Any`
//! code path with `$1`-style bound parameters. Where the two differ, the store asks its
//! [`Dialect`].
//!
//! # Layout
//! - `backend/`: the [`Dialect`] interface and its two implementations (`sqlite`,
//!   `postgres`): every SQL and behaviour difference between the backends.
//! - `error`: [`StoreError`] and the transient/permanent classification.
//! - `migrations`: the embedded schema (`host/migrations/{sqlite,postgres}`).
//! - `commit/`: [`Store::commit_batch`], one transaction for many deliveries (G2): its
//!   set-based fast path (`set`), its savepoint-per-request fallback (`savepoints`), what
//!   both share (`request`: [`CommitRequest`]), and [`GroupCommitter`] (`committer`), the
//!   task that batches concurrent commits.
//! - `change_feed`: how the relay learns of commits besides polling ([`CommitWakeups`],
//!   the dialect's listener) and the logical replication slot's setup and lag.
//! - `inbox`, `kv`, `outbox`: reads and maintenance per table; `outbox_cdc`: the CDC
//!   relay's bookkeeping; `canaries`, `secrets`: canary decisions and the header-seal keys.
//! - `dead_letters/`: the dead-letter archive (`mod.rs`: archive, list, count, purge):
//!   `text`: [`NewDeadLetter`] and the lossless encoding that lets any of them be archived;
//!   `search`: what a dead letter is found by (message and correlation ids, a JSON body's
//!   fields: [`BodyField`]), worked out when it is archived, and the indexed
//!   [`SearchTerms`] of a filter; `search_page`: a search's page, its cost capped by
//!   [`SEARCH_EXAMINED_MAX`]; `hours`: dead letters per hour, for the console's charts;
//!   `history`: each replay and edit of a dead letter ([`DeadLetterEvent`]), the claims they
//!   take and the marks they leave; `edit_claims`: the claim an edited copy holds on its
//!   idempotency key until it settles ([`EditKeyClaim`]).
//! - `purge`: the batched delete every retention purge uses.
//! - `reads`: [`BatchedReads`], the pipeline's inbox and kv point reads, batched.
//! - `sql`: placeholder lists for statements built per batch.
//! - `nul_free`: the text check shared by every write (no NUL bytes on either backend).
//! - `tls`: the libpq-style `sslmode`/`sslrootcert`/`sslcert`/`sslkey` of a PostgreSQL URL.
//! - `config`: [`StoreConfig`] (`[store]`) and its checks.

mod application_outboxes;
mod backend;
mod canaries;
mod change_feed;
mod commit;
mod config;
mod dead_letters;
mod error;
mod inbox;
mod kv;
mod migrations;
mod nul_free;
mod outbox;
mod outbox_cdc;
mod purge;
mod reads;
mod secrets;
mod sql;
mod tls;

#[cfg(test)]
pub(crate) mod tests;

pub use application_outboxes::{AppFailure, Wait};
pub use backend::{
    Backend, Class, ColumnKind, Dialect, IndexWalk, Listen, Postgres, Privilege, Sqlite, UrlError,
    for_url,
};
pub use canaries::CanaryDecision;
pub use change_feed::CommitWakeups;
pub use commit::{
    CommitOutcome, CommitRequest, CommitterConfig, CommitterHandle, GroupCommitter, Handed,
    Handoff, KvRead, KvWrite, MAX_KV_KEYS_PER_COMMIT, NewOutboxRow, Room,
};
pub use config::StoreConfig;
pub(crate) use config::resolve_sqlite_path;
pub use dead_letters::{
    BodyField, DeadLetter, DeadLetterEvent, DeadLetterFilter, DeadLetterHour, DeadLetterPage,
    DeadLetterStat, EditKeyClaim, HOUR_MS, HeldEditClaim, KeyTaken, MAX_FIELD_BYTES, MAX_FIELDS,
    MAX_INDEXED_BODY, NewDeadLetter, SEARCH_EXAMINED_MAX, SearchTerms, body_fields,
};
pub use error::StoreError;
pub use kv::KvEntry;
pub use outbox::{OUTBOX_NOTIFY_CHANNEL, OutboxRow, OutboxStatus};
pub use purge::{RETENTION_BATCH, RETENTION_PAUSE};
pub use reads::BatchedReads;
pub use secrets::SealSecrets;
pub use tls::{StoreTlsError, check_tls_params};

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use sqlx::any::{AnyArguments, AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyConnection, AnyPool, AssertSqlSafe, ConnectOptions, Connection};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::redact::redact_url;

/// How to open a [`Store`] (`[store]` in the config).
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Connection pool size.
    pub max_connections: u32,
    /// PostgreSQL's `statement_timeout` on every connection; plus [`ACQUIRE_TIMEOUT`], the
    /// client-side bound on every store operation on both backends.
    pub statement_timeout: Duration,
}

/// `[store] statement_timeout`'s default.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

impl StoreOptions {
    /// `max_connections` with the default statement timeout.
    pub fn new(max_connections: u32) -> Self {
        Self {
            max_connections,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
        }
    }
}

/// A pool of connections to the store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    dialect: &'static dyn Dialect,
    redacted: Arc<str>,
    /// Client-side bound on one store operation (see [`Store::bounded`]).
    op_timeout: Duration,
    /// How the pool connects (for the migrations' own connection).
    options: Arc<AnyConnectOptions>,
    /// Where the database takes one writer at a time (`Dialect::one_writer`, SQLite):
    /// in-process writers queue here (FIFO) before they begin, instead of sleeping in the
    /// busy handler (steps of up to 100 ms) while another connection of the same pool holds
    /// the write lock. Shared by clones.
    writer: Arc<Mutex<()>>,
    /// `[security]`'s header-seal key; `None`: the key kept in `carteiro_secrets`.
    seal_secret: Option<Arc<[u8]>>,
}

/// Rows deleted per transaction by an operator's purge of dead letters (`dlq purge`, the
/// console); retention purges go in smaller batches (`purge`).
pub(crate) const PURGE_CHUNK: u64 = 10_000;

/// How long a caller waits for a pooled connection before the store counts as unavailable.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

impl Store {
    /// Connects (creating the SQLite file and its folder if missing), with the default
    /// statement timeout. Does not migrate.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        Self::connect_with(url, &StoreOptions::new(max_connections)).await
    }

    /// Connects with explicit options. Does not migrate.
    pub async fn connect_with(url: &str, opts: &StoreOptions) -> Result<Store, StoreError> {
        Self::open(url, opts, true).await
    }

    /// Connects to an application's database (`[[outboxes]] url`): never creates a SQLite
    /// file, never changes a database setting (`Dialect::database_setup`), never migrates.
    pub async fn connect_application(url: &str, opts: &StoreOptions) -> Result<Store, StoreError> {
        Self::open(url, opts, false).await
    }

    async fn open(url: &str, opts: &StoreOptions, own: bool) -> Result<Store, StoreError> {
        let max_connections = opts.max_connections;
        sqlx::any::install_default_drivers();
        crate::common::use_aws_lc_rs();
        let redacted: Arc<str> = redact_url(url).into();
        let Some(dialect) = backend::for_url(url) else {
            return Err(StoreError::Invalid(format!(
                "unsupported store URL {redacted}: expected sqlite://PATH or postgres://..."
            )));
        };
        let url = if own {
            dialect.prepare_url(url)?
        } else {
            url.to_owned()
        };
        let options: AnyConnectOptions = url.parse().map_err(|e: sqlx::Error| {
            let why = crate::redact::scrub(&e.to_string(), &url);
            StoreError::Invalid(format!("bad store URL {redacted}: {why}"))
        })?;
        let setup = if own { dialect.database_setup() } else { &[] };
        if !setup.is_empty() {
            let mut conn = options
                .connect()
                .await
                .map_err(|e| unavailable(&redacted, e))?;
            for statement in setup {
                sqlx::query(AssertSqlSafe(*statement))
                    .execute(&mut conn)
                    .await
                    .map_err(|e| unavailable(&redacted, e))?;
            }
            conn.close().await.map_err(|e| unavailable(&redacted, e))?;
        }
        let session: Arc<[String]> = dialect.session_setup(opts.statement_timeout).into();
        let pool = AnyPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // No ping before each use: it cost a round trip (a thread hand-off on SQLite) per
            // batch. A connection that died meanwhile fails its statement instead; callers
            // already treat that as a store failure (requeue, pause, retry) and sqlx drops
            // the broken connection, so the next attempt gets a fresh one.
            .test_before_acquire(false)
            // A connection whose transaction SQLite ended by itself (a COMMIT that failed with
            // SQLITE_FULL rolls back) keeps sqlx's transaction depth at 1: the ROLLBACK sqlx
            // then sends fails, and every later BEGIN on it is refused. Returned to the pool,
            // it kept the store "unavailable" after the disk had room again. Replace it.
            .before_acquire(|conn, _| {
                Box::pin(async move {
                    let stuck = conn.is_in_transaction();
                    if stuck {
                        tracing::warn!(
                            "store connection left inside a transaction the database already \
                             ended; replacing it"
                        );
                    }
                    Ok(!stuck)
                })
            })
            .after_connect(move |conn, _| {
                let session = session.clone();
                Box::pin(async move {
                    for statement in session.iter() {
                        sqlx::query(AssertSqlSafe(statement.as_str()))
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options.clone())
            .await
            .map_err(|e| unavailable(&redacted, e))?;
        Ok(Store {
            pool,
            dialect,
            redacted,
            op_timeout: opts.statement_timeout + ACQUIRE_TIMEOUT,
            options: Arc::new(options),
            writer: Arc::new(Mutex::new(())),
            seal_secret: None,
        })
    }

    /// Applies the embedded migrations of this backend (safe to run from several instances
    /// at once on PostgreSQL: sqlx takes an advisory lock). Not bounded by the statement
    /// timeout: building an index on a large table may take longer.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migrator = migrations::migrator(self.dialect.schema());
        if !self.dialect.migrate_apart() {
            migrator.run(&self.pool).await?;
            return Ok(());
        }
        // A one-connection pool of its own, without the pool's session settings.
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with((*self.options).clone())
            .await
            .map_err(|e| unavailable(&self.redacted, e))?;
        let result = migrator.run(&pool).await;
        pool.close().await;
        result?;
        Ok(())
    }

    /// Runs one store operation, bounded client-side by `statement_timeout` plus the pool's
    /// acquire timeout. Past it the operation is abandoned (its connection is dropped) and
    /// the result is `Unavailable`, as for any store outage: the caller does not ack. A
    /// commit abandoned this way may still have committed (its COMMIT was sent); the
    /// requeued delivery then meets its inbox record and is acked as a duplicate (G2).
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.op_timeout, op).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "{what}: {} did not answer within {:?}",
                self.redacted, self.op_timeout
            ))),
        }
    }

    /// The same store, with a header-seal key from outside it (`[security]`): the
    /// `carteiro_secrets` table is then neither read nor written for it.
    pub fn with_header_seal_secret(mut self, secret: Vec<u8>) -> Self {
        self.seal_secret = Some(secret.into());
        self
    }

    /// The backend behind this store (for tests and messages: what differs between
    /// backends is the [`Dialect`]'s).
    pub fn backend(&self) -> Backend {
        self.dialect.backend()
    }

    /// How this store's database spells what differs between backends.
    pub fn dialect(&self) -> &'static dyn Dialect {
        self.dialect
    }

    /// The URL with any password replaced by `***`, for logs and errors.
    pub fn redacted_url(&self) -> String {
        self.redacted.to_string()
    }

    /// The store gate's probe: a committed write, as the pipeline's commits make, so a held
    /// write lock, a full disk, a read-only file or database and a revoked grant all fail it.
    /// A read that answers proves none of these.
    pub async fn probe_write(&self) -> Result<(), StoreError> {
        self.ping().await?;
        self.bounded("write probe", async {
            let probe = sqlx::query(
                "INSERT INTO carteiro_write_probe (id, probed_at) VALUES (1, $1) \
                 ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at",
            )
            .bind(crate::common::now_ms());
            self.execute_write(probe).await?;
            Ok(())
        })
        .await
    }

    /// One round trip to the database: is it answering, and (PostgreSQL) taking writes? A
    /// read-only session (a standby after a failover, `default_transaction_read_only`)
    /// counts as unavailable.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.bounded("ping", async {
            let Some(check) = self.dialect.read_only_check() else {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                return Ok(());
            };
            let read_only: String = sqlx::query_scalar(AssertSqlSafe(check))
                .fetch_one(&self.pool)
                .await?;
            if read_only == "on" {
                return Err(StoreError::Unavailable(format!(
                    "{} is read-only (a standby after a failover, or \
                     default_transaction_read_only)",
                    self.redacted
                )));
            }
            Ok(())
        })
        .await
    }

    /// Begins a write transaction. Where the database takes one writer at a time (SQLite)
    /// it first takes the store's writer lock (held until the transaction ends, so
    /// in-process writers take turns in arrival order), then begins as the dialect says
    /// (SQLite's `BEGIN IMMEDIATE` takes the write lock up front).
    ///
    /// Use it like a `sqlx::Transaction`: `execute(&mut *tx)`, then `tx.commit().await?`.
    pub(crate) async fn begin_write(&self) -> Result<WriteTx, StoreError> {
        // Lock before taking a pooled connection: a queued writer holds no connection.
        let writer = match self.dialect.one_writer() {
            true => Some(self.writer.clone().lock_owned().await),
            false => None,
        };
        let tx = match self.dialect.begin_write() {
            Some(begin) => self.pool.begin_with(begin).await?,
            None => self.pool.begin().await?,
        };
        Ok(WriteTx {
            tx,
            _writer: writer,
        })
    }

    /// Runs one statement in a write transaction of its own ([`Store::begin_write`]) and
    /// commits it; returns how many rows it changed.
    pub(crate) async fn execute_write(
        &self,
        statement: sqlx::query::Query<'_, sqlx::Any, AnyArguments>,
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin_write().await?;
        let done = statement.execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }
}

/// A write transaction from [`Store::begin_write`]; derefs to the connection it runs on.
/// Dropped without `commit`, it rolls back (like `sqlx::Transaction`) and lets the next
/// writer in.
pub(crate) struct WriteTx {
    // Field order matters: the transaction ends before the writer lock is released.
    tx: sqlx::Transaction<'static, sqlx::Any>,
    _writer: Option<OwnedMutexGuard<()>>,
}

impl WriteTx {
    /// Commits, then lets the next in-process writer in.
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }

    /// Rolls back, then lets the next in-process writer in.
    #[allow(dead_code)] // part of the transaction API; callers so far commit or drop
    pub(crate) async fn rollback(self) -> Result<(), sqlx::Error> {
        self.tx.rollback().await
    }
}

impl Deref for WriteTx {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        &self.tx
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        &mut self.tx
    }
}

fn unavailable(redacted: &str, e: sqlx::Error) -> StoreError {
    // sqlx reports a refused TLS setup as `Tls`, and a failed handshake (an untrusted or
    // misnamed certificate) as the I/O error wrapping rustls's.
    let tls_failure = match &e {
        sqlx::Error::Tls(why) => Some(why.to_string()),
        sqlx::Error::Io(io)
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>()) =>
        {
            Some(io.to_string())
        }
        _ => None,
    };
    if let Some(why) = tls_failure {
        return StoreError::Unavailable(format!(
            "cannot connect to {redacted}: TLS with the database failed: {why}; check the URL's \
             sslmode, sslrootcert (the CA that signed the server's certificate), the host name \
             (verify-full checks it against the certificate) and sslcert/sslkey"
        ));
    }
    match StoreError::from(e) {
        StoreError::Unavailable(m) | StoreError::Database(m) => {
            StoreError::Unavailable(format!("cannot connect to {redacted}: {m}"))
        }
        other => other,
    }
}

/// Wall-clock unix milliseconds, the unit of every timestamp column.
pub(crate) use crate::common::now_ms;

/// Headers as JSON text: `[["name","value"], ...]` keeps order and duplicates.
pub(crate) fn headers_to_json(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).unwrap_or_else(|_| "[]".to_string())
}

pub(crate) fn headers_from_json(text: &str) -> Result<Vec<(String, String)>, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Database(format!("stored headers are not valid JSON: {e}")))
}
