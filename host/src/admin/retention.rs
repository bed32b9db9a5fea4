//! What the console says about retention (`housekeeping`): how long published outbox rows
//! and dead letters are kept, and what the last purge of each removed.

use super::page::{age, spelled};
use crate::common::labels::RetentionTable;
use crate::housekeeping::{Expire, LastPurge, RetentionStatus};

/// The outbox's line on the routes page.
pub fn outbox_line(status: &RetentionStatus, now_ms: i64) -> String {
    let keep = spelled(status.policy().outbox);
    let last = last_purge(status.last(RetentionTable::Outbox), now_ms);
    format!("Retention: published outbox rows are purged {keep} after their publish; {last}.")
}

/// The dead letters' line on the dead-letters page.
pub fn dead_letters_line(status: &RetentionStatus, now_ms: i64) -> String {
    let policy = status.policy();
    let Some(retain) = policy.dead_letters else {
        return "Retention: dead letters are kept forever ([dead_letters] retain is not set)."
            .to_owned();
    };
    let which = match policy.expire {
        Expire::Replayed => "replayed dead letters (never-replayed ones are kept)",
        Expire::All => "dead letters, replayed or not,",
    };
    let keep = spelled(retain);
    let last = last_purge(status.last(RetentionTable::DeadLetters), now_ms);
    format!("Retention: {which} are purged {keep} after they were dead-lettered; {last}.")
}

fn last_purge(last: Option<LastPurge>, now_ms: i64) -> String {
    match last {
        None => "no purge has run yet".to_owned(),
        Some(last) => format!(
            "last purge {} ago removed {} ({} since the gateway started)",
            age(now_ms.saturating_sub(last.at_ms)),
            thousands(last.purged),
            thousands(last.total),
        ),
    }
}

/// `1204` as `1,204`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::housekeeping::Policy;
    use std::time::Duration;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn status(dead_letters: Option<Duration>, expire: Expire) -> RetentionStatus {
        RetentionStatus::new(Policy {
            inbox: 7 * DAY,
            outbox: DAY,
            dead_letters,
            expire,
        })
    }

    #[test]
    fn durations_read_as_words_and_tiers_under_a_second_are_not_zero() {
        assert_eq!(super::spelled(DAY), "1 day");
        assert_eq!(
            super::spelled(30 * DAY + Duration::from_secs(3600)),
            "30 days 1h"
        );
        assert_eq!(super::spelled(Duration::from_secs(90)), "1m 30s");
        assert_eq!(super::super::page::delay(250), "250ms");
        assert_eq!(super::super::page::delay(1_500), "1s 500ms");
        let line = outbox_line(&status(None, Expire::Replayed), 0);
        assert!(line.contains("purged 1 day after"), "{line}");
    }

    #[test]
    fn counts_have_thousands_separators() {
        for (n, shown) in [
            (0, "0"),
            (999, "999"),
            (1_204, "1,204"),
            (120_400, "120,400"),
            (1_234_567, "1,234,567"),
        ] {
            assert_eq!(thousands(n), shown);
        }
    }

    #[test]
    fn the_lines_say_what_is_kept_and_what_the_last_purge_did() {
        let forever = status(None, Expire::Replayed);
        assert_eq!(
            dead_letters_line(&forever, 0),
            "Retention: dead letters are kept forever ([dead_letters] retain is not set)."
        );
        assert_eq!(
            outbox_line(&forever, 0),
            "Retention: published outbox rows are purged 1 day after their publish; \
             no purge has run yet."
        );

        let replayed = status(Some(30 * DAY), Expire::Replayed);
        replayed.record(RetentionTable::DeadLetters, 1_000, 1_000);
        replayed.record(RetentionTable::DeadLetters, 1_204, 60_000);
        assert_eq!(
            dead_letters_line(&replayed, 240_000),
            "Retention: replayed dead letters (never-replayed ones are kept) are purged 30 days \
             after they were dead-lettered; last purge 3m ago removed 1,204 (2,204 since the \
             gateway started)."
        );

        let all = status(Some(DAY), Expire::All);
        all.record(RetentionTable::DeadLetters, 0, 5_000);
        assert!(
            dead_letters_line(&all, 5_000).starts_with(
                "Retention: dead letters, replayed or not, are purged 1 day after they were \
                 dead-lettered; last purge 0s ago removed 0"
            ),
            "{}",
            dead_letters_line(&all, 5_000)
        );
    }
}
