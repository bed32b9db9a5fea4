//! `carteiro seal rotate|status`: the header-seal keys in the store.

use super::ops::load_config;
use crate::broker::seal::SealKey;
use crate::common::rfc3339;
use crate::services;
use crate::startup::SEAL_KEY_ACTIVATION;
use std::path::Path;
use std::time::Duration;

/// `carteiro seal ...`
#[derive(Debug, clap::Subcommand)]
pub enum SealCommand {
    /// Bring in a new key: every gateway verifies it within 30 s, and it seals from 60 s on
    /// (by the database's clock), once every running gateway knows it. The current key keeps
    /// verifying for a while after that, so copies sealed before (waiting in retry tiers, in
    /// the DLQ) keep their attempt count. Refused while an earlier rotation's key waits.
    Rotate {
        /// How long the old key still verifies once the new one seals: at least the longest
        /// retry delay of any route, plus the time dead letters may wait before they are
        /// archived.
        #[arg(long, default_value = "7d", value_parser = crate::common::units::parse_duration)]
        accept_old_for: Duration,
    },
    /// The id of the key that seals now, the next key's (if a rotation is under way), and
    /// how many retired keys still verify.
    Status,
}

fn ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Runs a `seal` subcommand against the config's store.
pub async fn run(config_path: &Path, command: SealCommand) -> anyhow::Result<i32> {
    let config = load_config(config_path)?;
    let store = services::open_store(&config).await?;
    let secrets = match command {
        SealCommand::Rotate { accept_old_for } => {
            let rotated = store.header_seal_rotate(ms(accept_old_for), ms(SEAL_KEY_ACTIVATION));
            let secrets = match rotated.await {
                Ok(secrets) => secrets,
                Err(crate::store::StoreError::Invalid(why)) => {
                    eprintln!("not rotated: {why}");
                    return Ok(1);
                }
                Err(e) => return Err(e.into()),
            };
            println!(
                "rotated: the new key verifies on every gateway within 30 s and seals from {}; \
                 the old key keeps verifying for {} after that",
                secrets
                    .next
                    .as_ref()
                    .map_or_else(|| "now".to_owned(), |n| rfc3339(n.activates_at)),
                humantime::format_duration(accept_old_for)
            );
            secrets
        }
        SealCommand::Status => store.header_seal_secrets().await?,
    };
    let key = SealKey::with_retired(&secrets.current, &secrets.retired);
    println!("current key {}", key.current_id());
    if let Some(next) = &secrets.next {
        let id = SealKey::new(&next.secret).current_id();
        println!("next key {id} seals from {}", rfc3339(next.activates_at));
    }
    println!("retired keys still verifying: {}", secrets.retired.len());
    Ok(0)
}
