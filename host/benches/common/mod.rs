//! Helpers shared by the benchmarks (each includes this file with `mod common;`; not a
//! benchmark of its own): settings, the backends to run on, statistics, throw-away
//! PostgreSQL databases, and the CPU budget of a timed window.
//!
//! The CPU budget answers "where did the two cores go?" for one window: this process, the
//! broker (`beam.smp`), the PostgreSQL server (every `postgres` process) and the whole box,
//! read from `/proc` (Linux only; elsewhere every figure reads 0). A process counts only if
//! it is alive at both ends of the window; the benchmarks keep their connections open across
//! it, so every PostgreSQL backend that does the work is counted.

#![allow(dead_code)] // each benchmark uses its own subset

use std::time::Duration;

/// `name` parsed from the environment, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The benchmarks' broker (`CARTEIRO_TEST_AMQP_URL`); fails with what to run when unset.
pub fn amqp_url() -> String {
    std::env::var("CARTEIRO_TEST_AMQP_URL").unwrap_or_else(|_| {
        panic!("CARTEIRO_TEST_AMQP_URL is not set: run bench/run.sh (or scripts/rabbitmq.sh start and export the URL)")
    })
}

/// The comma-separated list in the environment variable `name` (or `default`), each item
/// read by `parse`; items it does not know are skipped.
pub fn env_list<T>(name: &str, default: &str, parse: impl Fn(&str) -> Option<T>) -> Vec<T> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .filter_map(|item| parse(item.trim()))
        .collect()
}

/// The PostgreSQL server to make databases on (`CARTEIRO_TEST_POSTGRES_URL`). Without one,
/// the `systems` that `on_postgres` picks are dropped from the run, and a line says so.
pub fn postgres_admin<T>(systems: &mut Vec<T>, on_postgres: impl Fn(&T) -> bool) -> Option<String> {
    let admin = std::env::var("CARTEIRO_TEST_POSTGRES_URL").ok();
    if admin.is_none() && systems.iter().any(&on_postgres) {
        println!("CARTEIRO_TEST_POSTGRES_URL is not set: skipping PostgreSQL");
        systems.retain(|system| !on_postgres(system));
    }
    admin
}

/// A choice a benchmark reads from a `BENCH_*` list ([`env_list`]) and names in its output.
pub trait Named: Copy + 'static {
    /// Every choice.
    const ALL: &'static [Self];

    /// Its name in the list and in the output.
    fn name(self) -> &'static str;

    /// The choice `name` stands for.
    fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|choice| choice.name() == name)
    }
}

/// A database a benchmark runs on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Named for Backend {
    const ALL: &'static [Backend] = &[Backend::Sqlite, Backend::Postgres];

    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// The backends `BENCH_BACKENDS` names (default `sqlite,postgres`), and the PostgreSQL
/// server to make databases on: without one, PostgreSQL is left out ([`postgres_admin`]).
pub fn backends() -> (Vec<Backend>, Option<String>) {
    let mut backends = env_list("BENCH_BACKENDS", "sqlite,postgres", Backend::parse);
    let pg_admin = postgres_admin(&mut backends, |backend| *backend == Backend::Postgres);
    (backends, pg_admin)
}

/// A connection to the broker at `url`.
pub async fn connect_amqp(url: &str) -> lapin::Connection {
    lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ")
}

/// Deletes `queues` and then `exchange`, whichever of them exist: the cleanup after a run.
pub async fn delete_queues_and_exchange(conn: &lapin::Connection, queues: &[&str], exchange: &str) {
    let channel = conn.create_channel().await.expect("channel");
    for queue in queues {
        let options = lapin::options::QueueDeleteOptions::default();
        let _ = channel.queue_delete((*queue).into(), options).await;
    }
    let options = lapin::options::ExchangeDeleteOptions::default();
    let _ = channel.exchange_delete(exchange.into(), options).await;
    let _ = channel.close(200, "cleanup".into()).await;
}

/// `prefix-<uuid v7>`: names no earlier run used.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

/// The median (mean of the middle two for an even count); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

// ---------------------------------------------------------------- PostgreSQL databases

/// A fresh PostgreSQL database on the admin server; returns (name, url).
pub async fn create_pg_database(admin: &str) -> (String, String) {
    use sqlx::Connection as _;
    use sqlx::Executor;
    let name = format!("bench_{}", uuid::Uuid::now_v7().simple());
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .expect("connect to PostgreSQL");
    conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await
        .expect("create database");
    let _ = conn.close().await;
    (name.clone(), database_url(admin, &name))
}

/// `admin` with its database name replaced by `name` (query string kept).
pub fn database_url(admin: &str, name: &str) -> String {
    let (base, query) = match admin.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (admin, String::new()),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let host_part = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    format!("{host_part}/{name}{query}")
}

/// Drops a database made by [`create_pg_database`], closing its connections.
pub async fn drop_pg_database(admin: &str, name: &str) {
    use sqlx::Connection as _;
    use sqlx::Executor;
    if let Ok(mut conn) = sqlx::PgConnection::connect(admin).await {
        let _ = conn
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .await;
        let _ = conn.close().await;
    }
}

// ---------------------------------------------------------------- CPU budget

/// Kernel clock ticks per second for `/proc` times (USER_HZ: 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds used so far, read at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSample {
    own: f64,
    broker: f64,
    postgres: f64,
    /// Busy seconds of all cores together (everything but idle and I/O wait).
    box_busy: f64,
}

