//! Loading and validating a config file: every error names the file, the key and (where the
//! TOML parser or a span knows it) the line, and says what to do.

use super::{Config, interpolate};
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

/// A config problem an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file the problem is in.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The dotted key, e.g. `routes[0].plugin`.
    pub key: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if self.key.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": `{}`: {}", self.key, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Reads, parses and validates a config file. Relative paths resolve against its folder.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_owned(),
        line: None,
        key: String::new(),
        message: format!("cannot read the config file: {e}"),
    })?;
    let base_dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    load_str(&text, path, &base_dir)
}

/// Parses and validates config text; `file` is only used in error messages.
pub fn load_str(text: &str, file: &Path, base_dir: &Path) -> Result<Config, ConfigError> {
    let err = |line: Option<usize>, key: &str, message: String| ConfigError {
        file: file.to_owned(),
        line,
        key: key.to_owned(),
        message,
    };
    let mut config: Config = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let key = line.map(|l| key_at_line(text, l)).unwrap_or_default();
        let mut message = e.message().to_owned();
        if message.ends_with("expected a duration") {
            message = format!("{message}; {}", crate::common::units::DURATION_HINT);
        }
        err(line, &key, message)
    })?;
    config.base_dir = base_dir.to_owned();
    let line_of_key = |needle: &str| find_line(text, needle);

    if config.version != 1 {
        return Err(err(
            line_of_key("version"),
            "version",
            format!(
                "unsupported version {}; this Carteiro reads version = 1",
                config.version
            ),
        ));
    }
    match (config.broker.url.is_empty(), config.broker.urls.is_empty()) {
        (true, true) => {
            return Err(err(
                line_of_key("[broker]"),
                "broker.url",
                "missing; set `url` (one broker) or `urls` (the nodes of a cluster)".into(),
            ));
        }
        (false, false) => {
            return Err(err(
                line_of_key("urls"),
                "broker.urls",
                "set either `url` or `urls`, not both".into(),
            ));
        }
        _ => {}
    }
    if !config.broker.url.is_empty() {
        config.broker.url = interpolate(&config.broker.url)
            .map_err(|m| err(line_of_key("url"), "broker.url", m.to_string()))?;
    }
    for url in &mut config.broker.urls {
        *url =
            interpolate(url).map_err(|m| err(line_of_key("urls"), "broker.urls", m.to_string()))?;
    }
    if config.broker.url.is_empty() {
        // The first node names the broker in logs and single-connection commands.
        config.broker.url = config.broker.urls[0].clone();
    }
    config
        .broker
        .validate_tls(base_dir)
        .map_err(|(key, m)| err(line_of_key(tls_line(&key)), &format!("broker.{key}"), m))?;
    config.store.url = interpolate(&config.store.url)
        .map_err(|m| err(line_of_key("url"), "store.url", m.to_string()))?;
    config
        .store
        .validate(base_dir)
        .map_err(|(key, m)| err(line_of_key(key), &format!("store.{key}"), m))?;
    config.runtime.resolve_paths(base_dir);
    config
        .relay
        .validate()
        .map_err(|(key, m)| err(line_of_key(key), &format!("relay.{key}"), m))?;
    config
        .relay
        .validate_for_store(&config.store.url)
        .map_err(|(key, m)| err(find_line_in(text, "relay", key), &format!("relay.{key}"), m))?;
    // `[relay] retention` is the old name of `[outbox] retain_published`: still read, with a
    // warning, and moved there.
    if let Some(retention) = config.relay.retention.take() {
        let line = find_line_in(text, "relay", "retention");
        if config.outbox.retain_published.is_some() {
            return Err(err(
                line,
                "relay.retention",
                "the old name of `[outbox] retain_published`, and both are set; keep only \
                 `[outbox] retain_published`"
                    .into(),
            ));
        }
        let deprecated = err(
            line,
            "relay.retention",
            "deprecated: rename it `retain_published` under `[outbox]` (same meaning); it is \
             read as that for now"
                .into(),
        );
        tracing::warn!("{deprecated}");
        config.outbox.retain_published = Some(retention);
    }
    validate_outboxes(&mut config.outboxes, base_dir).map_err(|(key, m)| {
        let line = line_of_key("[[outboxes]]");
        err(line, &key, m)
    })?;
    config.dead_letters.validate().map_err(|(key, m)| {
        let line = find_line_in(text, "dead_letters", key);
        err(line, &format!("dead_letters.{key}"), m)
    })?;
    if let Some(endpoint) = config.telemetry.otlp_endpoint.as_mut() {
        *endpoint = interpolate(endpoint).map_err(|m| {
            err(
                line_of_key("otlp_endpoint"),
                "telemetry.otlp_endpoint",
                m.to_string(),
            )
        })?;
    }
    config
        .telemetry
        .validate()
        .map_err(|(key, m)| err(line_of_key(key), &format!("telemetry.{key}"), m))?;
    config.admin.validate().map_err(|(key, m)| {
        // `basic.password` is on the `basic = { .. }` line.
        let line = line_of_key(key.split('.').next().unwrap_or(key));
        err(line, &format!("admin.{key}"), m)
    })?;
    config
        .security
        .validate(base_dir)
        .map_err(|(key, m)| err(line_of_key(key), &format!("security.{key}"), m))?;

    for (name, plugin) in &mut config.plugins {
        let key = format!("plugins.{name}");
        for (var, value) in &mut plugin.variables {
            *value = interpolate(value).map_err(|m| {
                err(
                    line_of_key(var),
                    &format!("{key}.variables.{var}"),
                    m.to_string(),
                )
            })?;
        }
        plugin.validate(base_dir).map_err(|(field, m)| {
            let needle = match field {
                "canary" => format!("[plugins.{name}.canary]"),
                "path" | "" => format!("[plugins.{name}]"),
                other => other.to_owned(),
            };
            let key = if field.is_empty() {
                key.clone()
            } else {
                format!("{key}.{field}")
            };
            err(line_of_key(&needle), &key, m)
        })?;
    }

    // Across sections and routes: each route names a known plugin and its own queue.
    let mut queues = BTreeSet::new();
    for (i, route) in config.routes.iter().enumerate() {
        let key = format!("routes[{i}]");
        let plugin_line = Some(line_of(text, route.plugin.span().start));
        if !config.plugins.contains_key(route.plugin_name()) {
            let known: Vec<&str> = config.plugins.keys().map(String::as_str).collect();
            return Err(err(
                plugin_line,
                &format!("{key}.plugin"),
                format!(
                    "route for queue `{}` names unknown plugin `{}`; known plugins: [{}]",
                    route.queue,
                    route.plugin_name(),
                    known.join(", ")
                ),
            ));
        }
        if route.queue.is_empty() || route.queue.len() > 200 {
            return Err(err(
                plugin_line,
                &format!("{key}.queue"),
                "queue names must be 1-200 characters".into(),
            ));
        }
        if !queues.insert(route.queue.clone()) {
            return Err(err(
                plugin_line,
                &format!("{key}.queue"),
                format!("queue `{}` is routed twice", route.queue),
            ));
        }
        route
            .validate()
            .map_err(|(field, m)| err(plugin_line, &format!("{key}.{field}"), m))?;
    }
    // A foreign DLQ is archived once, and never a queue a route declares (its own dead
    // letters are archived already, and a second consumer would split them).
    let declared_by_routes = |queue: &str| {
        config.routes.iter().find(|r| {
            queue == r.queue
                || queue == crate::topology::dlq_name(&r.queue)
                || queue == crate::topology::parked_name(&r.queue)
                || queue.starts_with(&format!("{}.retry.", r.queue))
        })
    };
    let mut names = BTreeSet::new();
    for (i, dlq) in config.dead_letter_queues.iter().enumerate() {
        let key = format!("dead_letter_queues[{i}]");
        let line = find_line(text, &format!("\"{}\"", dlq.queue));
        dlq.validate()
            .map_err(|(field, m)| err(line, &format!("{key}.{field}"), m))?;
        if let Some(route) = declared_by_routes(&dlq.queue) {
            return Err(err(
                line,
                &format!("{key}.queue"),
                format!(
                    "queue `{}` is one of route `{}`'s queues; a route's own dead letters are \
                     archived already",
                    dlq.queue, route.queue
                ),
            ));
        }
        if !names.insert(dlq.queue.clone()) {
            return Err(err(
                line,
                &format!("{key}.queue"),
                format!("dead-letter queue `{}` is listed twice", dlq.queue),
            ));
        }
    }
    Ok(config)
}

