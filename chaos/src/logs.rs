//! What the processes' logs tell the checker: the events whose publish a relay stopped
//! waiting for a confirm on, and so sent again; and the events whose publish failed and was
//! retried (the row stayed pending).

use std::collections::HashSet;
use std::path::Path;

/// The error a relay logs with `outbox publish failed` when no confirm came in time.
const CONFIRM_TIMEOUT: &str = "no publisher confirm within the timeout";

/// What a relay logs when a publish did not go through and the row stays pending.
const PUBLISH_FAILED: &str = "outbox publish failed";

/// What a relay logs when a confirmed row's mark did not commit (the row is sent again by
/// the next relay that finds it pending).
const MARK_TROUBLES: [&str; 2] = [
    "could not mark confirmed outbox rows",
    "confirmed outbox rows not found in the store",
];

/// What the relays logged about their publishes (see [`relay_logs`]).
#[derive(Debug, Default)]
pub struct RelayLogs {
    /// Events whose publish timed out without a confirm.
    pub confirm_timeouts: HashSet<String>,
    /// Events whose publish failed otherwise (returned unroutable, nacked, the channel
    /// closed): the row stayed pending and was retried with backoff.
    pub failed_publishes: HashSet<String>,
    /// When a relay could not mark confirmed rows (the store did not answer, refused the
    /// write): such rows stay pending and are sent again by the next relay that finds them.
    pub mark_troubles: Vec<MarkTrouble>,
}

/// One line where a relay could not mark confirmed rows.
#[derive(Debug, Clone)]
pub struct MarkTrouble {
    /// When it was logged (Unix ms).
    pub at_unix_ms: i64,
    pub line: String,
}

/// Reads every `*.log` in `dir` (the relays, and gateways that run one).
pub fn relay_logs(dir: &Path) -> std::io::Result<RelayLogs> {
    let mut logs = RelayLogs::default();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log") {
            logs.read(&std::fs::read_to_string(&path)?);
        }
    }
    Ok(logs)
}

impl RelayLogs {
    fn read(&mut self, log: &str) {
        self.mark_troubles.extend(
            log.lines()
                .filter(|line| MARK_TROUBLES.iter().any(|m| line.contains(m)))
                .filter_map(|line| {
                    let stamp = line.split_whitespace().next()?;
                    let at = humantime::parse_rfc3339(stamp).ok()?;
                    let at = at.duration_since(std::time::UNIX_EPOCH).ok()?;
                    Some(MarkTrouble {
                        at_unix_ms: i64::try_from(at.as_millis()).ok()?,
                        line: line.chars().take(240).collect(),
                    })
                }),
        );
        for line in log.lines().filter(|line| line.contains(PUBLISH_FAILED)) {
            let Some(id) = line
                .split_whitespace()
                .find_map(|word| word.strip_prefix("event_id="))
            else {
                continue;
            };
            let ids = if line.contains(CONFIRM_TIMEOUT) {
                &mut self.confirm_timeouts
            } else {
                &mut self.failed_publishes
            };
            ids.insert(id.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RelayLogs;

    #[test]
    fn outbox_publishes_that_timed_out_or_failed_are_told_apart() {
        let log = "\
2026-12-02T07:12:43.288714Z  WARN carteiro::relay::session: outbox publish failed; the row stays pending event_id=01a2-ab exchange=chaos.events routing_key=acesso.liberado attempts=1 error=no publisher confirm within the timeout; the message may or may not be stored
2026-12-02T07:12:44.000000Z  WARN carteiro::relay::session: outbox publish failed; the row stays pending event_id=01a2-cd exchange=chaos.events routing_key=x attempts=1 error=returned as unroutable
2026-12-02T07:12:45.000000Z  WARN carteiro::pipeline::process: retry copy failed error=no publisher confirm within the timeout; the message may or may not be stored
2026-12-02T07:12:46.000000Z  WARN carteiro::relay::marker: could not mark confirmed outbox rows published; retrying rows=3 error=pool timed out
";
        let mut logs = RelayLogs::default();
        logs.read(log);
        assert_eq!(logs.confirm_timeouts, ["01a2-ab".to_owned()].into());
        assert_eq!(logs.failed_publishes, ["01a2-cd".to_owned()].into());
        assert_eq!(logs.mark_troubles.len(), 1, "{:?}", logs.mark_troubles);
        assert_eq!(logs.mark_troubles[0].at_unix_ms, 1_796_195_566_000);
    }
}
