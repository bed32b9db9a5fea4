//! `carteiro shadow report`: what the running gateway's live shadows decided differently,
//! read from its admin server (`GET /shadow`).

use super::ops::load_config;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `carteiro shadow ...`
#[derive(Debug, clap::Subcommand)]
pub enum ShadowCommand {
    /// Agreements and disagreements per route and kind, then the newest disagreements (the
    /// gateway keeps the last 100): the live and the shadow decision of each.
    Report {
        /// Print the admin server's JSON as it is.
        #[arg(long)]
        json: bool,
    },
}

/// How long the admin server may take to answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// One request to the admin server of `admin` (plain HTTP/1.1), with its credentials when
/// the config has some; returns the status code and the body.
pub(super) async fn request(
    admin: &crate::config::AdminConfig,
    method: &str,
    path: &str,
) -> anyhow::Result<(u16, String)> {
    let address = admin.listen.as_str();
    let authorization = crate::admin::auth::client_authorization(admin)
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(TIMEOUT, request)
        .await
        .map_err(|_| anyhow::anyhow!("the admin server at {address} did not answer within {TIMEOUT:?}"))?
        .map_err(|e| anyhow::anyhow!("cannot reach the gateway's admin server at {address}: {e} (is `carteiro run` running with this config?)"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response from {address}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response from {address}"))?;
    Ok((status, body.to_owned()))
}

/// Runs a `shadow` subcommand; returns the exit code.
pub async fn run(config_path: &Path, command: ShadowCommand) -> anyhow::Result<i32> {
    let config = load_config(config_path)?;
    if config.admin.listen.is_empty() {
        anyhow::bail!(
            "the config has no admin server (`[admin] listen`); the report comes from it"
        );
    }
    let ShadowCommand::Report { json } = command;
    let (status, body) = request(&config.admin, "GET", "/shadow").await?;
    if status != 200 {
        anyhow::bail!("{}/shadow answered {status}: {body}", config.admin.listen);
    }
    if json {
        println!("{body}");
        return Ok(0);
    }
    let report: serde_json::Value = serde_json::from_str(&body)?;
    let empty = serde_json::Map::new();
    let counts = report["counts"].as_object().unwrap_or(&empty);
    if counts.is_empty() {
        println!("no live-shadow runs yet");
    }
    for (route, kinds) in counts {
        let kinds: Vec<String> = kinds
            .as_object()
            .unwrap_or(&empty)
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        println!("{route:<24} {}", kinds.join(", "));
    }
    let none = Vec::new();
    let kept = report["disagreements"].as_array().unwrap_or(&none);
    if !kept.is_empty() {
        println!("newest {} disagreements:", kept.len());
    }
    for d in kept {
        let text = |k: &str| d[k].as_str().unwrap_or("").to_owned();
        println!(
            "  {:<14} {:<24} {}\n      live:   {}\n      shadow: {}",
            text("kind"),
            text("route"),
            d["message_id"].as_str().unwrap_or("-"),
            text("live"),
            text("shadow")
        );
    }
    Ok(0)
}