/// The line to point at for a `[broker]` TLS problem.
fn tls_line(key: &str) -> &str {
    match key.strip_prefix("tls.") {
        Some(field) => field,
        None if key == "tls" => "[broker.tls]",
        None => key,
    }
}

/// The dotted key a line sets (`[routes.retry]` + `backoff = ..` → `routes.retry.backoff`),
/// so a parse error names the key as well as the line.
fn key_at_line(text: &str, line: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let Some(current) = lines.get(line.saturating_sub(1)) else {
        return String::new();
    };
    let table = lines[..line.saturating_sub(1)]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    match current.split_once('=') {
        Some((key, _)) if !current.trim_start().starts_with('[') => match table {
            Some(table) => format!("{table}.{}", key.trim()),
            None => key.trim().to_owned(),
        },
        _ => table.unwrap_or_default(),
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The line that sets `key` in the table `[table]`, else the table's header line (for errors
/// found after parsing, where a key's name alone may also be another table's key).
/// `[[outboxes]]`: each entry's URL (environment, a SQLite path relative to the config
/// file, TLS parameters) and checks; names unique. `Err((key, message))`.
fn validate_outboxes(
    outboxes: &mut [crate::relay::AppOutboxConfig],
    base_dir: &Path,
) -> Result<(), (String, String)> {
    let mut names = std::collections::HashSet::new();
    for (i, outbox) in outboxes.iter_mut().enumerate() {
        let at = |key: &str| format!("outboxes[{i}].{key}");
        outbox.url = interpolate(&outbox.url).map_err(|m| (at("url"), m.to_string()))?;
        outbox.url = crate::store::resolve_sqlite_path(&outbox.url, base_dir);
        outbox.url = crate::store::check_tls_params(&outbox.url, base_dir)
            .map_err(|m| (at("url"), m.to_string()))?;
        outbox.validate().map_err(|(key, m)| (at(key), m))?;
        if !names.insert(outbox.name.clone()) {
            return Err((
                at("name"),
                format!("`{}` names two outboxes; give each its own", outbox.name),
            ));
        }
    }
    Ok(())
}

fn find_line_in(text: &str, table: &str, key: &str) -> Option<usize> {
    let header = format!("[{table}]");
    let mut inside = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.starts_with('[') {
            inside = line.starts_with(&header);
        } else if inside
            && line
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        {
            return Some(i + 1);
        }
    }
    find_line(text, &header)
}

/// Best-effort line of the first line mentioning `needle` (for errors found after parsing).
fn find_line(text: &str, needle: &str) -> Option<usize> {
    text.lines()
        .position(|l| l.trim_start().starts_with(needle) || l.contains(needle))
        .map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::housekeeping::Expire;
    use crate::logfmt::testing::LogBuffer;
    use std::time::Duration;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("p.wasm"), b"\0asm").expect("write");
        load_str(text, Path::new("carteiro.toml"), dir.path())
    }

    const GOOD: &str = r#"
