//! The services a campaign owns, through the project's scripts: its own RabbitMQ (one node
//! or a cluster) and its own PostgreSQL, on ports apart from the test suite's, so a campaign
//! can restart them freely.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::Connection;

/// First port of the cluster's nodes.
const CLUSTER_PORT: u16 = 5700;

/// The broker's `consumer_timeout` in every campaign: a long store outage outlasts it, so
/// the broker takes held deliveries back and the routes must reconnect.
pub const CONSUMER_TIMEOUT: Duration = Duration::from_secs(60);

/// `CARTEIRO_CHAOS_PORT_OFFSET=N` moves the single-node broker and PostgreSQL to their ports
/// plus N, under instance names of their own (`chaosN`), so that a campaign can run while
/// another tree's campaign services are still up. The cluster's ports do not move.
fn offset() -> u16 {
    std::env::var("CARTEIRO_CHAOS_PORT_OFFSET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn instance(port: u16) -> (String, u16) {
    match offset() {
        0 => ("chaos".to_owned(), port),
        o => (format!("chaos{o}"), port + o),
    }
}

/// The single-node broker instance and its port.
fn broker_instance() -> (String, u16) {
    instance(5690)
}

/// The PostgreSQL instance and its port.
fn postgres_instance() -> (String, u16) {
    instance(55440)
}

/// RabbitMQ: one node, or `nodes` cluster members.
pub struct Broker {
    repo: PathBuf,
    nodes: usize,
    cluster: bool,
}

impl Broker {
    /// Starts a broker with no state from earlier runs.
    pub fn fresh(repo: &Path, cluster: bool) -> anyhow::Result<Self> {
        let broker = Self {
            repo: repo.to_owned(),
            nodes: if cluster { 3 } else { 1 },
            cluster,
        };
        if cluster {
            broker.script(&["cluster", "stop"])?;
        } else {
            broker.script(&["stop", &broker_instance().0])?;
        }
        for i in 0..broker.nodes {
            let dir = repo.join(".local/rabbitmq").join(broker.node(i));
            if dir.exists() {
                std::fs::remove_dir_all(&dir)
                    .with_context(|| format!("remove {}", dir.display()))?;
            }
        }
        if cluster {
            broker.script(&["cluster", "start", "3", &CLUSTER_PORT.to_string()])?;
        } else {
            let (name, port) = broker_instance();
            broker.script(&["start", &name, &port.to_string()])?;
        }
        Ok(broker)
    }

    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Every node's AMQP URL.
    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes)
            .map(|i| format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port(i)))
            .collect()
    }

    fn node(&self, i: usize) -> String {
        if self.cluster {
            format!("cluster-{}", i + 1)
        } else {
            broker_instance().0
        }
    }

    fn port(&self, i: usize) -> u16 {
        if self.cluster {
            CLUSTER_PORT + i as u16
        } else {
            broker_instance().1
        }
    }

    /// Graceful stop of node `i` (waits until its process is gone).
    pub fn stop(&self, i: usize) -> anyhow::Result<()> {
        self.script(&["stop", &self.node(i)])
    }

    /// Starts node `i` again (it rejoins its cluster from its own state).
    pub fn start(&self, i: usize) -> anyhow::Result<()> {
        self.script(&["start", &self.node(i), &self.port(i).to_string()])
    }

    /// SIGKILL of node `i`'s Erlang VM: no goodbye to clients or peers.
    pub fn kill(&self, i: usize) -> anyhow::Result<()> {
        let pid_file = self
            .repo
            .join(".local/rabbitmq")
            .join(self.node(i))
            .join("rabbitmq.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("read {}", pid_file.display()))?;
        let pid = pid.trim();
        signal("KILL", pid)?;
        // The VM is gone once its pid is; bounded, it dies at once.
        for _ in 0..100 {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(&pid_file);
        Ok(())
    }

    /// The node (index) leading quorum queue `queue`, when the cluster can say.
    pub fn leader(&self, queue: &str) -> Option<usize> {
        let out = Command::new(self.repo.join("scripts/rabbitmq.sh"))
            .args(["cluster", "leader", queue])
            .output()
            .ok()?;
        let name = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (0..self.nodes).find(|&i| self.node(i) == name)
    }

    fn script(&self, args: &[&str]) -> anyhow::Result<()> {
        // Every (re)start writes the node's rabbitmq.conf with these lines.
        let extra = format!("consumer_timeout = {}", CONSUMER_TIMEOUT.as_millis());
        run_with(
            &self.repo.join("scripts/rabbitmq.sh"),
            args,
            &[("CARTEIRO_RABBITMQ_CONF_EXTRA", extra.as_str())],
        )
    }
}

/// How long PostgreSQL waits for a silent (paused) CDC relay before it ends its walsender
/// and frees the slot: 4 s, shorter than a pause fault.
const WAL_SENDER_TIMEOUT: &str = "ALTER SYSTEM SET wal_sender_timeout = '4s'";

/// The campaign's PostgreSQL instance and its database `chaos`.
#[derive(Clone)]
pub struct Postgres {
    repo: PathBuf,
}

impl Postgres {
    /// Starts the server and makes an empty `chaos` database. `cdc`: the relays read a
    /// replication slot, and a paused relay's walsender ends after [`WAL_SENDER_TIMEOUT`], so
    /// that a pause outlasts it and the standby takes the slot over meanwhile.
    pub async fn fresh(repo: &Path, cdc: bool) -> anyhow::Result<Self> {
        let pg = Self {
            repo: repo.to_owned(),
        };
        tokio::task::block_in_place(|| pg.start())?;
        // A run that died mid-flip must not leave the server read-only.
        tokio::task::block_in_place(|| pg.read_only(false))?;
        let mut admin = pg.admin("postgres").await?;
        // The gateways connect as a role that owns its database but is no superuser, so
        // that revoking its grants (a fault) binds: superusers bypass grants.
        let wal_sender_timeout = if cdc {
            WAL_SENDER_TIMEOUT
        } else {
            "ALTER SYSTEM RESET wal_sender_timeout"
        };
        for sql in [
            // A slot left by an earlier run would keep its database from being dropped.
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
             WHERE database = 'chaos' AND NOT active",
            "DROP DATABASE IF EXISTS chaos WITH (FORCE)",
            "DROP ROLE IF EXISTS chaos",
            // REPLICATION: the CDC relays create and read their slot as this role.
            "CREATE ROLE chaos LOGIN NOSUPERUSER REPLICATION",
            "CREATE DATABASE chaos OWNER chaos",
            wal_sender_timeout,
            "SELECT pg_reload_conf()",
        ] {
            sqlx::raw_sql(sql)
                .execute(&mut admin)
                .await
                .with_context(|| format!("PostgreSQL set-up: {sql}"))?;
        }
        Ok(pg)
    }

    pub fn url(&self) -> String {
        format!("postgres://chaos@127.0.0.1:{}/chaos", postgres_instance().1)
    }

    /// Revokes (`false`) or grants back (`true`) the gateways' INSERT, UPDATE and DELETE on
    /// every table: each write then fails with SQLSTATE 42501, reads still work.
    pub async fn grants(&self, on: bool) -> anyhow::Result<()> {
        let sql = if on {
            "GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO chaos"
        } else {
            "REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public FROM chaos"
        };
        let mut admin = self.admin("chaos").await?;
        sqlx::raw_sql(sql)
            .execute(&mut admin)
            .await
            .with_context(|| format!("PostgreSQL: {sql}"))?;
        let _ = admin.close().await;
        Ok(())
    }

    pub fn start(&self) -> anyhow::Result<()> {
        let (name, port) = postgres_instance();
        self.script(&["start", &name, &port.to_string()])
    }

    /// Fast shutdown: every connection is cut, in-flight transactions roll back.
    pub fn stop(&self) -> anyhow::Result<()> {
        self.script(&["stop", &postgres_instance().0])
    }

    /// Switches every session to read-only (`on`) or back: writes fail with SQLSTATE 25006.
    pub fn read_only(&self, on: bool) -> anyhow::Result<()> {
        let set = if on {
            "ALTER SYSTEM SET default_transaction_read_only = on"
        } else {
            "ALTER SYSTEM RESET default_transaction_read_only"
        };
        // psql runs each -c on its own, outside a transaction block, as ALTER SYSTEM needs.
        let port = postgres_instance().1.to_string();
        let args = [
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-q",
        ];
        run(
            Path::new("psql"),
            &[&args[..], &["-c", set, "-c", "SELECT pg_reload_conf()"]].concat(),
        )
    }

    /// A superuser session on `database`.
    async fn admin(&self, database: &str) -> anyhow::Result<sqlx::PgConnection> {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/{database}",
            postgres_instance().1
        );
        let mut conn =
            tokio::time::timeout(Duration::from_secs(10), sqlx::PgConnection::connect(&url))
                .await
                .context("connect to PostgreSQL timed out")??;
        // This session must be able to write even while the server is read-only.
        sqlx::raw_sql("SET default_transaction_read_only = off")
            .execute(&mut conn)
            .await?;
        Ok(conn)
    }

    fn script(&self, args: &[&str]) -> anyhow::Result<()> {
        run(&self.repo.join("scripts/postgres.sh"), args)
    }
}

/// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to `pid`.
pub fn signal(signal: &str, pid: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_owned()])
        .status()?;
    if !status.success() {
        bail!("kill -{signal} {pid} failed");
    }
    Ok(())
}

fn run(script: &Path, args: &[&str]) -> anyhow::Result<()> {
    run_with(script, args, &[])
}

fn run_with(script: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<()> {
    let out = Command::new(script)
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("run {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} failed: {}",
            script.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
