//! One campaign: services, gateways and relays, the workload, faults at random moments,
//! then the drain and the checker.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::checker::{self, FaultSpan, Findings, State};
use crate::config::{
    self, DOWN_EXCHANGE, DOWN_QUEUE, EVENT_KEYS, EVENTS_EXCHANGE, Setup, UNROUTABLE_EXCHANGE,
    UNROUTABLE_KEY,
};
use crate::faults::{self, Fault, World};
use crate::lanes::{Active, FaultRecord, Recorded, next_fault, record_beside, recovery};
use crate::procs::Proc;
use crate::services::{Broker, Postgres};
use crate::sink::{self, SINK_QUEUE};
use crate::workload::{self, Lag, Ledger};
use crate::{broker, collect, drain, logs};

/// A duplicate event is allowed when one fault's window holds its first copy and this
/// one: from three publish timeouts before the fault (a copy in flight when it hit)
/// to the lease plus 7 s after progress resumed (a dead relay's rows wait out its lease and
/// are published again).
const WINDOW_BEFORE: Duration = Duration::from_secs(6);
const WINDOW_AFTER: Duration = Duration::from_secs(config::LEASE.as_secs() + 7);
/// Every so many faults the gap is longer than both windows together, so that some time
/// lies outside every fault's window and a duplicate there fails the run.
const QUIET_EVERY: usize = 25;
const QUIET_GAP: Duration =
    Duration::from_secs(WINDOW_BEFORE.as_secs() + WINDOW_AFTER.as_secs() + 5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// How to run one campaign.
pub struct Options {
    pub repo: PathBuf,
    pub binary: PathBuf,
    pub backend: Backend,
    pub cluster: bool,
    /// The relays read a replication slot instead of polling (PostgreSQL).
    pub cdc: bool,
    pub seed: u64,
    /// Quiet time first (the baseline throughput), then faults until `duration`.
    pub quiet: Duration,
    pub duration: Duration,
    /// Random wait between faults.
    pub gap: (f64, f64),
    /// Inputs kept waiting ahead of the gateways.
    pub backlog: u64,
    pub drain_timeout: Duration,
    /// A full run: long store outages take minutes (see [`faults::long_outage`]).
    pub full: bool,
}

/// What a campaign found.
#[derive(Debug, Serialize)]
pub struct Outcome {
    pub backend: Backend,
    pub cluster: bool,
    pub cdc: bool,
    pub seed: u64,
    pub seconds: f64,
    /// `/proc/loadavg` as the run began: a full run's report is measured on a quiet box.
    pub load_before: String,
    pub published: u64,
    pub duplicates_published: u64,
    pub republished: u64,
    pub faults: Vec<FaultRecord>,
    /// Processes that exited without being killed (restarted by the campaign).
    pub unexpected_exits: Vec<String>,
    pub drained: bool,
    /// Commits (inputs finished upstream plus events consumed downstream) per second with
    /// no fault active, and during faults (from injection to first progress after healing).
    pub rate_quiet: f64,
    pub rate_faults: f64,
    /// The same rate during each kind of fault.
    pub rate_by_fault: Vec<(Fault, f64)>,
    pub findings: Findings,
}

impl Outcome {
    /// The checker's verdict, which covers the drain, stalls and unprompted exits too.
    pub fn passed(&self) -> bool {
        self.findings.passed()
    }
}

pub async fn run(opts: Options) -> anyhow::Result<Outcome> {
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let started = Instant::now();
    let started_unix_ms = collect::unix_ms();
    let ms = move || started.elapsed().as_millis() as u64;
    let postgres = opts.backend == Backend::Postgres;
    let name = format!(
        "{}{}{}-{}",
        if postgres { "postgres" } else { "sqlite" },
        if opts.cdc { "-cdc" } else { "" },
        if opts.cluster { "-cluster" } else { "" },
        opts.seed
    );
    let dir = opts.repo.join(".local/chaos").join(&name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    println!("chaos: run folder {}", dir.display());

    println!(
        "chaos: starting a fresh broker{}",
        if opts.cluster {
            " cluster (3 nodes)"
        } else {
            ""
        }
    );
    let broker = tokio::task::block_in_place(|| Broker::fresh(&opts.repo, opts.cluster))?;
    let urls = broker.urls();
    let (pg, store_url, sqlite) = if postgres {
        let pg = Postgres::fresh(&opts.repo, opts.cdc).await?;
        let url = pg.url();
        (Some(pg), url, None)
    } else {
        let path = dir.join("carteiro.db");
        (None, format!("sqlite://{}", path.display()), Some(path))
    };
    let config_path = dir.join("carteiro.toml");
    let plugins = opts.repo.join("target/plugins");
    std::fs::write(
        &config_path,
        config::render(&Setup {
            broker_urls: &urls,
            store_url: &store_url,
            plugins: &plugins,
            // Polling: each gateway also runs its relay, which takes its own commits' rows in
            // memory (immediate dispatch) beside the relay processes that claim from the
            // table. CDC: only the relay processes read the slot.
            relay_in_gateway: !(postgres && opts.cdc),
            quorum: opts.cluster,
            cdc: opts.cdc,
        }),
    )?;
    migrate(&opts.binary, &config_path)?;

    let processes = if postgres { 2 } else { 1 };
    let mut world = World {
        gateways: (1..=processes)
            .map(|i| {
                Proc::spawn(
                    &opts.binary,
                    "run",
                    &format!("gateway-{i}"),
                    &config_path,
                    &dir,
                )
            })
            .collect::<anyhow::Result<_>>()?,
        relays: if postgres {
            (1..=2)
                .map(|i| {
                    Proc::spawn(
                        &opts.binary,
                        "relay",
                        &format!("relay-{i}"),
                        &config_path,
                        &dir,
                    )
                })
                .collect::<anyhow::Result<_>>()?
        } else {
            Vec::new()
        },
        broker,
        postgres: pg,
        sqlite,
        binary: opts.binary.clone(),
        config: config_path.clone(),
        store_url: store_url.clone(),
        dir: dir.clone(),
        repairs: Default::default(),
    };
    wait_ready(&mut world).await?;
    declare_sinks(&urls, opts.cluster).await?;
    let pool = collect::open(&store_url).await?;

    let stop_publisher = Arc::new(AtomicBool::new(false));
    let stop_sink = Arc::new(AtomicBool::new(false));
    let stop_sampler = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Ledger::default());
    let lag = Arc::new(Lag::default());
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let samples = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let publisher = tokio::spawn(workload::publish(
        urls.clone(),
        StdRng::seed_from_u64(opts.seed ^ 0x5eed),
        ledger.clone(),
        lag.clone(),
        opts.backlog,
        stop_publisher.clone(),
    ));
    let sink = tokio::spawn(sink::run(
        urls.clone(),
        started,
        arrivals.clone(),
        stop_sink.clone(),
    ));
    let sampler = tokio::spawn(sample(
        pool.clone(),
        lag.clone(),
        samples.clone(),
        started,
        stop_sampler.clone(),
    ));

    println!(
        "chaos: {:.0} s quiet, then faults until {:.0} s (seed {})",
        opts.quiet.as_secs_f64(),
        opts.duration.as_secs_f64(),
        opts.seed
    );
    let load_started = Instant::now();
    tokio::time::sleep(opts.quiet).await;
    let weights = faults::weights(postgres, opts.cluster, opts.cdc);
    // The run's length counts from the first input, not from the services' start-up.
    let deadline = load_started + opts.duration;
    let mut records: Vec<Recorded> = Vec::new();
    let mut unexpected_exits = Vec::new();
    let mut scheduled = faults::scheduled(postgres, opts.full, opts.cdc);
    scheduled.reverse();
    let active = Active::default();
    while Instant::now() < deadline {
        let mut gap = Duration::from_secs_f64(rng.random_range(opts.gap.0..opts.gap.1));
        if records.len() % QUIET_EVERY == QUIET_EVERY - 1 {
            gap = QUIET_GAP;
        }
        tokio::time::sleep(gap).await;
        restart_exited(&mut world, &mut unexpected_exits, ms())?;
        if Instant::now() >= deadline {
            break;
        }
        let fault = next_fault(
            &mut scheduled,
            records.len(),
            &active.now(),
            &mut rng,
            &weights,
        );
        let start_ms = ms();
        if fault.in_background() {
            let hold = faults::background_hold(fault, opts.full, &mut rng);
            let bg = world.background();
            active.add(fault);
            let (active, lag) = (active.clone(), lag.clone());
            records.push(Recorded::Pending(tokio::spawn(async move {
                let injected = tokio::time::timeout(
                    hold + Duration::from_secs(180),
                    faults::inject_background(bg, fault, hold),
                )
                .await;
                active.remove(fault);
                let target = match injected {
                    Ok(Ok(target)) => target,
                    Ok(Err(e)) => bail!("{} failed: {e:#}", fault.name()),
                    Err(_) => bail!("{} did not heal within its bound", fault.name()),
                };
                Ok(record_beside(&active, &lag.commits, started, (fault, target, start_ms)).await)
            })));
            continue;
        }
        let target = match tokio::time::timeout(
            Duration::from_secs(180),
            faults::inject(&mut world, fault, &mut rng),
        )
        .await
        {
            Ok(Ok(target)) => target,
            Ok(Err(e)) => bail!("injecting {} failed: {e:#}", fault.name()),
            Err(_) => bail!("injecting {} did not finish within 180 s", fault.name()),
        };
        let healed_ms = ms();
        if active.now().is_empty() {
            let recovered_ms = recovery(&lag.commits, started).await;
            let record = FaultRecord::new(fault, target, start_ms, healed_ms, recovered_ms);
            records.push(Recorded::Done(record));
        } else {
            // Nothing may progress until the background fault heals: this one's recovery
            // is measured from then, while the next faults go on.
            let (active, lag) = (active.clone(), lag.clone());
            records.push(Recorded::Pending(tokio::spawn(async move {
                Ok(record_beside(&active, &lag.commits, started, (fault, target, start_ms)).await)
            })));
        }
    }
    // Background faults heal within their bound; every record is complete after that.
    let mut done = Vec::with_capacity(records.len());
    for r in records {
        done.push(match r {
            Recorded::Done(r) => r,
            Recorded::Pending(task) => task.await??,
        });
    }
    done.sort_by_key(|r| r.start_ms);
    let records = done;
    restart_exited(&mut world, &mut unexpected_exits, ms())?;
    stop_publisher.store(true, Ordering::Relaxed);
    publisher.await?;
    println!(
        "chaos: publishing stopped after {} inputs ({} duplicates); draining",
        ledger.confirmed.load(Ordering::Relaxed),
        ledger.duplicates.load(Ordering::Relaxed)
    );

    let mut drained = drain::drain(&urls, &pool, opts.drain_timeout).await;
    if !drained {
        eprintln!("chaos: NOT drained within {:?}", opts.drain_timeout);
    }
    restart_exited(&mut world, &mut unexpected_exits, ms())?;
    // Stopping the gateways returns what they held unacked to its queue, where the next
    // step finds it: the drain above saw only ready messages.
    for p in world.gateways.iter_mut().chain(world.relays.iter_mut()) {
        p.terminate(Duration::from_secs(40));
    }
    let (queued, parked) = drain::take_queued(&urls, opts.cluster).await?;
    if !drain::wait_sink_empty(&urls).await {
        eprintln!("chaos: the sink queue did not empty within 30 s");
        drained = false;
    }
    stop_sink.store(true, Ordering::Relaxed);
    stop_sampler.store(true, Ordering::Relaxed);
    // Bounded like every broker step: a sink stuck on the broker must not hang the checker.
    match tokio::time::timeout(Duration::from_secs(30), sink).await {
        Ok(stopped) => stopped?,
        Err(_) => {
            eprintln!("chaos: the sink did not stop within 30 s");
            drained = false;
        }
    }
    sampler.await?;

    let sent = ledger.sent.lock().await.clone();
    let publishes = ledger.publishes.lock().await.clone();
    let mut state = State {
        unconfirmed: sent
            .iter()
            .filter(|s| !publishes.contains_key(&s.id))
            .map(|s| s.id.clone())
            .collect(),
        sent,
        publishes,
        queued,
        parked,
        sink: arrivals.lock().await.clone(),
        faults: records
            .iter()
            .map(|r| FaultSpan {
                start_ms: r.start_ms,
                end_ms: r.recovered_ms.unwrap_or(r.healed_ms),
                recovered: r.recovered_ms.is_some(),
            })
            .collect(),
        window_ms: WINDOW_AFTER.as_millis() as u64,
        lead_ms: WINDOW_BEFORE.as_millis() as u64,
        started_unix_ms,
        drained,
        exits: unexpected_exits.clone(),
        repairs: world.repairs.clone(),
        ..State::default()
    };
    collect::store(&pool, &mut state).await?;
    state.relay_logs = logs::relay_logs(&dir)?;
    let findings = checker::check(&state);
    let (rate_quiet, rate_faults, rate_by_fault) = rates(
        &samples.lock().await,
        &records,
        (load_started - started + opts.quiet / 4).as_millis() as u64,
    );
    std::fs::write(
        dir.join("findings.json"),
        serde_json::to_string_pretty(&findings)?,
    )?;
    // Every copy the sink saw, in order, so that an order or duplicate finding can be
    // examined after the run.
    let mut lines = String::new();
    for a in &state.sink {
        lines.push_str(&serde_json::to_string(a)?);
        lines.push('\n');
    }
    std::fs::write(dir.join("sink.jsonl"), lines)?;
    Ok(Outcome {
        backend: opts.backend,
        cluster: opts.cluster,
        cdc: opts.cdc,
        seed: opts.seed,
        seconds: started.elapsed().as_secs_f64(),
        load_before,
        published: ledger.confirmed.load(Ordering::Relaxed),
        duplicates_published: ledger.duplicates.load(Ordering::Relaxed),
        republished: ledger.republished.load(Ordering::Relaxed),
        faults: records,
        unexpected_exits,
        drained,
        rate_quiet,
        rate_faults,
        rate_by_fault,
        findings,
    })
}

fn migrate(binary: &Path, config: &Path) -> anyhow::Result<()> {
    let out = std::process::Command::new(binary)
        .args(["migrate", "-c"])
        .arg(config)
        .output()
        .context("run carteiro migrate")?;
    if !out.status.success() {
        bail!(
            "carteiro migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The routes each gateway consumes.
const ROUTES: usize = 5;

/// Every gateway consumes its routes and every relay runs, within 120 s.
async fn wait_ready(world: &mut World) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let gateways = world
            .gateways
            .iter()
            .all(|g| g.tail(400).matches("consumer started").count() >= ROUTES);
        let relays = world.relays.iter().all(|r| {
            let log = r.tail(400);
            // A CDC relay reads the slot, or stands by while the other one does.
            log.contains("outbox relay running")
                || log.contains("CDC relay active")
                || log.contains("standing by")
        });
        if gateways && relays {
            return Ok(());
        }
        for p in world.gateways.iter_mut().chain(world.relays.iter_mut()) {
            if let Some(status) = p.exited() {
                bail!(
                    "{} exited during start-up ({status}):\n{}",
                    p.name,
                    p.tail(30)
                );
            }
        }
        if Instant::now() > deadline {
            bail!("the gateways were not consuming within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Declares the durable exchange `name` of `kind`.
async fn declare_durable_exchange(
    ch: &lapin::Channel,
    name: &str,
    kind: lapin::ExchangeKind,
) -> anyhow::Result<()> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    ch.exchange_declare(name.into(), kind, durable, FieldTable::default())
        .await?;
    Ok(())
}

/// The sink on the events exchange, and a capped queue for the downstream route's events.
async fn declare_sinks(urls: &[String], quorum: bool) -> anyhow::Result<()> {
    let conn = broker::connect(urls).await?;
    let ch = conn.create_channel().await?;
    broker::declare_queue(&ch, SINK_QUEUE, quorum).await?;
    // Each event type on its own, so that the unroutable fault can unbind one of them: that
    // one through a fanout exchange to both of its queues.
    for key in EVENT_KEYS.into_iter().filter(|k| *k != UNROUTABLE_KEY) {
        ch.queue_bind(
            SINK_QUEUE.into(),
            EVENTS_EXCHANGE.into(),
            key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    }
    declare_durable_exchange(&ch, UNROUTABLE_EXCHANGE, lapin::ExchangeKind::Fanout).await?;
    for queue in [SINK_QUEUE, config::ROUTE_DOWNSTREAM] {
        ch.queue_bind(
            queue.into(),
            UNROUTABLE_EXCHANGE.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    }
    faults::bind_unroutable_key(&ch, true).await?;
    declare_durable_exchange(&ch, DOWN_EXCHANGE, lapin::ExchangeKind::Topic).await?;
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-max-length"),
        AMQPValue::LongLongInt(1_000),
    );
    if quorum {
        args.insert(
            ShortString::from("x-queue-type"),
            AMQPValue::LongString(LongString::from("quorum")),
        );
    }
    let opts = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(DOWN_QUEUE.into(), opts, args).await?;
    ch.queue_bind(
        DOWN_QUEUE.into(),
        DOWN_EXCHANGE.into(),
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    conn.close(200, "declared".into()).await?;
    Ok(())
}

/// Progress once a second, for the publisher's backlog, recoveries and throughput.
async fn sample(
    pool: sqlx::AnyPool,
    lag: Arc<Lag>,
    samples: Arc<Mutex<Vec<(u64, u64)>>>,
    started: Instant,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let down = collect::downstream(&pool).await;
        if let Some((done, events)) = down {
            lag.events_behind
                .store(events.saturating_sub(done), Ordering::Relaxed);
        }
        let progress = collect::progress(&pool).await;
        if let Some((done, _)) = progress {
            lag.processed.store(done, Ordering::Relaxed);
        }
        if let Some(commits) = commits(progress, down) {
            lag.commits.store(commits, Ordering::Relaxed);
            let at = started.elapsed().as_millis() as u64;
            samples.lock().await.push((at, commits));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Commits so far: the routes' inbox records and dead letters plus the downstream inbox
/// records, or `None` unless both counts answered. A sample with the downstream count missing
/// (the store answering one query of two, as it comes back) read as a drop, and the next
/// sample as a burst of every downstream record at once, credited to the fault.
fn commits(progress: Option<(u64, u64)>, downstream: Option<(u64, u64)>) -> Option<u64> {
    Some(progress?.0 + downstream?.0)
}

/// A process that died on its own is a finding; it is restarted so the campaign goes on.
fn restart_exited(world: &mut World, exits: &mut Vec<String>, at_ms: u64) -> anyhow::Result<()> {
    for p in world.gateways.iter_mut().chain(world.relays.iter_mut()) {
        if let Some(status) = p.exited() {
            let what = format!(
                "{} exited ({status}) at {:.1} s: {}",
                p.name,
                at_ms as f64 / 1e3,
                p.tail(3)
            );
            eprintln!("chaos: {what}");
            exits.push(what);
            p.start()?;
        }
    }
    Ok(())
}

/// Commits per second outside faults, during them, and during each kind of fault.
fn rates(
    samples: &[(u64, u64)],
    faults: &[FaultRecord],
    ramp_until: u64,
) -> (f64, f64, Vec<(Fault, f64)>) {
    let kind_at = |t: u64| {
        faults
            .iter()
            .find(|f| t >= f.start_ms && t <= f.recovered_ms.unwrap_or(f.healed_ms))
            .map(|f| f.fault)
    };
    let last_fault = faults
        .iter()
        .map(|f| f.recovered_ms.unwrap_or(f.healed_ms))
        .max()
        .unwrap_or(0);
    let (mut quiet, mut faulty) = ((0u64, 0u64), (0u64, 0u64));
    let mut by_kind: BTreeMap<Fault, (u64, u64)> = BTreeMap::new();
    for w in samples.windows(2) {
        let ((t0, d0), (t1, d1)) = (w[0], w[1]);
        // Skip the start-up ramp and the drain, where the backlog is not steady.
        if t0 < ramp_until || (last_fault > 0 && t1 > last_fault) {
            continue;
        }
        let (done, took) = (d1.saturating_sub(d0), t1 - t0);
        let slot = match kind_at(t0).or_else(|| kind_at(t1)) {
            Some(kind) => {
                let k = by_kind.entry(kind).or_default();
                k.0 += done;
                k.1 += took;
                &mut faulty
            }
            None => &mut quiet,
        };
        slot.0 += done;
        slot.1 += took;
    }
    let rate = |(n, ms): (u64, u64)| {
        if ms == 0 {
            0.0
        } else {
            n as f64 * 1e3 / ms as f64
        }
    };
    let by_kind = by_kind.into_iter().map(|(k, v)| (k, rate(v))).collect();
    (rate(quiet), rate(faulty), by_kind)
}

#[cfg(test)]
mod tests {
    use super::commits;

    #[test]
    fn a_throughput_sample_needs_both_counts() {
        assert_eq!(commits(Some((10, 3)), Some((5, 7))), Some(15));
        assert_eq!(commits(Some((10, 3)), None), None);
        assert_eq!(commits(None, Some((5, 7))), None);
    }
}
