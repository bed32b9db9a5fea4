//! The CDC relay (`[relay] mode = "cdc"`) end to end on a real PostgreSQL (wal_level =
//! logical, as scripts/postgres.sh starts it) and RabbitMQ: rows reach the sink once and in
//! key order through the slot; killed over and over it loses nothing and repeats only rows
//! that were confirmed but not yet marked; it survives PostgreSQL restarts and broker
//! outages (the rows stay in the slot meanwhile, and its lag alert rises); a second relay
//! stands by and takes over; a whole gateway in cdc mode relays its handler's events through
//! the slot; and SQLite refuses the mode. Every test uses its own slot (slots are per
//! server) and drops it.

use crate::outages::Postgres;
use crate::resilience::Rabbit;
use crate::support::{
    Client, Gateway, RelayTask, amqp_url, json_props, load_config, message_id, migrated_store,
    pg_database, receive, route_config, run_relay, seed_outbox, seed_outbox_from, stop_relay,
    unique, wait_for, wait_published, with_store,
};
use carteiro::broker::field_table::header_text;
use carteiro::metrics::Metrics;
use carteiro::store::Store;
use sqlx::Connection;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

fn slot_name() -> String {
    format!("e2e_cdc_{}", uuid::Uuid::now_v7().simple())
}

fn cdc_config(
    dir: &std::path::Path,
    store: &str,
    amqp: &str,
    slot: &str,
) -> carteiro::config::Config {
    load_config(
        dir,
        &format!(
            "version = 1\n[broker]\nurl = \"{amqp}\"\nreconnect_max_backoff = \"1s\"\n[store]\nurl = \"{store}\"\n[relay]\nmode = \"cdc\"\nslot = \"{slot}\"\npublication = \"{slot}\"\nmax_in_flight = 128\n"
        ),
    )
}

/// What most CDC tests start from: a sink exchange, a fresh migrated database and a CDC
/// config on a slot of its own (`_dir` holds the config's folder).
struct Fresh {
    client: Client,
    exchange: String,
    sink: String,
    url: String,
    store: Store,
    slot: String,
    config: carteiro::config::Config,
    _dir: tempfile::TempDir,
}

async fn fresh(prefix: &str) -> Fresh {
    fresh_on(prefix, Client::connect().await, &amqp_url(), None).await
}

/// [`fresh`] on a broker of the test's own (`client` connected to `amqp`) or on a database of
/// its own (`store_url`; `None`: a new database on the test server).
async fn fresh_on(prefix: &str, client: Client, amqp: &str, store_url: Option<String>) -> Fresh {
    let exchange = unique(prefix);
    let sink = client.sink(&exchange).await;
    let url = match store_url {
        Some(url) => url,
        None => pg_database().await,
    };
    let store = migrated_store(&url).await;
    let slot = slot_name();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = cdc_config(dir.path(), &url, amqp, &slot);
    Fresh {
        client,
        exchange,
        sink,
        url,
        store,
        slot,
        config,
        _dir: dir,
    }
}

impl Fresh {
    /// Starts a CDC relay on the test's store and waits until it reads the slot.
    async fn active_relay(&self) -> RelayTask {
        self.active_relay_counted().await.0
    }

    /// [`Fresh::active_relay`], and the relay's metrics.
    async fn active_relay_counted(&self) -> (RelayTask, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        let relay = run_relay(cdc_relay(&self.config, self.store.clone(), metrics.clone()));
        wait_active(&metrics).await;
        (relay, metrics)
    }

    /// Drains the sink until `n` messages arrived (see [`receive`]).
    async fn receive(&self, n: usize) -> Vec<lapin::message::BasicGetMessage> {
        receive(&self.client, &self.sink, n, WAIT).await
    }

    /// Drops the test's slot ([`drop_slot`]).
    async fn drop_slot(&self) {
        drop_slot(&self.url, &self.slot).await;
    }
}

fn cdc_relay(
    config: &carteiro::config::Config,
    store: Store,
    metrics: Arc<Metrics>,
) -> carteiro::relay::Relay {
    carteiro::relay::Relay::new(
        &config.broker,
        &config.relay,
        &config.store.url,
        store,
        metrics,
        None,
    )
}

/// The slot's confirmed position, as a number (`None`: no slot).
async fn confirmed_lsn(url: &str, slot: &str) -> Option<i64> {
    slot_number(url, slot, "(confirmed_flush_lsn - '0/0'::pg_lsn)::bigint").await
}

/// The backend reading `slot`, if any.
pub(crate) async fn slot_reader(url: &str, slot: &str) -> Option<i64> {
    slot_number(url, slot, "active_pid::bigint").await
}