impl CpuSample {
    pub fn now() -> CpuSample {
        let mut sample = CpuSample {
            own: process_seconds("self").unwrap_or(0.0),
            box_busy: box_busy_seconds(),
            ..CpuSample::default()
        };
        for (_, stat) in process_stats() {
            let seconds = stat_seconds(&stat);
            match stat_command(&stat) {
                "beam.smp" => sample.broker += seconds,
                "postgres" => sample.postgres += seconds,
                _ => {}
            }
        }
        sample
    }

    /// What was used from `self` to `later`, over `wall` and for `units` messages or rows.
    pub fn until(&self, later: &CpuSample, wall: Duration, units: usize) -> CpuBudget {
        let per_unit = |a: f64, b: f64| (b - a).max(0.0) * 1e6 / units.max(1) as f64;
        CpuBudget {
            own_us: per_unit(self.own, later.own),
            broker_us: per_unit(self.broker, later.broker),
            postgres_us: per_unit(self.postgres, later.postgres),
            box_cores: (later.box_busy - self.box_busy).max(0.0) / wall.as_secs_f64().max(1e-9),
            own_cores: (later.own - self.own).max(0.0) / wall.as_secs_f64().max(1e-9),
        }
    }
}

/// CPU per message (or row) in one timed window, in µs, by who spent it.
#[derive(Debug, Clone, Copy)]
pub struct CpuBudget {
    pub own_us: f64,
    pub broker_us: f64,
    pub postgres_us: f64,
    /// Busy cores of the whole box, averaged over the window (2.0 = both cores saturated).
    pub box_cores: f64,
    /// Cores this process used, averaged over the window.
    pub own_cores: f64,
}

impl std::fmt::Display for CpuBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cpu per unit: this process {:.0} µs, broker {:.0} µs",
            self.own_us, self.broker_us
        )?;
        if self.postgres_us > 0.0 {
            write!(f, ", postgresql {:.0} µs", self.postgres_us)?;
        }
        write!(f, "; box busy {:.2} cores", self.box_cores)
    }
}

/// The pid and the `/proc/<pid>/stat` line of every process readable now (none where there
/// is no `/proc`).
fn process_stats() -> impl Iterator<Item = (String, String)> {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    entries.filter_map(|entry| {
        let pid = entry.file_name().into_string().ok()?;
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        Some((pid, stat))
    })
}

/// utime + stime of `/proc/<pid>`, in seconds.
fn process_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat_seconds(&stat))
}

/// The command name of a `/proc/<pid>/stat` line (between the first '(' and the last ')').
fn stat_command(stat: &str) -> &str {
    match (stat.find('('), stat.rfind(')')) {
        (Some(open), Some(close)) if open < close => &stat[open + 1..close],
        _ => "",
    }
}

/// utime + stime of a `/proc/<pid>/stat` line, in seconds.
fn stat_seconds(stat: &str) -> f64 {
    let fields = stat_fields(stat);
    // state is field 3 overall = index 0 here; utime/stime are fields 14/15 = index 11/12.
    (ticks(&fields, 11) + ticks(&fields, 12)) / TICKS_PER_SECOND
}

/// Busy seconds of all cores from the `cpu` line of `/proc/stat`.
fn box_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    let values: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: f64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0.0) + values.get(4).copied().unwrap_or(0.0);
    (total - idle) / TICKS_PER_SECOND
}

/// CPU seconds used so far by the PostgreSQL server listening on `port`, the way
/// scripts/postgres.sh starts it (`postgres -D DATA -p PORT ...`): its postmaster (found by
/// `-p PORT` on its command line), every living child (backends, WAL senders, background
/// workers), and through the postmaster's cutime + cstime every child it has reaped, so a
/// backend that ends inside a window still counts. Other servers on the box are left out.
/// `None` when no such postmaster is found (another host, or the port set elsewhere).
pub fn postgres_server_seconds(port: u16) -> Option<f64> {
    let port = port.to_string();
    let mut postmaster = None;
    let mut stats = Vec::new();
    for (pid, stat) in process_stats() {
        if postmaster.is_none() && stat_command(&stat) == "postgres" && listens_on(&pid, &port) {
            postmaster = Some(pid.clone());
        }
        stats.push((pid, stat));
    }
    let postmaster = postmaster?;
    let mut total = 0.0;
    for (pid, stat) in &stats {
        let fields = stat_fields(stat);
        let field = |i: usize| ticks(&fields, i);
        // After the command: ppid is index 1, utime/stime 11/12, cutime/cstime 13/14.
        if *pid == postmaster {
            total += field(11) + field(12) + field(13) + field(14);
        } else if fields.get(1).copied() == Some(postmaster.as_str()) {
            total += field(11) + field(12);
        }
    }
    Some(total / TICKS_PER_SECOND)
}

/// Whether `/proc/<pid>/cmdline` holds `-p PORT` (or `-pPORT`).
fn listens_on(pid: &str, port: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.windows(2)
        .any(|w| w[0] == b"-p" && w[1] == port.as_bytes())
        || args
            .iter()
            .any(|a| a.strip_prefix(b"-p") == Some(port.as_bytes()))
}

/// The fields of a `/proc/<pid>/stat` line after the command name (state first): the name
/// may hold spaces, so they start after the last ')'.
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split_whitespace()
        .collect()
}

/// Field `i` of [`stat_fields`], a count of clock ticks (0 when missing).
fn ticks(fields: &[&str], i: usize) -> f64 {
    fields
        .get(i)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}
