//! The gateways' config for a campaign: four routes, short heartbeats, leases and backoffs
//! so that faults bite and recoveries are quick. Its names and timings are the ones the
//! workload, the faults and the checker agree on, so they live here, below all of them.

use std::path::Path;
use std::time::Duration;

/// Routes (also their queues) and plugin namespaces.
pub const ROUTE_ENROLL: &str = "chaos-enroll";
pub const ROUTE_COUNTER: &str = "chaos-counter";
pub const ROUTE_FLAKY: &str = "chaos-flaky";
pub const ROUTE_DOWNSTREAM: &str = "chaos-downstream";
/// The `route` of the outbox rows the poison-row fault commits straight into the store.
pub const ROUTE_POISON: &str = "chaos-poison";
/// The `route` of the rows the large-transaction fault commits straight into the store.
pub const ROUTE_LARGE: &str = "chaos-large";
/// A route whose handler takes its deliveries in batches (`handle-batch`).
pub const ROUTE_BATCH: &str = "chaos-batch";
pub const NS_ENROLL: &str = "enrollment";
pub const NS_COUNTER: &str = "counter";
pub const NS_FLAKY: &str = "mixed";
pub const NS_DOWNSTREAM: &str = "downstream";
pub const NS_BATCH: &str = "batch";
/// Most deliveries in one `handle-batch` call.
pub const BATCH_MAX: u32 = 16;
/// The exchange every input goes to; the routing key picks the route.
pub const INPUT_EXCHANGE: &str = "chaos.in";
/// The relay lease and AMQP heartbeat; a pause fault outlasts both.
pub const LEASE: Duration = Duration::from_secs(6);
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// The longest reconnect backoff; a broker outage outlasts it.
pub const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// The exchange the upstream routes emit to; the downstream route and the sink consume it.
pub const EVENTS_EXCHANGE: &str = "chaos.events";
/// Where the downstream route's own events go (a capped queue nobody checks).
pub const DOWN_EXCHANGE: &str = "chaos.down";
pub const DOWN_QUEUE: &str = "chaos-down-sink";
/// The routing keys of the events the upstream handlers emit.
pub const EVENT_KEYS: [&str; 5] = [
    "acesso.liberado",
    "fatura.solicitada",
    "email.solicitado",
    "counter.incremented",
    "counter-batch.done",
];
/// The relays' byte window: a large transaction is several times larger.
pub const RELAY_WINDOW_BYTES: u64 = 4 << 20;
/// The event type the unroutable fault unbinds: the campaign binds it itself (through
/// [`UNROUTABLE_EXCHANGE`]), so that no gateway's topology declare binds it back.
pub const UNROUTABLE_KEY: &str = "email.solicitado";
/// Where that event type goes from the events exchange: a fanout to the sink and to the
/// downstream route's queue.
pub const UNROUTABLE_EXCHANGE: &str = "chaos.email";
/// The retry tiers every route has.
pub const BACKOFF_MS: [u64; 2] = [300, 1000];

/// What varies between campaigns.
pub struct Setup<'a> {
    pub broker_urls: &'a [String],
    pub store_url: &'a str,
    pub plugins: &'a Path,
    /// Relays run inside the gateways (with immediate dispatch), besides any relay processes.
    pub relay_in_gateway: bool,
    pub quorum: bool,
    /// The relays read the outbox from a replication slot (PostgreSQL).
    pub cdc: bool,
}

/// The CDC relays' slot and publication.
pub const CDC_SLOT: &str = "chaos_outbox";

