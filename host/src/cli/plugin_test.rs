//! `carteiro plugin test`: run a real component in the real runtime on one message, with an
//! in-memory kv store and no broker; print the verdict and the effects it would commit.
//! Either world runs: a wasi:messaging component sees the routing key as topic and the
//! headers as metadata, and its `producer.send` shows as outbox rows.

pub use crate::runtime::MemoryKv;
use crate::runtime::{
    Header, KvSource, Message, Plugin, PluginLimits, Runtime, StandardErrorPolicy, Verdict, World,
};
use anyhow::Context;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `carteiro plugin test`.
#[derive(Debug, clap::Args)]
pub struct PluginTestArgs {
    /// The `.wasm` component to run.
    pub wasm: PathBuf,
    /// A message file: {"body": <JSON or string>, "headers": {..}, "message_id": "..",
    /// "routing_key": "..", "exchange": "..", "content_type": ".."}.
    #[arg(long)]
    pub message: Option<PathBuf>,
    /// The body as text (overrides the file's body).
    #[arg(long)]
    pub body: Option<String>,
    /// A header `name=value` (repeatable; adds to the file's headers).
    #[arg(long = "header", value_parser = parse_pair)]
    pub headers: Vec<(String, String)>,
    /// A plugin variable `name=value` (repeatable), as `[plugins.X.variables]` would give.
    #[arg(long = "var", value_parser = parse_pair)]
    pub vars: Vec<(String, String)>,
    /// Exit non-zero unless the outcome is this: ack, retry, dead-letter or failure.
    #[arg(long)]
    pub expect: Option<Expected>,
    /// Wall-clock budget for the call.
    #[arg(long, default_value = "5s", value_parser = crate::common::units::parse_duration)]
    pub timeout: Duration,
    /// Memory cap, e.g. 64MiB.
    #[arg(long, default_value = "64MiB", value_parser = crate::common::units::parse_size)]
    pub memory: u64,
    /// A wasi:messaging component: the exchange its `producer.send` goes to, as
    /// `[plugins.X] standard_exchange` would give (unset: it may not send).
    #[arg(long)]
    pub standard_exchange: Option<String>,
    /// A wasi:messaging component: what its `permission-denied` and `other` errors become,
    /// as a route's `standard_errors` would say.
    #[arg(long, value_enum, default_value = "retry")]
    pub standard_errors: StandardErrors,
}

/// `--standard-errors`: a route's `standard_errors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StandardErrors {
    Retry,
    DeadLetter,
}

impl From<StandardErrors> for StandardErrorPolicy {
    fn from(value: StandardErrors) -> Self {
        match value {
            StandardErrors::Retry => Self::Retry,
            StandardErrors::DeadLetter => Self::DeadLetter,
        }
    }
}

/// Outcomes `--expect` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Expected {
    Ack,
    Retry,
    DeadLetter,
    Failure,
}

impl Expected {
    /// As `--expect` and the verdict line spell it (`dead-letter`, not `DeadLetter`).
    fn words(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map_or_else(|| format!("{self:?}"), |v| v.get_name().to_owned())
    }
}

fn parse_pair(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("`{text}` is not name=value"))
}

/// The message file format.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageFile {
    body: Option<serde_json::Value>,
    #[serde(default)]
    headers: BTreeMap<String, serde_json::Value>,
    message_id: Option<String>,
    routing_key: Option<String>,
    exchange: Option<String>,
    content_type: Option<String>,
}

fn text_of(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn build_message(args: &PluginTestArgs) -> anyhow::Result<Message> {
    let file: MessageFile = match &args.message {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read message file {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not a valid message file (see `carteiro plugin test --help`)",
                    path.display()
                )
            })?
        }
        None => MessageFile::default(),
    };
    let body = match (&args.body, &file.body) {
        (Some(text), _) => text.clone().into_bytes(),
        (None, Some(serde_json::Value::String(s))) => s.clone().into_bytes(),
        (None, Some(json)) => serde_json::to_vec(json)?,
        (None, None) => Vec::new(),
    };
    let is_json = matches!(&file.body, Some(v) if !v.is_string()) && args.body.is_none();
    let mut headers: Vec<Header> = file
        .headers
        .iter()
        .map(|(name, value)| Header {
            name: name.clone(),
            value: text_of(value),
        })
        .collect();
    headers.extend(args.headers.iter().map(|(name, value)| Header {
        name: name.clone(),
        value: value.clone(),
    }));
    Ok(Message {
        id: file.message_id,
        exchange: file.exchange.unwrap_or_default(),
        routing_key: file.routing_key.unwrap_or_default(),
        headers,
        content_type: file
            .content_type
            .or_else(|| is_json.then(|| "application/json".to_owned())),
        body,
        attempt: 1,
        redelivered: false,
    })
}

