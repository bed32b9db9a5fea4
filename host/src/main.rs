//! The `carteiro` binary: logging, then the command line.

use carteiro::cli::{Cli, run};
use clap::Parser;
use tracing_subscriber::EnvFilter;

fn init_tracing(json: bool) {
    let filter = EnvFilter::try_from_env("CARTEIRO_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    init_tracing(cli.log_json);
    let code = match run(cli).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            2
        }
    };
    std::process::exit(code);
}
