//! `carteiro dlq edit ID` (edit and retry: only the edited copy is sent) and
//! `carteiro dlq show ID --journey` (every attempt, replay and edit of the message).

use crate::config::Config;
use crate::dlq::edit::{Dedup, EditContext, EditError, EditRequest, prepare};
use crate::store::Store;
use anyhow::Context;
use std::io::Write;
use std::path::PathBuf;

/// `carteiro dlq edit ...`
#[derive(Debug, clap::Args)]
pub struct EditArgs {
    /// The dead letter's id.
    pub id: i64,
    /// The new body, read from this file. Without it (and without header changes) the body
    /// opens in `$VISUAL` or `$EDITOR`.
    #[arg(long, value_name = "PATH")]
    pub body_file: Option<PathBuf>,
    /// Set a header of the copy, `NAME=VALUE` (repeatable). Carteiro's own headers
    /// (`x-carteiro-*`) are refused.
    #[arg(long = "set-header", value_name = "NAME=VALUE", value_parser = parse_header)]
    pub set_header: Vec<(String, String)>,
    /// Remove a header from the copy (repeatable).
    #[arg(long = "unset-header", value_name = "NAME")]
    pub unset_header: Vec<String>,
    /// Send the copy with a new message id (a UUIDv7). Needed when the route deduplicates by
    /// message id and the archived one was already applied.
    #[arg(long)]
    pub new_id: bool,
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("`{text}` is not NAME=VALUE"))
}

/// Edits dead letter `args.id` and sends the edited copy (see `dlq::edit`); exit code 1 when
/// the edit is refused or fails, with the reason on stderr.
pub async fn edit(config: &Config, store: &Store, args: EditArgs) -> anyhow::Result<i32> {
    let Some(d) = store.dead_letter_get(args.id).await? else {
        eprintln!("no dead letter with id {}", args.id);
        return Ok(1);
    };
    let Some(dedup) = Dedup::of(config, &d.letter.route) else {
        let route = d.letter.route.clone();
        eprintln!("{}", EditError::UnknownRoute { route });
        return Ok(1);
    };
    let body = match &args.body_file {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("cannot read --body-file {}", path.display()))?,
        ),
        None if args.set_header.is_empty() && args.unset_header.is_empty() => {
            Some(in_editor(&d.letter.body)?)
        }
        None => None,
    };
    let request = EditRequest {
        body,
        set: args.set_header,
        unset: args.unset_header,
        new_id: args.new_id,
    };
    let copy = match prepare(&d, request) {
        Ok(copy) => copy,
        Err(e) => {
            eprintln!("{e}");
            return Ok(1);
        }
    };
    let (publisher, seal) =
        crate::dlq::open_replay_sender(config, store, "carteiro dlq edit").await?;
    let context = EditContext {
        store,
        publisher: &publisher,
        seal: &seal,
        publish_timeout: config.broker.publish_timeout,
    };
    match context.send(&d, copy, &dedup, "cli").await {
        Ok(changes) => {
            println!(
                "edited #{} and sent the edited copy to queue {}: {}",
                d.id,
                d.letter.route,
                changes.summary()
            );
            Ok(0)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(1)
        }
    }
}

/// Opens `$VISUAL` or `$EDITOR` on `body` in a private temporary file (mode 0600, removed
/// afterwards); the file's content once the editor exits successfully.
fn in_editor(body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let editor = ["VISUAL", "EDITOR"]
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|value| !value.trim().is_empty())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "set $EDITOR (or $VISUAL) to edit the body, or give --body-file PATH or header \
                 changes; nothing was sent"
            )
        })?;
    let mut file = tempfile::Builder::new()
        .prefix("carteiro-dead-letter-")
        .suffix(".body")
        .tempfile()?;
    file.write_all(body)?;
    file.flush()?;
    // `$EDITOR` may carry arguments (`code --wait`), as git allows: run it through the shell
    // with the file as `$1`.
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(file.path())
        .status()
        .with_context(|| format!("cannot run the editor `{editor}`"))?;
    if !status.success() {
        anyhow::bail!("the editor `{editor}` exited with {status}; nothing was sent");
    }
    Ok(std::fs::read(file.path())?)
}

/// Prints the journey of dead letter `id`'s message; exit code 1 when there is no such dead
/// letter.
pub async fn show_journey(config: &Config, store: &Store, id: i64) -> anyhow::Result<i32> {
    let dedup = match store.dead_letter_get(id).await? {
        Some(d) => Dedup::of(config, &d.letter.route),
        None => None,
    };
    match crate::dlq::journey::read(store, id, dedup.as_ref()).await? {
        Some(journey) => {
            for line in journey.lines() {
                println!("{line}");
            }
            Ok(0)
        }
        None => {
            eprintln!("no dead letter with id {id}");
            Ok(1)
        }
    }
}
