//! What the processes' logs tell the checker: the events whose publish a relay stopped
//! waiting for a confirm on, and so sent again.

use std::collections::HashSet;
use std::path::Path;

/// The error a relay logs with `outbox publish failed` when no confirm came in time.
const CONFIRM_TIMEOUT: &str = "no publisher confirm within the timeout";

/// Event ids whose publish timed out without a confirm, from every `*.log` in `dir` (the
/// relays, and gateways that run one).
pub fn confirm_timeouts(dir: &Path) -> std::io::Result<HashSet<String>> {
    let mut ids = HashSet::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log") {
            ids.extend(timed_out(&std::fs::read_to_string(&path)?));
        }
    }
    Ok(ids)
}

fn timed_out(log: &str) -> Vec<String> {
    log.lines()
        .filter(|line| line.contains(CONFIRM_TIMEOUT))
        .filter_map(|line| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix("event_id="))
        })
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::timed_out;

    #[test]
    fn only_outbox_publishes_that_timed_out_are_taken() {
        let log = "\
2026-12-02T07:12:43.288714Z  WARN carteiro::relay::session: outbox publish failed; the row stays pending event_id=01a2-ab exchange=chaos.events routing_key=acesso.liberado attempts=1 error=no publisher confirm within the timeout; the message may or may not be stored
2026-12-02T07:12:44.000000Z  WARN carteiro::relay::session: outbox publish failed; the row stays pending event_id=01a2-cd exchange=chaos.events routing_key=x attempts=1 error=returned as unroutable
2026-12-02T07:12:45.000000Z  WARN carteiro::pipeline::process: retry copy failed error=no publisher confirm within the timeout; the message may or may not be stored
";
        assert_eq!(timed_out(log), vec!["01a2-ab".to_owned()]);
    }
}
