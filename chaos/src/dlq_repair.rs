//! The DLQ repair fault: an operator edits one trapped message's dead letter from two
//! terminals at once while two filtered replays of the same route run. The store's claims must
//! let one edit through and refuse the other, and give each dead letter to one replay; the
//! checker then follows every copy sent (`checker/repairs.rs`).

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use sqlx::Row;

use crate::checker::Repairs;
use crate::config::ROUTE_FLAKY;

/// The body of an edited copy: the flaky handler retries once, then acks.
pub const EDITED_BODY: &str = "retry-until-2";
/// Dead letters each of the two concurrent replay runs takes at most.
const REPLAY_LIMIT: &str = "2";
/// Longest one `carteiro dlq` command may take.
const COMMAND_BOUND: Duration = Duration::from_secs(60);

/// Where the repair commands run: the binary, the campaign's config and its run folder.
pub struct Operator {
    pub binary: PathBuf,
    pub config: PathBuf,
    pub dir: PathBuf,
    pub store_url: String,
}

/// Runs the two edits and the two replays at once and says what each reported.
pub async fn repair(op: &Operator, repairs: &mut Repairs) -> anyhow::Result<String> {
    let letter = newest_untouched(&op.store_url).await;
    let body = op.dir.join("edited-body.txt");
    std::fs::write(&body, EDITED_BODY)?;
    let replay = ["replay", "--route", ROUTE_FLAKY, "--limit", REPLAY_LIMIT];
    let replays = async { tokio::join!(op.dlq(&replay), op.dlq(&replay)) };
    let Some((id, message_id)) = letter else {
        let (a, b) = replays.await;
        return Ok(format!(
            "nothing to edit yet; replays {}",
            verdicts(&[a, b])
        ));
    };
    let id = id.to_string();
    let body = body.display().to_string();
    let edit = ["edit", id.as_str(), "--body-file", body.as_str()];
    let ((e1, e2), (r1, r2)) = tokio::join!(
        async { tokio::join!(op.dlq(&edit), op.dlq(&edit)) },
        replays
    );
    let sent = [&e1, &e2].iter().filter(|o| succeeded(o)).count();
    if sent > 0 {
        repairs.edits_sent.insert(message_id.clone());
    }
    if sent > 1 {
        repairs.edits_both_sent.push(message_id.clone());
    }
    Ok(format!(
        "dead letter {id} ({message_id}): edits {}; replays {}",
        verdicts(&[e1, e2]),
        verdicts(&[r1, r2])
    ))
}

impl Operator {
    /// `carteiro dlq <args>`, bounded.
    async fn dlq(&self, args: &[&str]) -> anyhow::Result<Output> {
        let run = tokio::process::Command::new(&self.binary)
            .arg("dlq")
            .args(args)
            .arg("-c")
            .arg(&self.config)
            .kill_on_drop(true)
            .output();
        tokio::time::timeout(COMMAND_BOUND, run)
            .await
            .map_err(|_| anyhow::anyhow!("carteiro dlq {} took over {COMMAND_BOUND:?}", args[0]))?
            .map_err(Into::into)
    }
}

fn succeeded(out: &anyhow::Result<Output>) -> bool {
    matches!(out, Ok(o) if o.status.success())
}

/// `sent/refused` style summary: each command's outcome, and the first refusal's reason.
fn verdicts(outs: &[anyhow::Result<Output>]) -> String {
    let ok = outs.iter().filter(|o| succeeded(o)).count();
    let why = outs.iter().find(|o| !succeeded(o)).map(|o| match o {
        Ok(o) => last_line(&o.stderr),
        Err(e) => format!("{e:#}"),
    });
    match why {
        Some(why) => format!("{ok} ok, {} refused ({why})", outs.len() - ok),
        None => format!("{ok} ok"),
    }
}

/// The last line of a command's stderr: its error, after any log lines.
fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
    line.chars().take(160).collect()
}

/// The newest dead letter of the flaky route that is no replay and was never replayed or
/// edited: its id and message id.
async fn newest_untouched(store_url: &str) -> Option<(i64, String)> {
    let ask = async {
        let pool = crate::collect::open(store_url).await?;
        let row = sqlx::query(
            "SELECT id, headers FROM dead_letters WHERE route = $1 AND replay_count = 0 \
             AND replay_of IS NULL ORDER BY id DESC LIMIT 1",
        )
        .bind(ROUTE_FLAKY)
        .fetch_optional(&pool)
        .await?;
        pool.close().await;
        let Some(row) = row else {
            return anyhow::Ok(None);
        };
        let id: i64 = row.try_get(0)?;
        let headers: String = row.try_get(1)?;
        Ok(crate::collect::message_id(&headers).map(|m| (id, m)))
    };
    // A store that does not answer now leaves nothing to edit; the replays still run.
    match tokio::time::timeout(Duration::from_secs(10), ask).await {
        Ok(Ok(found)) => found,
        _ => None,
    }
}
