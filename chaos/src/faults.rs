//! Faults: what they are, how likely each is on a backend, and how each is injected and
//! healed. One fault at a time; the schedule comes from the seed.

use std::path::PathBuf;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;
use sqlx::Connection;

use crate::config::{EVENTS_EXCHANGE, HEARTBEAT, LEASE, RECONNECT_MAX, ROUTE_ENROLL, ROUTE_POISON};
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
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillGateway => "gateway SIGKILL",
            Fault::KillRelay => "relay SIGKILL",
            Fault::Pause => "SIGSTOP/SIGCONT",
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
        }
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
pub fn scheduled(postgres: bool, full: bool) -> Vec<(usize, Fault)> {
    let long = if postgres {
        Fault::PgRevoke
    } else {
        Fault::SqliteLockLong
    };
    if full {
        vec![
            (25, Fault::SealRotate),
            (30, Fault::Unroutable),
            (40, long),
            (75, Fault::SealRotate),
            (80, Fault::Unroutable),
            (90, long),
            (125, Fault::SealRotate),
            (130, Fault::Unroutable),
            (140, long),
        ]
    } else {
        vec![
            (1, Fault::SealRotate),
            (2, Fault::PoisonRow),
            (3, Fault::Unroutable),
            (5, long),
        ]
    }
}

/// Relative weights of the faults for a campaign's setup.
pub fn weights(postgres: bool, cluster: bool) -> Vec<(Fault, u32)> {
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
    w.push((Fault::PoisonRow, 6));
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
    /// Long store outages take [`long_outage`]`(full)`.
    pub full: bool,
    /// The gateways' store, where the poison-row fault commits its row.
    pub store_url: String,
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
            let i = rng.random_range(0..world.relays.len());
            let r = &mut world.relays[i];
            r.kill()?;
            r.start()?;
            Ok(r.name.clone())
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
        Fault::SqliteLock | Fault::SqliteLockLong => {
            let path = world.sqlite.as_ref().expect("SQLite faults only on SQLite");
            let (lo, hi) = if fault == Fault::SqliteLock {
                (2.0, 8.0)
            } else {
                long_outage(world.full)
            };
            let hold = secs(rng, lo, hi);
            hold_write_lock(path, hold).await?;
            Ok(format!("for {:.1} s", hold.as_secs_f64()))
        }
        Fault::PgRevoke => {
            let pg = world.pg();
            let (lo, hi) = long_outage(world.full);
            let hold = secs(rng, lo, hi);
            pg.grants(false).await?;
            tokio::time::sleep(hold).await;
            pg.grants(true).await?;
            Ok(format!("for {:.1} s", hold.as_secs_f64()))
        }
        Fault::PoisonRow => Ok(commit_poison_row(&world.store_url, rng).await),
        Fault::Unroutable => {
            let hold = if world.full {
                secs(rng, 30.0, 90.0)
            } else {
                secs(rng, 8.0, 15.0)
            };
            let conn = crate::broker::connect(&world.broker.urls()).await?;
            bind_unroutable_key(&conn.create_channel().await?, false).await?;
            tokio::time::sleep(hold).await;
            // A fresh connection: the broker may have closed the first one meanwhile.
            let _ = conn.close(200, "unbound".into()).await;
            let conn = crate::broker::connect(&world.broker.urls()).await?;
            bind_unroutable_key(&conn.create_channel().await?, true).await?;
            let _ = conn.close(200, "bound".into()).await;
            Ok(format!(
                "{} for {:.1} s",
                crate::config::UNROUTABLE_KEY,
                hold.as_secs_f64()
            ))
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

/// Commits one outbox row AMQP can never carry and says which. The store may be refusing
/// writes at that moment (SQLite's lock held by a gateway): a row that could not be written
/// is reported, not retried, and the checker expects nothing of it.
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
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let insert = async {
        let pool = crate::collect::open(store_url).await?;
        sqlx::query(
            "INSERT INTO outbox (event_id, route, plugin, exchange, routing_key, headers, \
             content_type, payload, ordering_key, created_at) \
             VALUES ($1, $2, 'chaos', $3, $4, '[]', $5, $6, $7, $8)",
        )
        .bind(&event_id)
        .bind(ROUTE_POISON)
        .bind(EVENTS_EXCHANGE)
        .bind(routing_key)
        .bind(content_type)
        .bind(b"poison".to_vec())
        .bind(&ordering_key)
        .bind(now_ms)
        .execute(&pool)
        .await?;
        pool.close().await;
        anyhow::Ok(())
    };
    let keyed = if ordering_key.is_empty() {
        "unordered"
    } else {
        "keyed"
    };
    match tokio::time::timeout(Duration::from_secs(10), insert).await {
        Ok(Ok(())) => format!("{keyed}, {how} over 255 bytes"),
        Ok(Err(e)) => format!("not written ({e:#})"),
        Err(_) => "not written (the store did not answer within 10 s)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::CONSUMER_TIMEOUT;
    use rand::SeedableRng;

    #[test]
    fn a_seed_gives_the_same_schedule_and_only_the_backends_faults() {
        let w = weights(false, false);
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
        let pg = weights(true, true);
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
                let s = scheduled(postgres, full);
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
}
