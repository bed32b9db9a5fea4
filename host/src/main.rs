//! The `carteiro` binary: logging, signals, then the command line.

use carteiro::cli::{Cli, run};
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

fn init_tracing(json: bool) {
    let filter = EnvFilter::try_from_env("CARTEIRO_LOG")
        .unwrap_or_else(|_| EnvFilter::new(carteiro::logfmt::DEFAULT_FILTER));
    // Colours only for a person at a terminal, never into a file or a pipe.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        // Plugins and publishers put text in fields: escape it (see `logfmt`).
        builder
            .fmt_fields(carteiro::logfmt::escaped_fields())
            .init();
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// SIGHUP's default action ends the process. Instead each one is handed to the command: a
/// running gateway reloads its config and plugins; other commands log and ignore it.
fn forward_sighup() -> tokio::sync::mpsc::UnboundedReceiver<()> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    if tx.send(()).is_err() {
                        tracing::warn!(
                            "SIGHUP received: this command does not reload; ignoring it"
                        );
                    }
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot handle SIGHUP; it would end the process"),
    }
    rx
}

#[tokio::main]
async fn main() {
    carteiro::common::use_aws_lc_rs();
    let cli = Cli::parse();
    init_tracing(cli.log_json);
    let sighup = forward_sighup();
    let code = match run(cli, shutdown_signal(), sighup).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            2
        }
    };
    std::process::exit(code);
}
