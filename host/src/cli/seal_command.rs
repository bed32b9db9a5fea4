//! `carteiro seal rotate|status`: the header-seal keys in the store.

use super::ops::load_config;
use crate::broker::seal::SealKey;
use crate::services;
use std::path::Path;
use std::time::Duration;

/// `carteiro seal ...`
#[derive(Debug, clap::Subcommand)]
pub enum SealCommand {
    /// Make a new key seal from now on; the current one keeps verifying for a while, so
    /// copies sealed before (waiting in retry tiers, in the DLQ) keep their attempt count.
    /// Running gateways pick the new key up within 30 s, without a restart.
    Rotate {
        /// How long the old key still verifies: at least the longest retry delay of any
        /// route, plus the time dead letters may wait before they are archived.
        #[arg(long, default_value = "7d", value_parser = crate::common::units::parse_duration)]
        accept_old_for: Duration,
    },
    /// The id of the key that seals now, and how many retired keys still verify.
    Status,
}

/// Runs a `seal` subcommand against the config's store.
pub async fn run(config_path: &Path, command: SealCommand) -> anyhow::Result<i32> {
    let config = load_config(config_path)?;
    let store = services::open_store(&config).await?;
    let secrets = match command {
        SealCommand::Rotate { accept_old_for } => {
            let ms = i64::try_from(accept_old_for.as_millis()).unwrap_or(i64::MAX);
            let secrets = store.header_seal_rotate(ms).await?;
            println!(
                "rotated: new copies are sealed with the new key once each gateway reads it \
                 (within 30 s); the old key verifies for {}",
                humantime::format_duration(accept_old_for)
            );
            secrets
        }
        SealCommand::Status => store.header_seal_secrets().await?,
    };
    let key = SealKey::with_retired(&secrets.current, &secrets.retired);
    println!("current key {}", key.current_id());
    println!("retired keys still verifying: {}", secrets.retired.len());
    Ok(0)
}