fn printable(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if text.len() <= 2000 => text.to_owned(),
        Ok(text) => format!(
            "{}… ({} bytes)",
            &text[..text.floor_char_boundary(2000)],
            bytes.len()
        ),
        Err(_) => format!("<{} bytes, not UTF-8>", bytes.len()),
    }
}

/// Runs the command; returns the process exit code.
pub async fn run(args: PluginTestArgs) -> anyhow::Result<i32> {
    let message = build_message(&args)?;
    let runtime =
        Runtime::with_compile_cache(4, crate::runtime::default_compile_cache().as_deref())
            .map_err(|e| anyhow::anyhow!("cannot start the wasm runtime: {e:#}"))?;
    let limits = PluginLimits {
        timeout: args.timeout,
        memory_bytes: args.memory,
        max_host_calls: 10_000,
        max_events: 100,
        totals: crate::runtime::DeliveryTotals::default(),
        max_concurrency: None,
        isolation: Some(crate::runtime::Isolation::PerDelivery),
    };
    let name = args
        .wasm
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "plugin".into());
    let plugin = Plugin::load(
        &runtime,
        &name,
        &args.wasm,
        None,
        limits,
        args.vars.iter().cloned().collect(),
    )?
    .with_standard_exchange(args.standard_exchange.clone());
    println!("plugin   {} (sha256 {})", plugin.name(), plugin.digest());
    println!("world    {}", plugin.world().label());
    let kv: Arc<dyn KvSource> = Arc::new(MemoryKv::default());
    let outcome = plugin.handle(&message, kv).await;
    let actual = match &outcome {
        Ok(invocation) => {
            if let Some(error) = &invocation.standard_error {
                println!("answer   {}", error.reason());
            } else if plugin.world() == World::Standard {
                println!("answer   ok");
            }
            let shown = invocation.verdict_for(args.standard_errors.into());
            let verdict = match &shown {
                Verdict::Ack => {
                    println!("verdict  ack");
                    Expected::Ack
                }
                Verdict::Retry(r) => {
                    println!("verdict  retry (delay {:?} ms): {}", r.delay_ms, r.reason);
                    Expected::Retry
                }
                Verdict::DeadLetter(reason) => {
                    println!("verdict  dead-letter: {reason}");
                    Expected::DeadLetter
                }
            };
            let effects = &invocation.effects;
            let committed = matches!(shown, Verdict::Ack);
            let note = if committed {
                ""
            } else {
                " (discarded: only ack commits)"
            };
            println!("kv writes{note}: {}", effects.writes.len());
            for (key, value) in &effects.writes {
                match value {
                    Some(v) => println!("  set    {key:?} = {}", printable(v)),
                    None => println!("  delete {key:?}"),
                }
            }
            println!("outbox{note}: {}", effects.events.len());
            for event in &effects.events {
                println!(
                    "  {} -> exchange {:?} routing key {:?} ({}): {}",
                    event.event_id,
                    event.exchange,
                    event.routing_key,
                    event.content_type.as_deref().unwrap_or("no content type"),
                    printable(&event.payload)
                );
            }
            verdict
        }
        Err(failure) => {
            println!("failure  {}: {failure}", failure.kind());
            Expected::Failure
        }
    };
    match args.expect {
        Some(expected) if expected != actual => {
            eprintln!("expected {}, got {}", expected.words(), actual.words());
            Ok(1)
        }
        _ => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::Expected;

    #[test]
    fn a_mismatch_names_outcomes_as_the_cli_spells_them() {
        assert_eq!(Expected::DeadLetter.words(), "dead-letter");
        assert_eq!(Expected::Ack.words(), "ack");
    }
}