/// `column` (SQL, a bigint) of `slot` in `pg_replication_slots` (`None`: no slot, or NULL).
async fn slot_number(url: &str, slot: &str, column: &str) -> Option<i64> {
    let mut conn = sqlx::PgConnection::connect(url).await.ok()?;
    let sql = format!("SELECT {column} FROM pg_replication_slots WHERE slot_name = $1");
    sqlx::query_scalar::<_, Option<i64>>(sqlx::AssertSqlSafe(sql))
        .bind(slot)
        .fetch_optional(&mut conn)
        .await
        .ok()
        .flatten()
        .flatten()
}

/// The outbox inserts the slot still holds for its reader (peeked, not consumed); `None`
/// while a relay reads the slot (a peek needs it idle).
async fn inserts_in_slot(url: &str, slot: &str) -> Option<i64> {
    let mut conn = sqlx::PgConnection::connect(url).await.ok()?;
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, \
         'proto_version', '1', 'publication_names', $1) WHERE get_byte(data, 0) = 73",
    )
    .bind(slot)
    .fetch_one(&mut conn)
    .await
    .ok()
}

/// Drops the test's slot (an abandoned slot would hold the test server's WAL for ever).
pub(crate) async fn drop_slot(url: &str, slot: &str) {
    for _ in 0..30 {
        if let Ok(mut conn) = sqlx::PgConnection::connect(url).await {
            let dropped = sqlx::query("SELECT pg_drop_replication_slot($1)")
                .bind(slot)
                .execute(&mut conn)
                .await;
            if dropped.is_ok() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub(crate) async fn wait_active(metrics: &Metrics) {
    wait_for("the CDC relay active", WAIT, || async {
        (metrics.outbox.cdc_active.get() == 1).then_some(())
    })
    .await;
}

/// Waits (`what` names it) until the slot's confirmed position is past `before`.
async fn wait_slot_past(what: &str, url: &str, slot: &str, before: i64) {
    wait_for(what, WAIT, || async {
        (confirmed_lsn(url, slot).await? > before).then_some(())
    })
    .await;
}

/// Per key, first arrivals in sequence order (a repeat after a crash or restart is a copy of
/// a row already delivered; consumers' inboxes drop it by its message id).
fn assert_key_order(all: &[lapin::message::BasicGetMessage]) {
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    let mut seen = HashSet::new();
    for m in all {
        if !seen.insert(message_id(m)) {
            continue;
        }
        let text = String::from_utf8(m.delivery.data.clone()).expect("utf8");
        let (key, seq) = text.split_once('/').expect("key/seq");
        let seq: i64 = seq.parse().expect("seq");
        let previous = last.insert(key.to_owned(), seq).unwrap_or(-1);
        assert!(seq >= previous, "{key}: {seq} arrived after {previous}");
    }
}

#[tokio::test]
async fn rows_committed_while_active_arrive_once_in_key_order_and_the_slot_advances() {
    let f = fresh("cdc").await;
    let relay = f.active_relay().await;
    let before = confirmed_lsn(&f.url, &f.slot)
        .await
        .expect("the relay created its slot");
    seed_outbox(&f.store, &f.exchange, 20, 2_000).await;
    let all = f.receive(2_000).await;
    let ids: HashSet<String> = all.iter().map(message_id).collect();
    assert_eq!(all.len(), 2_000, "each row once");
    assert_eq!(ids.len(), 2_000, "each with its own event id");
    assert_key_order(&all);
    wait_published("every row marked published", &f.store, WAIT).await;
    wait_slot_past(
        "the slot advanced past the commits",
        &f.url,
        &f.slot,
        before,
    )
    .await;
    stop_relay(relay).await;
    f.drop_slot().await;
}

#[tokio::test]
async fn a_kill_loop_loses_nothing_and_repeats_only_rows_unmarked_at_a_kill() {
    let f = fresh("cdc-kill").await;
    const ROWS: usize = 3_000;
    // Unpublished ids at each kill: a repeat must be one of them.
    let mut unmarked_at_kills: HashSet<i64> = HashSet::new();
    let writer = {
        let store = Store::connect(&f.url, 4).await.expect("store");
        let exchange = f.exchange.clone();
        tokio::spawn(async move {
            for _ in 0..(ROWS / 300) {
                seed_outbox(&store, &exchange, 10, 300).await;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        })
    };
    for _ in 0..5 {
        let (_stop, task) = f.active_relay().await;
        tokio::time::sleep(Duration::from_millis(200 + rand::random_range(0..600u64))).await;
        // The crash: the task is dropped wherever it is (no marks, no last status).
        task.abort();
        let _ = task.await;
        // A COMMIT of a mark sent just before may still land: look a moment later.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut conn = sqlx::PgConnection::connect(&f.url).await.expect("connect");
        let open: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox WHERE published_at IS NULL")
            .fetch_all(&mut conn)
            .await
            .expect("unpublished ids");
        unmarked_at_kills.extend(open);
    }
    writer.await.expect("writer");
    let metrics = Arc::new(Metrics::default());
    let relay = run_relay(cdc_relay(&f.config, f.store.clone(), metrics));
    let all = f.receive(ROWS).await;
    stop_relay(relay).await;
    // Event id → outbox id, to name repeats by row.
    let mut conn = sqlx::PgConnection::connect(&f.url).await.expect("connect");
    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT id, event_id FROM outbox")
        .fetch_all(&mut conn)
        .await
        .expect("rows");
    let by_event: HashMap<String, i64> = rows.into_iter().map(|(id, e)| (e, id)).collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for m in &all {
        *seen.entry(message_id(m)).or_default() += 1;
    }
    assert_eq!(seen.len(), ROWS, "0 lost: every row published");
    for (event, n) in &seen {
        if *n > 1 {
            let id = by_event[event];
            assert!(
                unmarked_at_kills.contains(&id),
                "row {id} sent {n} times but it was marked published at every kill"
            );
        }
    }
    assert_eq!(f.store.outbox_status().await.expect("status").pending, 0);
    f.drop_slot().await;
}

#[tokio::test]
async fn a_postgres_restart_mid_stream_loses_nothing() {
    let (pg, admin) = Postgres::start().await;
    let f = fresh_on("cdc-pg", Client::connect().await, &amqp_url(), Some(admin)).await;
    let relay = f.active_relay().await;
    seed_outbox(&f.store, &f.exchange, 10, 500).await;
    pg.stop().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.start_again().await;
    seed_outbox_from(&f.store, &f.exchange, 10, 500, 50).await;
    // Rows confirmed but not yet marked when the server went away are sent again.
    let all = std::sync::Mutex::new(Vec::new());
    wait_for("1,000 distinct rows", WAIT, || async {
        let batch = f.client.drain(&f.sink).await;
        let mut all = all.lock().expect("lock");
        all.extend(batch);
        let ids: HashSet<String> = all.iter().map(message_id).collect();
        (ids.len() >= 1_000).then_some(())
    })
    .await;
    let all = all.into_inner().expect("lock");
    let ids: HashSet<String> = all.iter().map(message_id).collect();
    assert_eq!(ids.len(), 1_000, "every row published after the restart");
    assert_key_order(&all);
    stop_relay(relay).await;
}

#[tokio::test]
async fn rows_wait_in_the_slot_while_the_broker_is_down() {
    let rabbit = Rabbit::start().await;
    let client = Client::connect_to(&rabbit.url()).await;
    let mut f = fresh_on("cdc-broker", client, &rabbit.url(), None).await;
    // The 200 rows held in the slot below are more WAL than this: the alert must rise.
    f.config.relay.max_slot_lag = 1024;
    let (relay, metrics) = f.active_relay_counted().await;
    rabbit.stop().await;
    seed_outbox(&f.store, &f.exchange, 5, 200).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        f.store.outbox_status().await.expect("status").pending,
        200,
        "nothing marked"
    );
    // The relay lets the slot go once it finds the broker gone; the rows must still be in it.
    // (Its confirmed position is no measure: WAL is the server's, and an idle relay rightly
    // confirms other tests' writes, also ones between the test's last look and the rows.)
    let held = wait_for("the relay to let the slot go", WAIT, || {
        inserts_in_slot(&f.url, &f.slot)
    })
    .await;
    assert_eq!(
        held, 200,
        "the slot moved past rows the broker did not confirm"
    );
    wait_for(
        "the slot-lag alert while nothing confirms",
        WAIT,
        || async { metrics.outbox.slot_lag_alert().map(|_| ()) },
    )
    .await;
    assert!(metrics.outbox.cdc_slot_lag_bytes.get() > 1024);
    rabbit.start_again().await;
    wait_published("all rows published after the outage", &f.store, WAIT).await;
    stop_relay(relay).await;
    let n = rabbit.wait_depth(&f.sink, 200, WAIT).await;
    assert_eq!(n, 200, "each row once: the slot had not moved");
    f.drop_slot().await;
}

#[tokio::test]
async fn a_second_relay_stands_by_and_takes_over_when_the_active_one_stops() {
    let f = fresh("cdc-standby").await;
    let a = f.active_relay().await;
    let mb = Arc::new(Metrics::default());
    let b = run_relay(cdc_relay(
        &f.config,
        Store::connect(&f.url, 4).await.expect("store"),
        mb.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        mb.outbox.cdc_active.get(),
        0,
        "one slot, one reader: b stands by"
    );
    seed_outbox(&f.store, &f.exchange, 5, 100).await;
    f.receive(100).await;
    stop_relay(a).await;
    wait_active(&mb).await;
    seed_outbox(&f.store, &f.exchange, 5, 100).await;
    let after = f.receive(100).await;
    assert_eq!(after.len(), 100, "the standby publishes what follows, once");
    stop_relay(b).await;
    f.drop_slot().await;
}

/// A running gateway (the enrollment handler, a PostgreSQL store, `[relay] mode = "cdc"`):
/// each message's three events go through the outbox and the slot to the sink, each event
/// once, and a message's three (one ordering key) in the order the handler emitted them.
#[tokio::test]
async fn a_gateway_in_cdc_mode_relays_its_handlers_events_once_in_key_order_through_the_slot() {
    const MESSAGES: usize = 300;
    let client = Client::connect().await;
    let (queue, input, events) = (unique("cdc-gw"), unique("in"), unique("cdc-events"));
    // The input exchange exists (durable topic, as the route declares it) before the gateway.
    client.sink(&input).await;
    let sink = client.sink(&events).await;
    let url = pg_database().await;
    let slot = slot_name();
    let vars = format!("events_exchange = \"{events}\"");
    let toml = with_store(&route_config(&queue, "enrollment", &input, &vars, ""), &url).replace(
        "[relay]\n",
        &format!("[relay]\nmode = \"cdc\"\nslot = \"{slot}\"\npublication = \"{slot}\"\n"),
    );
    assert!(
        toml.contains("mode = \"cdc\""),
        "the route config has a [relay] table: {toml}"
    );
    let metrics = Arc::new(Metrics::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Gateway::start_in(dir, &toml, metrics.clone()).await;
    // Active before the first commit: the backlog drain (the polling path) found nothing, so
    // every event below can only come through the slot.
    wait_active(&metrics).await;
    let before = confirmed_lsn(&url, &slot)
        .await
        .expect("the gateway's relay created its slot");
    client.wait_for_consumer(&queue).await;
    for i in 0..MESSAGES {
        let body = format!(r#"{{"matricula_id":"M{i}","usuario_id":"U{i}","curso_id":"C1"}}"#);
        let props = json_props(&format!("m-{i}"));
        client
            .publish(&input, "matricula.confirmada", props, body.as_bytes())
            .await;
    }
    let mut all = receive(&client, &sink, 3 * MESSAGES, WAIT).await;
    wait_published("every outbox row marked published", &gw.store, WAIT).await;
    wait_slot_past(
        "the slot advanced past the gateway's commits",
        &url,
        &slot,
        before,
    )
    .await;
    // A late repeat would land by now: the rows are marked and the slot moved past them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    all.extend(client.drain(&sink).await);
    gw.stop().await;
    drop_slot(&url, &slot).await;

    let ids: HashSet<String> = all.iter().map(message_id).collect();
    assert_eq!(all.len(), 3 * MESSAGES, "three events a message, each once");
    assert_eq!(ids.len(), 3 * MESSAGES, "each with its own event id");
    // Arrival order per message (the rows of one message share an ordering key).
    let mut by_message: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in &all {
        let headers = m.delivery.properties.headers().as_ref();
        let cause = header_text(headers, enrollment_rules::CAUSATION_HEADER)
            .expect("each event names the message that caused it");
        by_message
            .entry(cause)
            .or_default()
            .push(m.delivery.routing_key.to_string());
    }
    assert_eq!(by_message.len(), MESSAGES, "events of every message");
    for (cause, keys) in &by_message {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        assert_eq!(
            keys,
            enrollment_rules::ROUTING_KEYS.to_vec(),
            "{cause}: emitted order kept"
        );
    }
}

#[test]
fn cdc_on_sqlite_is_a_config_error_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("carteiro.toml");
    std::fs::write(
        &path,
        "version = 1\n[broker]\nurl = \"amqp://localhost\"\n[store]\nurl = \"sqlite://x.db\"\n[relay]\nmode = \"cdc\"\n",
    )
    .expect("write");
    let err = carteiro::config::load(&path)
        .expect_err("cdc on SQLite refused")
        .to_string();
    assert!(err.contains("relay.mode"), "{err}");
    assert!(err.contains("not PostgreSQL"), "{err}");
}
