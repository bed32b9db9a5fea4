//! Faults: what they are, how likely each is on a backend, and how each is injected and
//! healed. One fault at a time; the schedule comes from the seed.

use std::path::PathBuf;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;
use sqlx::Connection;

use crate::checker::Repairs;
use crate::config::{
    EVENT_KEYS, EVENTS_EXCHANGE, HEARTBEAT, LEASE, RECONNECT_MAX, ROUTE_ENROLL, ROUTE_LARGE,
    ROUTE_POISON,
};
use crate::dlq_repair::Operator;
use crate::procs::Proc;
use crate::services::{Broker, Postgres};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL of a gateway, restarted at once.
    KillGateway,
    /// SIGKILL of a relay process, restarted at once.
    KillRelay,
    /// SIGSTOP of a gateway or relay for longer than the lease and the heartbeat.
    Pause,
    /// CDC: SIGSTOP of the relay reading the slot, past its walsender's timeout, so that the
    /// standby takes the slot over; once resumed it must publish nothing (its fence).
    PauseSlotHolder,
    /// Graceful restart of a broker node.
    BrokerRestart,
    /// A broker node down for longer than the reconnect backoff.
    BrokerOutage,
    /// PostgreSQL fast shutdown and start.
    PgRestart,
    /// PostgreSQL read-only for a few seconds.
    PgReadOnly,
    /// Another process holds SQLite's write lock.
    SqliteLock,
    /// SIGKILL of a cluster node (the quorum leader half the time), then its rejoin.
    NodeKill,
    /// SQLite's write lock held for a long time (many store-gate rounds; in a full run past
    /// the broker's `consumer_timeout`).
    SqliteLockLong,
    /// PostgreSQL: the gateways' role loses INSERT, UPDATE and DELETE for a long time.
    PgRevoke,
    /// `carteiro seal rotate`: new copies sealed with a new key, the old one still verifies.
    SealRotate,
    /// One event type unbound everywhere for a while (its rows are returned unroutable),
    /// then bound again.
    Unroutable,
    /// An outbox row AMQP can never carry (a routing key or a content type over 255 bytes),
    /// committed straight into the store, unordered or under a key of its own: the relay
    /// must park it with its error once and hold back nothing else.
    PoisonRow,
    /// One transaction of many large outbox rows under one ordering key, committed straight
    /// into the store: several times the relays' byte window, so a relay must publish it in
    /// pieces, in order, each row once.
    LargeTransaction,
    /// Two `carteiro dlq edit` of one dead letter and two filtered `carteiro dlq replay` of
    /// its route, all at once (`dlq_repair`).
    DlqRepair,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillGateway => "gateway SIGKILL",
            Fault::KillRelay => "relay SIGKILL",
            Fault::Pause => "SIGSTOP/SIGCONT",
            Fault::PauseSlotHolder => "CDC slot holder SIGSTOP",
            Fault::BrokerRestart => "broker restart",
            Fault::BrokerOutage => "broker stopped",
            Fault::PgRestart => "PostgreSQL restart",
            Fault::PgReadOnly => "PostgreSQL read-only",
            Fault::SqliteLock => "SQLite write lock held",
            Fault::NodeKill => "cluster node SIGKILL",
            Fault::SqliteLockLong => "SQLite write lock, long",
            Fault::PgRevoke => "PostgreSQL grants revoked",
            Fault::SealRotate => "seal-key rotation",
            Fault::Unroutable => "unroutable event type",
            Fault::PoisonRow => "unpublishable outbox row",
            Fault::LargeTransaction => "large outbox transaction",
            Fault::DlqRepair => "concurrent DLQ edits and replays",
        }
    }

    /// A long fault: it runs beside the others instead of holding the campaign up while it
    /// lasts.
    pub fn in_background(self) -> bool {
        matches!(
            self,
            Fault::PgRevoke | Fault::SqliteLockLong | Fault::Unroutable
        )
    }

    /// Whether it may start while `active` (background faults) last: not a second copy of
    /// one, no other hold of SQLite's write lock, and no rows written into a store that
    /// refuses writes (they would only wait out their timeout).
    pub fn fits_beside(self, active: &[Fault]) -> bool {
        let store_refuses = active
            .iter()
            .any(|f| matches!(f, Fault::PgRevoke | Fault::SqliteLockLong));
        let writes_store = matches!(
            self,
            Fault::SqliteLock | Fault::PoisonRow | Fault::LargeTransaction | Fault::DlqRepair
        );
        !active.contains(&self) && !(store_refuses && (writes_store || self.in_background()))
    }
}

