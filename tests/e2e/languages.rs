//! The same guarantees for every handler language (issue 17): the enrollment handler in
//! Rust, Python (componentize-py) and JavaScript (ComponentizeJS) through the real gateway,
//! broker and SQLite — effects once with duplicates, retry then success, a dead letter that
//! names the field, SIGKILL after commit — and each language's misbehaving fixture
//! classified, with the host healthy afterwards.

use crate::support::dead_letters;
use crate::support::{
    Client, Gateway, assert_once_or_resent, crash_at_fault, drain_after_kill, json_props, plugin,
    plugin_limits, route_config, unique, wait_for, wait_published,
};
use carteiro::common::labels::Outcome;
use carteiro::metrics::Metrics;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Python and JS components take long to compile in a debug build: generous waits.
const WAIT: Duration = Duration::from_secs(240);
const LANGUAGES: [&str; 3] = ["enrollment", "enrollment-py", "enrollment-js"];

/// Compiles `name` once per test process into the default compile cache, so the tests
/// that load it (in-process or as child processes) start from a warm cache instead of all
/// compiling it at once.
fn warm(name: &str) {
    static WARMED: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    let warmed = WARMED.get_or_init(|| Mutex::new(Vec::new()));
    let mut done = warmed.lock().unwrap_or_else(|e| e.into_inner());
    if done.iter().any(|n| n == name) {
        return;
    }
    let cache = carteiro::runtime::default_compile_cache();
    let runtime =
        carteiro::runtime::Runtime::with_compile_cache(1, cache.as_deref()).expect("runtime");
    let limits = plugin_limits(Duration::from_secs(5), 64 << 20, 10_000, 100);
    carteiro::runtime::Plugin::load(
        &runtime,
        name,
        &plugin(name),
        None,
        limits,
        Default::default(),
    )
    .unwrap_or_else(|e| panic!("{name} loads: {e}"));
    done.push(name.to_owned());
}

