//! Faults: what they are, how likely each is on a backend, and how each is injected and
//! healed. One fault at a time; the schedule comes from the seed.

use std::path::PathBuf;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;
use sqlx::Connection;

use crate::procs::Proc;
use crate::services::{Broker, Postgres};

/// The relay lease and AMQP heartbeat the campaign's config sets; a pause outlasts both.
pub const LEASE: Duration = Duration::from_secs(6);
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// The config's longest reconnect backoff; a broker outage outlasts it.
pub const RECONNECT_MAX: Duration = Duration::from_secs(2);

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
        }
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
            let leader = world.broker.leader(crate::checker::ROUTE_ENROLL);
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
            let pg = world
                .postgres
                .as_ref()
                .expect("PostgreSQL faults only on PostgreSQL");
            let down = secs(rng, 0.5, 3.0);
            tokio::task::block_in_place(|| pg.stop())?;
            tokio::time::sleep(down).await;
            tokio::task::block_in_place(|| pg.start())?;
            Ok(format!("down {:.1} s", down.as_secs_f64()))
        }
        Fault::PgReadOnly => {
            let pg = world
                .postgres
                .as_ref()
                .expect("PostgreSQL faults only on PostgreSQL");
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
    }
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

#[cfg(test)]
mod tests {
    use super::*;
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
}
