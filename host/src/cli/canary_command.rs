//! `carteiro canary promote|abort NAME`: finish a running gateway's canary by hand, through
//! its admin server (`POST /admin/canary/NAME/promote|abort`).

use super::ops::load_config;
use std::path::Path;

/// `carteiro canary ...`
#[derive(Debug, clap::Subcommand)]
pub enum CanaryCommand {
    /// Every delivery of the plugin runs on its canary from now on (until a restart or a
    /// reload that changes the plugin: point its `path` at the canary to keep it).
    Promote {
        /// The plugin (`[plugins.NAME]`).
        plugin: String,
    },
    /// No delivery runs on the canary any more.
    Abort {
        /// The plugin (`[plugins.NAME]`).
        plugin: String,
    },
}

/// Runs a `canary` subcommand; returns the exit code.
pub async fn run(config_path: &Path, command: CanaryCommand) -> anyhow::Result<i32> {
    let config = load_config(config_path)?;
    if config.admin.listen.is_empty() {
        anyhow::bail!(
            "the config has no admin server (`[admin] listen`); canaries are finished through it"
        );
    }
    let (plugin, action) = match &command {
        CanaryCommand::Promote { plugin } => (plugin, "promote"),
        CanaryCommand::Abort { plugin } => (plugin, "abort"),
    };
    let path = format!("/admin/canary/{plugin}/{action}");
    let (status, body) = super::shadow_command::request(&config.admin, "POST", &path).await?;
    if status == 200 {
        println!("plugin {plugin}: {body}");
        Ok(0)
    } else {
        eprintln!("cannot {action} the canary of plugin `{plugin}`: {body}");
        Ok(1)
    }
}