fn body(id: &str) -> Vec<u8> {
    format!(r#"{{"matricula_id":"{id}","usuario_id":"U1","curso_id":"C1"}}"#).into_bytes()
}

struct Enrollment {
    client: Client,
    queue: String,
    exchange: String,
    sink: String,
    toml: String,
}

impl Enrollment {
    async fn new(plugin_name: &str, vars: &str, extra: &str) -> Self {
        let plugin_name = plugin_name.to_owned();
        tokio::task::spawn_blocking({
            let name = plugin_name.clone();
            move || warm(&name)
        })
        .await
        .expect("warm");
        let (queue, exchange, events) = (unique("lang"), unique("in"), unique("events"));
        let client = Client::connect().await;
        client.sink(&exchange).await;
        let sink = client.sink(&events).await;
        let vars = format!("events_exchange = \"{events}\"\n{vars}");
        let toml = route_config(&queue, &plugin_name, &exchange, &vars, extra)
            .replace("timeout = \"2s\"", "timeout = \"10s\"")
            .replace("memory = \"32MiB\"", "memory = \"64MiB\"");
        Self {
            client,
            queue,
            exchange,
            sink,
            toml,
        }
    }

    async fn start(&self, dir: tempfile::TempDir, metrics: Arc<Metrics>) -> Gateway {
        let gw = Gateway::start_in(dir, &self.toml, metrics).await;
        self.client.wait_for_consumer(&self.queue).await;
        gw
    }

    async fn publish(&self, id: &str, body: &[u8]) {
        self.client
            .publish(&self.exchange, "matricula.confirmada", json_props(id), body)
            .await;
    }

    /// Every event that reached the sink within `settle` after the first `expected`.
    async fn events(&self, expected: usize) -> Vec<lapin::message::BasicGetMessage> {
        let mut all = Vec::new();
        let deadline = Instant::now() + WAIT;
        while all.len() < expected {
            assert!(
                Instant::now() < deadline,
                "{} of {expected} events",
                all.len()
            );
            all.extend(self.client.drain(&self.sink).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        all.extend(self.client.drain(&self.sink).await);
        all
    }
}

async fn record(gw: &Gateway, plugin: &str, id: &str) -> Option<serde_json::Value> {
    let entry = gw
        .store
        .kv_get(plugin, &format!("matricula/{id}"))
        .await
        .ok()??;
    serde_json::from_slice(&entry.value).ok()
}

async fn effects_once_with_duplicates(plugin: &str) {
    let route = Enrollment::new(plugin, "", "").await;
    let metrics = Arc::new(Metrics::default());
    let gw = route
        .start(tempfile::tempdir().expect("tempdir"), metrics.clone())
        .await;
    route.publish("m-1", &body("M1")).await;
    route.publish("m-1", &body("M1")).await;
    route.publish("m-2", &body("M2")).await;
    let events = route.events(6).await;
    assert_eq!(
        events.len(),
        6,
        "{plugin}: three events per enrollment, once"
    );
    for id in ["M1", "M2"] {
        let rec = wait_for(&format!("{plugin}: record {id}"), WAIT, || {
            record(&gw, plugin, id)
        })
        .await;
        assert_eq!(rec["curso_id"], "C1", "{plugin}: {rec}");
    }
    let mut keys: Vec<String> = events
        .iter()
        .map(|m| m.delivery.routing_key.to_string())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "acesso.liberado",
            "acesso.liberado",
            "email.solicitado",
            "email.solicitado",
            "fatura.solicitada",
            "fatura.solicitada"
        ],
        "{plugin}"
    );
    assert_eq!(
        metrics.delivered(&route.queue, Outcome::Duplicate),
        1,
        "{plugin}"
    );
    gw.stop().await;
}

async fn retry_then_success(plugin: &str) {
    let extra = "[routes.retry]\nmax_attempts = 5\nbackoff = [\"2s\"]";
    let down = Enrollment::new(plugin, "content_service = \"down\"", extra).await;
    let metrics = Arc::new(Metrics::default());
    let gw = down
        .start(tempfile::tempdir().expect("tempdir"), metrics.clone())
        .await;
    down.publish("r-1", &body("R1")).await;
    wait_for(&format!("{plugin}: a retry"), WAIT, || async {
        (metrics.delivered(&down.queue, Outcome::Retried) > 0).then_some(())
    })
    .await;
    // The content service is back: the same route, the same store, the retry copy returns.
    let dir = gw.stop().await;
    let up = Enrollment {
        toml: down.toml.replace("content_service = \"down\"", ""),
        ..down
    };
    let gw = up.start(dir, Arc::new(Metrics::default())).await;
    let rec = wait_for(
        &format!("{plugin}: committed after its retry"),
        WAIT,
        || record(&gw, plugin, "R1"),
    )
    .await;
    assert_eq!(rec["matricula_id"], "R1");
    assert_eq!(up.events(3).await.len(), 3, "{plugin}: events once");
    gw.stop().await;
}

async fn dead_letter_names_the_field(plugin: &str) {
    let route = Enrollment::new(plugin, "", "").await;
    let gw = route
        .start(tempfile::tempdir().expect("tempdir"), Arc::default())
        .await;
    route
        .publish("bad-1", br#"{"matricula_id":"B1","usuario_id":"U1"}"#)
        .await;
    let rows = dead_letters(&gw.store, &route.queue, 1).await;
    assert!(
        rows[0].letter.reason.contains("missing field `curso_id`"),
        "{plugin}: {}",
        rows[0].letter.reason
    );
    if plugin != "enrollment" {
        // The Python and JS SDKs check UTF-8 natively (a fatal TextDecoder in
        // StarlingMonkey), and name the first bad byte only once the check failed.
        route.publish("bad-2", b"{\"matricula_id\":\"\xff\"}").await;
        let rows = dead_letters(&gw.store, &route.queue, 2).await;
        let reasons: Vec<&str> = rows.iter().map(|r| r.letter.reason.as_str()).collect();
        let named = "body is not UTF-8 (invalid byte at offset 17)";
        assert!(
            reasons.iter().any(|r| r.contains(named)),
            "{plugin}: {reasons:?}"
        );
    }
    gw.stop().await;
}

async fn sigkill_after_commit(plugin: &str) {
    let route = Enrollment::new(plugin, "", "").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = route
        .toml
        .replace("{dir}", &dir.path().display().to_string());
    let config = dir.path().join("carteiro.toml");
    std::fs::write(&config, &toml).expect("config");
    let publish = async {
        route.client.wait_for_consumer(&route.queue).await;
        route.publish("k-1", &body("K1")).await;
    };
    let crash =
        tokio::task::spawn_blocking(move || crash_at_fault("run", &config, "hang-after-commit"));
    publish.await;
    crash.await.expect("crash task");
    // What the killed gateway's relay had not marked goes out again from the restarted one
    // (G3: at least once).
    let before_kill = drain_after_kill(&route.client, &route.sink).await;
    let metrics = Arc::new(Metrics::default());
    let gw = route.start(dir, metrics.clone()).await;
    wait_for(
        &format!("{plugin}: the redelivery settled"),
        WAIT,
        || async { (metrics.delivered(&route.queue, Outcome::Duplicate) > 0).then_some(()) },
    )
    .await;
    assert_eq!(
        metrics.handler_runs(&route.queue),
        0,
        "{plugin}: not run again"
    );
    assert!(record(&gw, plugin, "K1").await.is_some());
    wait_published(&format!("{plugin}: every event published"), &gw.store, WAIT).await;
    let after = route.client.drain(&route.sink).await;
    assert_once_or_resent(plugin, 3, &before_kill, &after);
    gw.stop().await;
}

macro_rules! per_language {
    ($($test:ident => $scenario:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            for plugin in LANGUAGES {
                $scenario(plugin).await;
            }
        }
    )*};
}

per_language! {
    every_language_commits_effects_once_with_duplicates => effects_once_with_duplicates,
    every_language_retries_then_succeeds => retry_then_success,
    every_language_dead_letters_naming_the_field => dead_letter_names_the_field,
    every_language_survives_sigkill_after_commit => sigkill_after_commit,
}

async fn fixture_is_classified(fixture: &str) {
    let extra = "on_plugin_failure = \"dead-letter\"";
    let route = Enrollment::new(fixture, "", extra).await;
    let toml = route.toml.replace("timeout = \"10s\"", "timeout = \"3s\"");
    let route = Enrollment { toml, ..route };
    let gw = route
        .start(tempfile::tempdir().expect("tempdir"), Arc::default())
        .await;
    for attack in ["raise", "loop", "hog"] {
        route
            .publish(&format!("fx-{attack}"), attack.as_bytes())
            .await;
    }
    let rows = dead_letters(&gw.store, &route.queue, 3).await;
    let kind = |body: &str| {
        let row = rows
            .iter()
            .find(|d| d.letter.body == body.as_bytes())
            .unwrap_or_else(|| panic!("{fixture}: no dead letter for {body}"));
        let kind = row
            .letter
            .headers
            .iter()
            .find(|(k, _)| k == "x-carteiro-failure")
            .map(|(_, v)| v.clone());
        (kind, row.letter.reason.clone())
    };
    let (raise, reason) = kind("raise");
    assert_eq!(raise.as_deref(), Some("trap"), "{fixture}: {reason}");
    assert!(
        reason.contains("deliberate exception"),
        "{fixture}: {reason}"
    );
    assert_eq!(kind("loop").0.as_deref(), Some("timeout"), "{fixture}");
    assert_eq!(kind("hog").0.as_deref(), Some("memory"), "{fixture}");
    // The host is healthy: a good message still acks.
    route.publish("fx-ok", b"fine").await;
    wait_for(
        &format!("{fixture}: a good message acked"),
        WAIT,
        || async {
            gw.store
                .inbox_contains(&route.queue, "fx-ok")
                .await
                .ok()?
                .then_some(())
        },
    )
    .await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_javascript_fixtures_are_classified_and_the_host_stays_healthy() {
    for fixture in ["fixture-misbehave-py", "fixture-misbehave-js"] {
        fixture_is_classified(fixture).await;
    }
}