/// How long a long store outage lasts: in a full run past the broker's `consumer_timeout`
/// ([`CONSUMER_TIMEOUT`](crate::services::CONSUMER_TIMEOUT)); in a smoke, shorter, so the
/// smoke stays short.
pub fn long_outage(full: bool) -> (f64, f64) {
    if full { (65.0, 150.0) } else { (15.0, 25.0) }
}

/// The faults injected as the n-th fault of a run (by count, so a seed replays them),
/// besides the random ones: every run meets a seal-key rotation and a long store outage.
pub fn scheduled(postgres: bool, full: bool, cdc: bool) -> Vec<(usize, Fault)> {
    let long = if postgres {
        Fault::PgRevoke
    } else {
        Fault::SqliteLockLong
    };
    if full {
        // A rotation every 50 faults (minutes apart, past the new key's activation), an
        // unroutable event type and a long outage every 100.
        let mut s = Vec::new();
        for n in (25..=325).step_by(50) {
            s.push((n, Fault::SealRotate));
            if n % 100 == 25 {
                s.push((n + 5, Fault::Unroutable));
                s.push((n + 15, long));
            }
        }
        s
    } else {
        vec![
            (1, Fault::SealRotate),
            (2, Fault::PoisonRow),
            (3, Fault::Unroutable),
            (4, Fault::LargeTransaction),
            (5, long),
            (6, Fault::DlqRepair),
        ]
        .into_iter()
        .chain(
            cdc.then_some([(7, Fault::KillRelay), (9, Fault::PauseSlotHolder)])
                .into_iter()
                .flatten(),
        )
        .collect()
    }
}

/// Relative weights of the faults for a campaign's setup.
pub fn weights(postgres: bool, cluster: bool, cdc: bool) -> Vec<(Fault, u32)> {
    let mut w = vec![
        (Fault::KillGateway, 45),
        (Fault::Pause, 8),
        (Fault::BrokerRestart, 8),
        (Fault::BrokerOutage, 5),
    ];
    if postgres {
        w.extend([
            (Fault::KillRelay, 12),
            (Fault::PgRestart, 8),
            (Fault::PgReadOnly, 6),
        ]);
    } else {
        w.push((Fault::SqliteLock, 12));
    }
    if cluster {
        w.push((Fault::NodeKill, 10));
    }
    if cdc {
        w.push((Fault::PauseSlotHolder, 8));
    }
    w.extend([
        (Fault::PoisonRow, 6),
        (Fault::LargeTransaction, 5),
        (Fault::DlqRepair, 4),
    ]);
    w
}

/// Picks a fault by weight.
pub fn pick(rng: &mut StdRng, weights: &[(Fault, u32)]) -> Fault {
    let total: u32 = weights.iter().map(|(_, w)| w).sum();
    let mut roll = rng.random_range(0..total);
    for &(fault, w) in weights {
        if roll < w {
            return fault;
        }
        roll -= w;
    }
    weights[0].0
}

/// What the faults act on.
pub struct World {
    pub gateways: Vec<Proc>,
    pub relays: Vec<Proc>,
    pub broker: Broker,
    pub postgres: Option<Postgres>,
    pub sqlite: Option<PathBuf>,
    /// The `carteiro` binary and the campaign's config, for `carteiro seal rotate`.
    pub binary: PathBuf,
    pub config: PathBuf,
    /// The gateways' store, where the poison-row fault commits its row.
    pub store_url: String,
    /// The run folder, and what the DLQ repairs reported.
    pub dir: PathBuf,
    pub repairs: Repairs,
}

