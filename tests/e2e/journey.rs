//! `carteiro dlq show ID --journey` on a real gateway: a message retried twice and then
//! dead-lettered shows its three attempts (plugin version, verdict, reason, the retry tier it
//! waited in) and the dead-lettering; after a replay, the replay and the new dead letter it
//! became join the journey, whichever of the two dead letters is asked about.

use crate::edit::dlq;
use crate::support::{Route, json_props, retry_table};
use std::path::Path;

/// The step words of a journey's lines (`attempt`, `dead-lettered`, `replayed`, `edited`),
/// each with its dead letter: a step line is `TIME  #ID  WORD ...`.
fn steps(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let _time = words.next()?;
            let id = words.next().filter(|w| w.starts_with('#'))?;
            let word = words.next()?;
            Some((id.to_owned(), word.to_owned()))
        })
        .collect()
}

/// `dlq show ID --journey`: its stdout, after checking it succeeded.
async fn journey(config: &Path, id: i64) -> String {
    let id = id.to_string();
    let ran = dlq(config, &["show", id.as_str(), "--journey"]).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    ran.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_retried_twice_then_dead_lettered_shows_its_journey() {
    let extra = retry_table(3, &["200ms"]);
    let route = Route::start("journey", "fixture-always-retry", &extra, None).await;
    let config = route.gw.dir.path().join("carteiro.toml");
    route.publish(json_props("j-1"), b"{}").await;
    let first = route.dead_letters(1).await[0].id;

    let out = journey(&config, first).await;
    let words: Vec<String> = steps(&out).into_iter().map(|(_, w)| w).collect();
    assert_eq!(
        words,
        ["attempt", "attempt", "attempt", "dead-lettered"],
        "{out}"
    );
    let tier = format!("waited in {}.retry.200ms", route.queue);
    for n in 1..=3 {
        let reason = format!("attempt {n}: retry: ");
        let line = out.lines().find(|l| l.contains(&reason));
        let line = line.unwrap_or_else(|| panic!("no attempt {n}: {out}"));
        assert!(line.contains("fixture-always-retry"), "{line}");
        assert!(line.contains("sha256 "), "the version: {line}");
        match n {
            3 => assert!(line.contains("then dead-lettered"), "{line}"),
            _ => assert!(line.contains(&tier), "the retry tier: {line}"),
        }
    }
    assert!(
        out.contains("dead-lettered after 3 attempts (retry"),
        "{out}"
    );
    assert!(out.contains("outcome: in the dead-letter archive"), "{out}");

    // Replayed: it fails three times again and is dead-lettered again.
    let first_text = first.to_string();
    let ran = dlq(&config, &["replay", first_text.as_str()]).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let rows = route.dead_letters(2).await;
    let second = rows.iter().map(|d| d.id).max().unwrap_or_default();
    assert!(second > first);
    let again = rows.iter().find(|d| d.id == second).map(|d| d.replay_of);
    assert_eq!(again, Some(Some(first)), "linked to its source");
    for asked in [first, second] {
        let out = journey(&config, asked).await;
        let (a, b) = (format!("#{first}"), format!("#{second}"));
        let expected: Vec<(String, String)> = [
            (&a, "attempt"),
            (&a, "attempt"),
            (&a, "attempt"),
            (&a, "dead-lettered"),
            (&a, "replayed"),
            (&b, "attempt"),
            (&b, "attempt"),
            (&b, "attempt"),
            (&b, "dead-lettered"),
        ]
        .into_iter()
        .map(|(id, word)| (id.clone(), word.to_owned()))
        .collect();
        assert_eq!(steps(&out), expected, "asked about #{asked}: {out}");
        assert!(out.contains(&format!("(dead letters {a}, {b})")), "{out}");
        assert!(out.contains("outcome: in the dead-letter archive"), "{out}");
    }
    route.gw.stop().await;
}