version = 1
[broker]
url = "amqp://localhost"
[plugins.p]
path = "p.wasm"
[[routes]]
queue = "q"
plugin = "p"
"#;

    #[test]
    fn minimal_config_loads_with_defaults() {
        let config = parse(GOOD).expect("valid");
        assert_eq!(config.routes[0].prefetch, 32);
        assert_eq!(config.plugins["p"].memory, 64 << 20);
        assert!(config.store.url.starts_with("sqlite://"));
    }

    #[test]
    fn dead_letter_queues_load_as_the_issue_writes_them_and_are_checked() {
        let dlq = format!(
            "{GOOD}\n[[dead_letter_queues]]\nqueue = \"matriculas.dlq\"      # others' DLQ\n"
        );
        let config = parse(&dlq).expect("valid");
        assert_eq!(config.dead_letter_queues[0].route_name(), "matriculas.dlq");
        let full =
            format!("{dlq}route = \"matriculas\"\nalert = {{ count = 10, window = \"1h\" }}\n");
        let config = parse(&full).expect("valid");
        let q = &config.dead_letter_queues[0];
        assert_eq!(q.route_name(), "matriculas");
        assert_eq!(
            q.alert.map(|a| (a.count, a.window.as_secs())),
            Some((10, 3600))
        );
        let route_queue = format!("{GOOD}\n[[dead_letter_queues]]\nqueue = \"q\"\n");
        let err = parse(&route_queue).unwrap_err();
        assert_eq!(err.key, "dead_letter_queues[0].queue");
        assert!(err.message.contains("one of route `q`'s queues"), "{err}");
        let route_dlq = format!("{GOOD}\n[[dead_letter_queues]]\nqueue = \"q.dlq\"\n");
        assert_eq!(
            parse(&route_dlq).unwrap_err().key,
            "dead_letter_queues[0].queue"
        );
        let twice = format!("{dlq}\n[[dead_letter_queues]]\nqueue = \"matriculas.dlq\"\n");
        assert!(parse(&twice).unwrap_err().message.contains("listed twice"));
        let zero = format!("{dlq}alert = {{ count = 0, window = \"1h\" }}\n");
        assert_eq!(parse(&zero).unwrap_err().key, "dead_letter_queues[0].alert");
    }

    #[test]
    fn broker_urls_list_a_cluster_and_exclude_url() {
        let cluster = GOOD.replace(
            "url = \"amqp://localhost\"",
            "urls = [\"amqp://a:5672\", \"amqp://b:5672\"]",
        );
        let config = parse(&cluster).expect("valid");
        assert_eq!(
            config.broker.addresses(),
            ["amqp://a:5672", "amqp://b:5672"]
        );
        assert_eq!(
            config.broker.url, "amqp://a:5672",
            "the first node names the broker"
        );
        assert_eq!(
            parse(GOOD).expect("valid").broker.addresses(),
            ["amqp://localhost"]
        );
        let both = GOOD.replace(
            "url = \"amqp://localhost\"",
            "url = \"amqp://localhost\"\nurls = [\"amqp://b\"]",
        );
        let err = parse(&both).unwrap_err();
        assert!(err.to_string().contains("either `url` or `urls`"), "{err}");
        let err = parse(&GOOD.replace("url = \"amqp://localhost\"", "")).unwrap_err();
        assert!(err.to_string().contains("set `url`"), "{err}");
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let err =
            parse(&GOOD.replace("queue = \"q\"", "queue = \"q\"\nqueue_typo = 1")).unwrap_err();
        assert_eq!(err.line, Some(9));
        assert!(err.message.contains("queue_typo"), "{err}");
    }

    #[test]
    fn route_to_unknown_plugin_is_refused_with_line() {
        let err = parse(&GOOD.replace("plugin = \"p\"", "plugin = \"nope\"")).unwrap_err();
        assert_eq!(err.key, "routes[0].plugin");
        assert_eq!(err.line, Some(9));
        assert!(err.to_string().contains("unknown plugin `nope`"), "{err}");
    }

    #[test]
    fn bad_duration_and_missing_plugin_file_are_refused() {
        let bad = GOOD.replace("path = \"p.wasm\"", "path = \"p.wasm\"\ntimeout = \"soon\"");
        let err = parse(&bad).unwrap_err();
        assert!(
            err.message
                .contains("\"soon\", expected a duration; write e.g."),
            "{err}"
        );
        assert_eq!(err.key, "plugins.p.timeout");
        assert_eq!(err.line, Some(7));
        let missing = GOOD.replace("p.wasm", "missing.wasm");
        assert!(
            parse(&missing)
                .unwrap_err()
                .message
                .contains("no plugin file")
        );
    }

    #[test]
    fn telemetry_is_off_by_default_and_checked_when_on() {
        let config = parse(GOOD).expect("valid");
        assert_eq!(config.telemetry.otlp_endpoint, None);
        assert_eq!(config.telemetry.service_name, "carteiro");
        let on = format!(
            "{GOOD}[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\nservice_name = \"gw\"\n"
        );
        let config = parse(&on).expect("valid");
        assert_eq!(
            config.telemetry.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318")
        );
        assert_eq!(config.telemetry.service_name, "gw");
        let empty = format!("{GOOD}[telemetry]\notlp_endpoint = \"\"\n");
        assert_eq!(parse(&empty).expect("valid").telemetry.otlp_endpoint, None);
        for (bad, says) in [
            (
                "otlp_endpoint = \"https://c:4318\"",
                "https is not supported",
            ),
            ("otlp_endpoint = \"collector:4318\"", "not an OTLP/HTTP URL"),
            ("otlp_endpoint = \"http://\"", "not an OTLP/HTTP URL"),
            ("otlp_endpoint = \"${CARTEIRO_NO_SUCH_VAR}\"", "is not set"),
            ("service_name = \" \"", "must not be empty"),
            ("export_interval = \"0s\"", "above zero"),
            ("endpoint = \"http://c\"", "unknown field"),
        ] {
            let err = parse(&format!("{GOOD}[telemetry]\n{bad}\n")).unwrap_err();
            assert!(err.to_string().contains(says), "{bad}: {err}");
            assert!(err.key.starts_with("telemetry"), "{bad}: {}", err.key);
        }
    }

    #[test]
    fn admin_require_auth_and_allowed_hosts() {
        let all = format!("{GOOD}\n[admin]\nrequire_auth = \"all\"\n");
        let err = parse(&all).unwrap_err();
        assert_eq!(err.key, "admin.require_auth");
        let config = parse(&format!("{all}token = \"t\"\n")).expect("valid with a token");
        assert_eq!(config.admin.require_auth, crate::config::RequireAuth::All);
        let err = parse(&format!("{GOOD}\n[admin]\nrequire_auth = \"some\"\n")).unwrap_err();
        assert!(err.to_string().contains("require_auth"), "{err}");
        for bad in ["http://x", "x:9090", "", "a b"] {
            let text = format!("{GOOD}\n[admin]\nallowed_hosts = [\"{bad}\"]\n");
            let err = parse(&text).unwrap_err();
            assert_eq!(err.key, "admin.allowed_hosts", "{bad}");
        }
        let text = format!("{GOOD}\n[admin]\nallowed_hosts = [\"carteiro.internal\"]\n");
        parse(&text).expect("a host name");
    }

    #[test]
    fn admin_off_loopback_needs_credentials() {
        let open = format!("{GOOD}\n[admin]\nlisten = \"0.0.0.0:9090\"\n");
        let err = parse(&open).unwrap_err();
        assert_eq!(err.key, "admin.listen");
        assert!(err.message.contains("not a loopback address"), "{err}");
        let with_token = format!("{open}token = \"t0k\"\n");
        let config = parse(&with_token).expect("valid with a token");
        assert_eq!(
            config.admin.token.as_ref().map(|t| t.0.as_str()),
            Some("t0k")
        );
        assert!(
            !format!("{:?}", config.admin).contains("t0k"),
            "never printed"
        );
        let with_basic = format!("{open}basic = {{ user = \"ops\", password = \"pw\" }}\n");
        parse(&with_basic).expect("valid with basic auth");
        for loopback in ["127.0.0.1:9090", "[::1]:9090", "localhost:9090", ""] {
            let text = format!("{GOOD}\n[admin]\nlisten = \"{loopback}\"\n");
            parse(&text).unwrap_or_else(|e| panic!("{loopback}: {e}"));
        }
        let empty = format!("{GOOD}\n[admin]\ntoken = \"\"\n");
        assert!(parse(&empty).unwrap_err().message.contains("empty"));
    }

    /// [`parse`], with what it logged.
    fn parse_logged(text: &str) -> (Result<Config, ConfigError>, String) {
        let buffer = LogBuffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(buffer.clone())
            .finish();
        let parsed = tracing::subscriber::with_default(subscriber, || parse(text));
        (parsed, buffer.text())
    }

    #[test]
    fn retention_defaults_keep_dead_letters_and_published_rows_a_day() {
        let config = parse(GOOD).expect("valid");
        let policy = config.retention();
        assert_eq!(policy.outbox, Duration::from_secs(24 * 3600));
        assert_eq!(policy.dead_letters, None, "dead letters are kept forever");
        assert_eq!(policy.expire, Expire::Replayed);
        assert_eq!(policy.inbox, config.store.inbox_retention);

        let set = format!(
            "{GOOD}[outbox]\nretain_published = \"7d\"\n[dead_letters]\nretain = \"30d\"\n\
             expire = \"all\"\n"
        );
        let policy = parse(&set).expect("valid").retention();
        assert_eq!(policy.outbox, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(
            policy.dead_letters,
            Some(Duration::from_secs(30 * 24 * 3600))
        );
        assert_eq!(policy.expire, Expire::All);
        let replayed = format!("{GOOD}[dead_letters]\nretain = \"30d\"\n");
        let policy = parse(&replayed).expect("valid").retention();
        assert_eq!(policy.expire, Expire::Replayed, "the default");
    }

    #[test]
    fn relay_retention_is_a_deprecated_alias_of_outbox_retain_published() {
        let old = format!("{GOOD}[store]\ninbox_retention = \"2d\"\n[relay]\nretention = \"3h\"\n");
        let (parsed, logged) = parse_logged(&old);
        let config = parsed.expect("still valid");
        assert_eq!(config.retention().outbox, Duration::from_secs(3 * 3600));
        assert_eq!(config.relay.retention, None, "moved to [outbox]");
        assert!(logged.contains("WARN"), "{logged}");
        assert!(
            logged.contains("carteiro.toml:13: `relay.retention`: deprecated"),
            "{logged}"
        );
        let (_, logged) = parse_logged(GOOD);
        assert!(!logged.contains("deprecated"), "{logged}");
    }

    #[test]
    fn relay_retention_and_outbox_retain_published_together_are_refused() {
        let both = format!(
            "{GOOD}[store]\ninbox_retention = \"2d\"\n[relay]\nretention = \"3h\"\n\
             [outbox]\nretain_published = \"7d\"\n"
        );
        let err = parse(&both).unwrap_err();
        assert_eq!(err.key, "relay.retention");
        assert_eq!(err.line, Some(13));
        assert!(
            err.message
                .contains("keep only `[outbox] retain_published`"),
            "{err}"
        );
    }

    #[test]
    fn retention_durations_and_expire_are_checked() {
        for (bad, key, says) in [
            (
                "[dead_letters]\nretain = \"soon\"",
                "dead_letters.retain",
                "\"soon\", expected a duration; write e.g.",
            ),
            (
                "[dead_letters]\nretain = \"0s\"",
                "dead_letters.retain",
                "above zero",
            ),
            (
                "[dead_letters]\nretain = \"30d\"\nexpire = \"some\"",
                "dead_letters.expire",
                "unknown variant `some`",
            ),
            (
                "[dead_letters]\nkeep = \"30d\"",
                "dead_letters.keep",
                "unknown field",
            ),
            (
                "[outbox]\nretain_published = \"a week\"",
                "outbox.retain_published",
                "expected a duration",
            ),
            (
                "[relay]\nretention = \"-1d\"",
                "relay.retention",
                "expected a duration",
            ),
        ] {
            let err = parse(&format!("{GOOD}{bad}\n")).unwrap_err();
            assert!(err.to_string().contains(says), "{bad}: {err}");
            assert_eq!(err.key, key, "{bad}");
            assert!(err.line.is_some_and(|l| l > 9), "{bad}: {err}");
        }
    }

    #[test]
    fn admin_secrets_come_from_the_environment() {
        let text = format!("{GOOD}\n[admin]\ntoken = \"${{CARTEIRO_TEST_UNSET_TOKEN_VAR}}\"\n");
        let err = parse(&text).unwrap_err();
        assert_eq!(err.key, "admin.token");
        assert!(
            err.message.contains("CARTEIRO_TEST_UNSET_TOKEN_VAR"),
            "{err}"
        );
    }
}