impl World {
    /// The PostgreSQL server: PostgreSQL faults are drawn only on PostgreSQL.
    fn pg(&self) -> &Postgres {
        self.postgres
            .as_ref()
            .expect("PostgreSQL faults only on PostgreSQL")
    }
}

/// Injects `fault`, waits out its duration and heals it. Returns what it hit.
pub async fn inject(world: &mut World, fault: Fault, rng: &mut StdRng) -> anyhow::Result<String> {
    let secs =
        |rng: &mut StdRng, lo: f64, hi: f64| Duration::from_secs_f64(rng.random_range(lo..hi));
    match fault {
        Fault::KillGateway => {
            let i = rng.random_range(0..world.gateways.len());
            let delay = secs(rng, 0.0, 0.5);
            let g = &mut world.gateways[i];
            g.kill()?;
            tokio::time::sleep(delay).await;
            g.start()?;
            Ok(g.name.clone())
        }
        Fault::KillRelay => {
            // CDC: the slot's reader three times in four, so that most kills hand it over.
            let holder = slot_holder(&world.relays).filter(|_| rng.random_bool(0.75));
            let i = holder.unwrap_or_else(|| rng.random_range(0..world.relays.len()));
            let r = &mut world.relays[i];
            r.kill()?;
            r.start()?;
            Ok(r.name.clone())
        }
        Fault::PauseSlotHolder => {
            let pause = LEASE + HEARTBEAT * 2 + secs(rng, 0.5, 3.0);
            let i = slot_holder(&world.relays)
                .unwrap_or_else(|| rng.random_range(0..world.relays.len()));
            let r = &world.relays[i];
            r.pause()?;
            tokio::time::sleep(pause).await;
            r.resume()?;
            Ok(format!("{} for {:.1} s", r.name, pause.as_secs_f64()))
        }
        Fault::Pause => {
            let all = world.gateways.len() + world.relays.len();
            let i = rng.random_range(0..all);
            let pause = LEASE + HEARTBEAT * 2 + secs(rng, 0.5, 3.0);
            let p = if i < world.gateways.len() {
                &world.gateways[i]
            } else {
                &world.relays[i - world.gateways.len()]
            };
            p.pause()?;
            tokio::time::sleep(pause).await;
            p.resume()?;
            Ok(format!("{} for {:.1} s", p.name, pause.as_secs_f64()))
        }
        Fault::BrokerRestart => {
            let i = rng.random_range(0..world.broker.nodes());
            tokio::task::block_in_place(|| {
                world.broker.stop(i)?;
                world.broker.start(i)
            })?;
            Ok(format!("node {}", i + 1))
        }
        Fault::BrokerOutage => {
            let i = rng.random_range(0..world.broker.nodes());
            let down = RECONNECT_MAX * 2 + secs(rng, 0.0, 3.0);
            tokio::task::block_in_place(|| world.broker.stop(i))?;
            tokio::time::sleep(down).await;
            tokio::task::block_in_place(|| world.broker.start(i))?;
            Ok(format!("node {} for {:.1} s", i + 1, down.as_secs_f64()))
        }
        Fault::NodeKill => {
            let leader = world.broker.leader(ROUTE_ENROLL);
            let (i, which) = match leader {
                Some(l) if rng.random_bool(0.5) => (l, " (quorum leader)"),
                _ => (rng.random_range(0..world.broker.nodes()), ""),
            };
            let down = secs(rng, 2.0, 8.0);
            tokio::task::block_in_place(|| world.broker.kill(i))?;
            tokio::time::sleep(down).await;
            tokio::task::block_in_place(|| world.broker.start(i))?;
            Ok(format!(
                "node {}{which}, down {:.1} s",
                i + 1,
                down.as_secs_f64()
            ))
        }
        Fault::PgRestart => {
            let pg = world.pg();
            let down = secs(rng, 0.5, 3.0);
            tokio::task::block_in_place(|| pg.stop())?;
            tokio::time::sleep(down).await;
            tokio::task::block_in_place(|| pg.start())?;
            Ok(format!("down {:.1} s", down.as_secs_f64()))
        }
        Fault::PgReadOnly => {
            let pg = world.pg();
            let hold = secs(rng, 3.0, 8.0);
            tokio::task::block_in_place(|| pg.read_only(true))?;
            tokio::time::sleep(hold).await;
            tokio::task::block_in_place(|| pg.read_only(false))?;
            Ok(format!("for {:.1} s", hold.as_secs_f64()))
        }
        Fault::SqliteLock => {
            let path = world.sqlite.as_ref().expect("SQLite faults only on SQLite");
            let hold = secs(rng, 2.0, 8.0);
            hold_write_lock(path, hold).await?;
            Ok(format!("for {:.1} s", hold.as_secs_f64()))
        }
        Fault::PoisonRow => Ok(commit_poison_row(&world.store_url, rng).await),
        Fault::LargeTransaction => Ok(commit_large_transaction(&world.store_url, rng).await),
        Fault::DlqRepair => {
            let operator = Operator {
                binary: world.binary.clone(),
                config: world.config.clone(),
                dir: world.dir.clone(),
                store_url: world.store_url.clone(),
            };
            crate::dlq_repair::repair(&operator, &mut world.repairs).await
        }
        Fault::SqliteLockLong | Fault::PgRevoke | Fault::Unroutable => {
            anyhow::bail!("{} runs in the background", fault.name())
        }
        Fault::SealRotate => {
            let (binary, config) = (world.binary.clone(), world.config.clone());
            let out = tokio::time::timeout(
                Duration::from_secs(60),
                tokio::process::Command::new(binary)
                    .args(["seal", "rotate", "--accept-old-for", "10m", "-c"])
                    .arg(config)
                    .output(),
            )
            .await
            .map_err(|_| anyhow::anyhow!("carteiro seal rotate did not finish within 60 s"))??;
            if !out.status.success() {
                anyhow::bail!(
                    "carteiro seal rotate failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            let said = String::from_utf8_lossy(&out.stdout);
            Ok(said
                .lines()
                .find(|l| l.starts_with("current key"))
                .unwrap_or("rotated")
                .to_owned())
        }
    }
}

/// The CDC relay reading the slot, by its log: the one whose last word on the slot was
/// "active". `None` when that is not one relay (polling relays say neither).
fn slot_holder(relays: &[Proc]) -> Option<usize> {
    let holders: Vec<usize> = (0..relays.len())
        .filter(|&i| {
            let log = relays[i].tail(5_000);
            match (log.rfind("CDC relay active"), log.rfind("standing by")) {
                (Some(active), Some(standby)) => active > standby,
                (active, _) => active.is_some(),
            }
        })
        .collect();
    (holders.len() == 1).then(|| holders[0])
}

/// What a background fault acts on, owned, so that it runs in a task of its own.
#[derive(Clone)]
pub struct Background {
    postgres: Option<Postgres>,
    sqlite: Option<PathBuf>,
    urls: Vec<String>,
}

impl World {
    pub fn background(&self) -> Background {
        Background {
            postgres: self.postgres.clone(),
            sqlite: self.sqlite.clone(),
            urls: self.broker.urls(),
        }
    }
}

/// How long a background fault lasts, drawn by the campaign (so a seed replays it).
pub fn background_hold(fault: Fault, full: bool, rng: &mut StdRng) -> Duration {
    let (lo, hi) = match fault {
        Fault::Unroutable if full => (30.0, 90.0),
        Fault::Unroutable => (8.0, 15.0),
        _ => long_outage(full),
    };
    Duration::from_secs_f64(rng.random_range(lo..hi))
}

/// How long healing a background fault may retry: a fault beside it may have the broker or
/// PostgreSQL down at that moment.
const HEAL_BOUND: Duration = Duration::from_secs(120);

/// Runs `step` until it succeeds, every 500 ms, for up to [`HEAL_BOUND`].
async fn until_done<F, Fut>(what: &str, mut step: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let deadline = tokio::time::Instant::now() + HEAL_BOUND;
    loop {
        match tokio::time::timeout(Duration::from_secs(15), step()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) if tokio::time::Instant::now() > deadline => {
                return Err(e.context(format!("{what}: still failing after {HEAL_BOUND:?}")));
            }
            Err(_) if tokio::time::Instant::now() > deadline => {
                anyhow::bail!("{what}: still timing out after {HEAL_BOUND:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Injects a background fault, holds it for `hold` and heals it. Returns what it hit.
pub async fn inject_background(
    bg: Background,
    fault: Fault,
    hold: Duration,
) -> anyhow::Result<String> {
    let said = format!("for {:.1} s", hold.as_secs_f64());
    match fault {
        Fault::SqliteLockLong => {
            let path = bg.sqlite.expect("SQLite faults only on SQLite");
            hold_write_lock(&path, hold).await?;
            Ok(said)
        }
        Fault::PgRevoke => {
            let pg = bg.postgres.expect("PostgreSQL faults only on PostgreSQL");
            pg.grants(false).await?;
            tokio::time::sleep(hold).await;
            until_done("granting back", || pg.grants(true)).await?;
            Ok(said)
        }
        Fault::Unroutable => {
            let urls = bg.urls;
            rebind_unroutable_key(&urls, false).await?;
            tokio::time::sleep(hold).await;
            until_done("binding back", || rebind_unroutable_key(&urls, true)).await?;
            Ok(format!("{} {said}", crate::config::UNROUTABLE_KEY))
        }
        other => anyhow::bail!("{} does not run in the background", other.name()),
    }
}

/// (Un)binds the unroutable event type on a connection of its own.
async fn rebind_unroutable_key(urls: &[String], bind: bool) -> anyhow::Result<()> {
    let conn = crate::broker::connect(urls).await?;
    bind_unroutable_key(&conn.create_channel().await?, bind).await?;
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}

/// Binds (or unbinds) [`crate::config::UNROUTABLE_KEY`] from the events exchange to
/// [`crate::config::UNROUTABLE_EXCHANGE`], which fans out to the sink and to the downstream
/// route's queue. One binding, so that both lose and regain that event type at once (two
/// queue bindings changed one after the other would leave a moment where an event reaches
/// only one of them, is confirmed and never reaches the other). Unbound, nothing takes it.
pub async fn bind_unroutable_key(ch: &lapin::Channel, bind: bool) -> anyhow::Result<()> {
    use crate::config::{EVENTS_EXCHANGE, UNROUTABLE_EXCHANGE, UNROUTABLE_KEY};
    use lapin::options::{ExchangeBindOptions, ExchangeUnbindOptions};
    use lapin::types::FieldTable;
    let (to, from, key) = (
        UNROUTABLE_EXCHANGE.into(),
        EVENTS_EXCHANGE.into(),
        UNROUTABLE_KEY.into(),
    );
    let args = FieldTable::default();
    if bind {
        let options = ExchangeBindOptions::default();
        ch.exchange_bind(to, from, key, options, args).await?;
    } else {
        let options = ExchangeUnbindOptions::default();
        ch.exchange_unbind(to, from, key, options, args).await?;
    }
    Ok(())
}

/// `BEGIN IMMEDIATE` on the gateways' SQLite file, held for `hold`, then rolled back.
async fn hold_write_lock(path: &std::path::Path, hold: Duration) -> anyhow::Result<()> {
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(10));
    let mut conn = sqlx::SqliteConnection::connect_with(&opts).await?;
    sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut conn).await?;
    tokio::time::sleep(hold).await;
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await?;
    conn.close().await?;
    Ok(())
}

/// One outbox row a fault commits straight into the store.
struct Row {
    event_id: String,
    route: &'static str,
    routing_key: String,
    content_type: Option<String>,
    payload: Vec<u8>,
    ordering_key: String,
}

/// Commits `rows` in one transaction, bounded by `bound`. The store may be refusing writes
/// at that moment (SQLite's lock held by a gateway): rows that could not be written are
/// reported, not retried, and the checker expects nothing of them.
async fn commit_rows(store_url: &str, rows: &[Row], bound: Duration) -> Result<(), String> {
    let now_ms = crate::collect::unix_ms();
    let insert = async {
        let pool = crate::collect::open(store_url).await?;
        let mut tx = pool.begin().await?;
        for row in rows {
            sqlx::query(
                "INSERT INTO outbox (event_id, route, plugin, exchange, routing_key, headers, \
                 content_type, payload, ordering_key, created_at) \
                 VALUES ($1, $2, 'chaos', $3, $4, '[]', $5, $6, $7, $8)",
            )
            .bind(&row.event_id)
            .bind(row.route)
            .bind(EVENTS_EXCHANGE)
            .bind(&row.routing_key)
            .bind(&row.content_type)
            .bind(&row.payload)
            .bind(&row.ordering_key)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        pool.close().await;
        anyhow::Ok(())
    };
    match tokio::time::timeout(bound, insert).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("not written ({e:#})")),
        Err(_) => Err(format!(
            "not written (the store did not answer within {bound:?})"
        )),
    }
}

/// Commits one outbox row AMQP can never carry and says which.
async fn commit_poison_row(store_url: &str, rng: &mut StdRng) -> String {
    let too_long = "x".repeat(300);
    let (routing_key, content_type, how) = if rng.random_bool(0.5) {
        (too_long, None, "routing key")
    } else {
        ("poison".to_owned(), Some(too_long), "content type")
    };
    let event_id = uuid::Uuid::now_v7().to_string();
    // Under a key of its own: it must hold that key and nothing else.
    let ordering_key = if rng.random_bool(0.5) {
        format!("{ROUTE_POISON}/{event_id}")
    } else {
        String::new()
    };
    let keyed = if ordering_key.is_empty() {
        "unordered"
    } else {
        "keyed"
    };
    let row = Row {
        event_id,
        route: ROUTE_POISON,
        routing_key,
        content_type,
        payload: b"poison".to_vec(),
        ordering_key,
    };
    match commit_rows(store_url, &[row], Duration::from_secs(10)).await {
        Ok(()) => format!("{keyed}, {how} over 255 bytes"),
        Err(e) => e,
    }
}

/// Commits one transaction of [`LARGE_ROWS`] events of [`LARGE_ROW_BYTES`] each under one
/// ordering key: several times the relays' byte window
/// ([`RELAY_WINDOW_BYTES`](crate::config::RELAY_WINDOW_BYTES)). They are ordinary events
/// to the checker: each must take effect downstream once and reach the sink in order.
async fn commit_large_transaction(store_url: &str, rng: &mut StdRng) -> String {
    let rows_n = rng.random_range(LARGE_ROWS.0..=LARGE_ROWS.1);
    let key = format!("{ROUTE_LARGE}/{}", uuid::Uuid::now_v7());
    let rows: Vec<Row> = (0..rows_n)
        .map(|i| Row {
            event_id: uuid::Uuid::now_v7().to_string(),
            route: ROUTE_LARGE,
            routing_key: EVENT_KEYS[3].to_owned(),
            content_type: Some("application/octet-stream".to_owned()),
            payload: vec![b'a' + (i % 26) as u8; LARGE_ROW_BYTES],
            ordering_key: key.clone(),
        })
        .collect();
    match commit_rows(store_url, &rows, Duration::from_secs(30)).await {
        Ok(()) => format!(
            "{rows_n} rows of {} KiB in one transaction",
            LARGE_ROW_BYTES >> 10
        ),
        Err(e) => e,
    }
}

/// A large transaction's rows: how many, and each one's payload.
const LARGE_ROWS: (usize, usize) = (24, 48);
const LARGE_ROW_BYTES: usize = 256 << 10;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::CONSUMER_TIMEOUT;
    use rand::SeedableRng;

    #[test]
    fn a_seed_gives_the_same_schedule_and_only_the_backends_faults() {
        let w = weights(false, false, false);
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..200).map(|_| pick(&mut rng, &w)).collect::<Vec<_>>()
        };
        let a = draw(42);
        assert_eq!(a, draw(42));
        assert!(a.contains(&Fault::SqliteLock) && a.contains(&Fault::KillGateway));
        assert!(
            !a.iter()
                .any(|f| matches!(f, Fault::PgRestart | Fault::NodeKill | Fault::KillRelay))
        );
        let pg = weights(true, true, true);
        let mut rng = StdRng::seed_from_u64(1);
        let faults: Vec<_> = (0..500).map(|_| pick(&mut rng, &pg)).collect();
        for f in [
            Fault::PgRestart,
            Fault::PgReadOnly,
            Fault::NodeKill,
            Fault::KillRelay,
        ] {
            assert!(faults.contains(&f), "{f:?} never drawn");
        }
        assert!(!faults.contains(&Fault::SqliteLock));
    }

    #[test]
    fn every_run_schedules_a_rotation_and_its_backends_long_outage() {
        for full in [false, true] {
            for (postgres, long, other) in [
                (false, Fault::SqliteLockLong, Fault::PgRevoke),
                (true, Fault::PgRevoke, Fault::SqliteLockLong),
            ] {
                let s = scheduled(postgres, full, false);
                let kinds: Vec<Fault> = s.iter().map(|(_, f)| *f).collect();
                assert!(kinds.contains(&Fault::SealRotate) && kinds.contains(&long));
                assert!(kinds.contains(&Fault::Unroutable));
                assert!(!kinds.contains(&other));
                assert!(s.windows(2).all(|w| w[0].0 < w[1].0), "{s:?} out of order");
            }
        }
        // A full run's long outage outlasts the broker's consumer_timeout; a smoke's does not.
        assert!(long_outage(true).0 > CONSUMER_TIMEOUT.as_secs_f64());
        assert!(long_outage(false).1 < CONSUMER_TIMEOUT.as_secs_f64());
    }

    #[test]
    fn a_fault_starts_beside_a_background_one_only_where_they_cannot_clash() {
        use Fault::*;
        for f in [
            KillGateway,
            KillRelay,
            Pause,
            BrokerRestart,
            PgRestart,
            PgReadOnly,
        ] {
            assert!(f.fits_beside(&[PgRevoke, Unroutable]), "{f:?}");
        }
        // Another hold of SQLite's lock, or rows for a store that refuses them.
        for f in [SqliteLock, PoisonRow, LargeTransaction, SqliteLockLong] {
            assert!(!f.fits_beside(&[SqliteLockLong]), "{f:?}");
        }
        assert!(!PoisonRow.fits_beside(&[PgRevoke]));
        assert!(!Unroutable.fits_beside(&[Unroutable]));
        assert!(PgRevoke.fits_beside(&[Unroutable]) && LargeTransaction.fits_beside(&[]));
        assert!(
            weights(true, true, true)
                .iter()
                .all(|(f, _)| !f.in_background())
        );
    }

    #[test]
    fn a_full_run_schedules_enough_for_three_hundred_faults() {
        let s = scheduled(true, true, true);
        let count = |kind| s.iter().filter(|(_, f)| *f == kind).count();
        assert!(count(Fault::SealRotate) >= 6 && count(Fault::PgRevoke) >= 3);
        assert!(s.iter().any(|(n, _)| *n >= 300));
    }

    #[test]
    fn a_cdc_smoke_kills_and_pauses_the_relays_and_only_cdc_pauses_a_slot_holder() {
        let kinds = |cdc| -> Vec<Fault> {
            scheduled(true, false, cdc)
                .into_iter()
                .map(|(_, f)| f)
                .collect()
        };
        assert!(kinds(true).contains(&Fault::KillRelay));
        assert!(kinds(true).contains(&Fault::PauseSlotHolder));
        assert!(!kinds(false).contains(&Fault::PauseSlotHolder));
        let polling = weights(true, false, false);
        assert!(polling.iter().all(|(f, _)| *f != Fault::PauseSlotHolder));
        assert!(
            weights(true, false, true)
                .iter()
                .any(|(f, _)| *f == Fault::PauseSlotHolder)
        );
    }
}