pub fn render(s: &Setup<'_>) -> String {
    let urls: Vec<String> = s.broker_urls.iter().map(|u| format!("\"{u}\"")).collect();
    // `[plugins.NAME]`: the component `file`.wasm, and its variables.
    let plugin = |name: &str, file: &str, variables: &[(&str, &str)]| {
        let path = s.plugins.join(format!("{file}.wasm")).display().to_string();
        let mut section = format!("\n[plugins.{name}]\npath = \"{path}\"\n");
        if !variables.is_empty() {
            section += &format!("[plugins.{name}.variables]\n");
        }
        for (variable, value) in variables {
            section += &format!("{variable} = \"{value}\"\n");
        }
        section
    };
    let queue_type = if s.quorum { "quorum" } else { "classic" };
    let backoff: Vec<String> = BACKOFF_MS.iter().map(|ms| format!("\"{ms}ms\"")).collect();
    let route = |queue: &str, plugin: &str, exchange: &str, keys: &[&str], extra: &str| {
        let bindings: String = keys
            .iter()
            .map(|key| {
                format!("[[routes.bindings]]\nexchange = \"{exchange}\"\nrouting_key = \"{key}\"\n")
            })
            .collect();
        format!(
            r#"
[[routes]]
queue = "{queue}"
queue_type = "{queue_type}"
plugin = "{plugin}"
prefetch = 32
{extra}{bindings}[routes.retry]
max_attempts = 4
backoff = [{backoff}]
"#,
            backoff = backoff.join(", ")
        )
    };
    let mut text = format!(
        r#"# Written by carteiro-chaos for one campaign.
version = 1

[broker]
urls = [{urls}]
heartbeat = "{heartbeat}s"
connect_timeout = "3s"
publish_timeout = "2s"
reconnect_max_backoff = "{reconnect}s"

[store]
url = "{store}"
statement_timeout = "5s"

[relay]
enabled = {relay}
lease = "{lease}s"
poll_interval = "500ms"
max_in_flight = 256
max_in_flight_bytes = {window}
{cdc}
[admin]
listen = ""
"#,
        urls = urls.join(", "),
        heartbeat = HEARTBEAT.as_secs(),
        reconnect = RECONNECT_MAX.as_secs(),
        store = s.store_url,
        relay = s.relay_in_gateway,
        lease = LEASE.as_secs(),
        window = RELAY_WINDOW_BYTES,
        cdc = if s.cdc {
            format!("mode = \"cdc\"\nslot = \"{CDC_SLOT}\"\npublication = \"{CDC_SLOT}\"\n")
        } else {
            String::new()
        },
    );
    text += &plugin(
        "enrollment",
        "enrollment",
        &[("events_exchange", EVENTS_EXCHANGE)],
    );
    text += &plugin("counter", "counter", &[("out_exchange", EVENTS_EXCHANGE)]);
    text += &plugin("mixed", "fixture-mixed", &[]);
    text += &plugin(
        "batch",
        "counter-batch",
        &[("out_exchange", EVENTS_EXCHANGE)],
    );
    text += &plugin("downstream", "counter", &[("out_exchange", DOWN_EXCHANGE)]);
    text += &route(ROUTE_ENROLL, "enrollment", INPUT_EXCHANGE, &["enroll"], "");
    text += &route(ROUTE_COUNTER, "counter", INPUT_EXCHANGE, &["count"], "");
    text += &route(ROUTE_FLAKY, "mixed", INPUT_EXCHANGE, &["flaky"], "");
    let batch = format!("batch = {{ max = {BATCH_MAX}, wait = \"20ms\" }}\n");
    text += &route(ROUTE_BATCH, "batch", INPUT_EXCHANGE, &["batch"], &batch);
    let downstream: Vec<&str> = EVENT_KEYS
        .into_iter()
        .filter(|k| *k != UNROUTABLE_KEY)
        .collect();
    text += &route(
        ROUTE_DOWNSTREAM,
        "downstream",
        EVENTS_EXCHANGE,
        &downstream,
        "",
    );
    text
}

/// Every queue a route owns: work queue, retry tiers, DLQ.
pub fn queues_of(route: &str) -> Vec<String> {
    let mut q = vec![route.to_owned(), format!("{route}.dlq")];
    q.extend(BACKOFF_MS.iter().map(|ms| format!("{route}.retry.{ms}ms")));
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unroutable fault works only if no gateway binds that event type itself.
    #[test]
    fn the_downstream_route_binds_every_event_type_but_the_unroutable_one() {
        let plugins = Path::new("/p");
        let text = render(&Setup {
            broker_urls: &["amqp://x".to_owned()],
            store_url: "sqlite://x.db",
            plugins,
            relay_in_gateway: true,
            quorum: false,
            cdc: false,
        });
        let config: toml::Table = text.parse().expect("valid TOML");
        let routes = config["routes"].as_array().expect("routes");
        let downstream = routes
            .iter()
            .find(|r| r["queue"].as_str() == Some(ROUTE_DOWNSTREAM))
            .expect("downstream route");
        let keys: Vec<&str> = downstream["bindings"]
            .as_array()
            .expect("bindings")
            .iter()
            .map(|b| b["routing_key"].as_str().expect("key"))
            .collect();
        assert!(
            !keys.contains(&UNROUTABLE_KEY) && !keys.contains(&"#"),
            "{keys:?}"
        );
        for key in EVENT_KEYS.into_iter().filter(|k| *k != UNROUTABLE_KEY) {
            assert!(keys.contains(&key), "{key} not bound: {keys:?}");
        }
    }
}
