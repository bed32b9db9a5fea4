//! `carteiro dlq edit` (edit and retry) as an operator runs it, against the real broker and
//! store:
//! - `an_edit_and_retry_sends_exactly_one_copy_the_edited_one`: ServicePulse's "Edit & Retry
//!   sends both edited and unedited copies", as a test: on a queue nobody consumes, exactly
//!   one copy arrives, with the edited body and headers, and no later replay sends the
//!   original; an invalid JSON body and a Carteiro header are refused, nothing sent.
//! - `dlq_edit_through_a_running_gateway`: `--body-file` and `--set-header` applied by the
//!   route's handler; a second edit keeping the applied id is refused; `--new-id` and
//!   `$EDITOR` edits are processed as new messages; the journey lists every edit.

use crate::resilience::{counter_value, delete_queue};
use crate::support::{
    Client, Route, archived, counter_config, counter_dead_letter, unconsumed_route, unique,
    wait_for,
};
use carteiro::broker::field_table::header_text;
use carteiro::store::{NewDeadLetter, Store};
use lapin::message::BasicGetMessage;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(120);

/// How a `carteiro` run ended.
#[derive(Debug)]
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `carteiro dlq -c CONFIG ARGS` with `env` to completion (bounded).
pub async fn dlq_with(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_carteiro"));
    command
        .arg("dlq")
        .arg("-c")
        .arg(config)
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(WAIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("carteiro dlq {args:?} did not finish within {WAIT:?}"))
        .expect("run carteiro");
    let ran = Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!("carteiro dlq {args:?} -> {ran:?}");
    ran
}

/// Runs `carteiro dlq -c CONFIG ARGS` to completion (bounded).
pub async fn dlq(config: &Path, args: &[&str]) -> Ran {
    dlq_with(config, args, &[]).await
}

/// Everything that reaches `queue` within `window`, taken off it as it comes.
async fn collect(client: &Client, queue: &str, window: Duration) -> Vec<BasicGetMessage> {
    let deadline = Instant::now() + window;
    let mut got = Vec::new();
    while Instant::now() < deadline {
        got.extend(client.drain(queue).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    got
}

fn header(m: &BasicGetMessage, name: &str) -> Option<String> {
    header_text(m.properties.headers().as_ref(), name)
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// Runs `carteiro dlq ARGS` with `env` on `config`, which must send the edited copy, then waits
/// until the `counter` handler has run `runs` times in all.
async fn send_edit(
    config: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    store: &Store,
    runs: u64,
) -> Ran {
    let ran = dlq_with(config, args, env).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    wait_for(&format!("{runs} handler runs"), WAIT, || async {
        (counter_value(store, "runs").await >= runs).then_some(())
    })
    .await;
    ran
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_and_retry_sends_exactly_one_copy_the_edited_one() {
    let client = Client::connect().await;
    // Nobody consumes the route's queue: what arrives is what the edit published.
    let (queue, dir, store) = unconsumed_route(&client, "editonce").await;
    let original = br#"{"order":7,"qty":"three"}"#;
    let record = NewDeadLetter {
        headers: vec![
            (":message-id".into(), "sp-1".into()),
            (":content-type".into(), "application/json".into()),
            ("x-tenant".into(), "acme".into()),
            ("x-broken".into(), "yes".into()),
        ],
        body: original.to_vec(),
        ..counter_dead_letter(&queue, "qty is not a number", 1)
    };
    let id = store.dead_letter_insert(&record).await.expect("archive");
    let id_text = id.to_string();
    let id_arg = id_text.as_str();
    let config = dir.path().join("carteiro.toml");
    let edited = dir.path().join("edited.json");

    // Refused, nothing sent: invalid JSON (with where), a Carteiro header.
    std::fs::write(&edited, br#"{"order":7,"qty":}"#).expect("body file");
    let invalid = ["edit", id_arg, "--body-file", path(&edited)];
    let ran = dlq(&config, &invalid).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(ran.stderr.contains("not valid JSON"), "{ran:?}");
    assert!(ran.stderr.contains("line 1 column"), "{ran:?}");
    let carteiro_header = ["edit", id_arg, "--set-header", "x-carteiro-attempt=1"];
    let ran = dlq(&config, &carteiro_header).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(ran.stderr.contains("Carteiro's own headers"), "{ran:?}");
    assert!(ran.stderr.contains("nothing was sent"), "{ran:?}");

    // The edit: one copy, the edited one, with the same message id.
    std::fs::write(&edited, br#"{"order":7,"qty":3}"#).expect("body file");
    let edit = [
        "edit",
        id_arg,
        "--body-file",
        path(&edited),
        "--set-header",
        "x-fixed-by=ops",
        "--unset-header",
        "x-broken",
    ];
    let ran = dlq(&config, &edit).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stdout.contains(&format!("edited #{id}")), "{ran:?}");
    let copies = collect(&client, &queue, Duration::from_secs(3)).await;
    assert_eq!(copies.len(), 1, "exactly one copy reaches the queue");
    let copy = &copies[0];
    assert_eq!(copy.data, br#"{"order":7,"qty":3}"#, "the edited body");
    let message_id = copy.properties.message_id().as_ref().map(|s| s.as_str());
    assert_eq!(message_id, Some("sp-1"), "the id is kept");
    assert_eq!(header(copy, "x-fixed-by").as_deref(), Some("ops"));
    assert_eq!(header(copy, "x-tenant").as_deref(), Some("acme"));
    assert_eq!(header(copy, "x-broken"), None);
    assert_eq!(
        header(copy, "x-carteiro-replay-of").as_deref(),
        Some(id_arg)
    );

    // The original is never sent afterwards: not by a replay of what is left, not by one
    // that takes replayed rows too, not by id.
    let route = ["replay", "--route", queue.as_str()];
    let ran = dlq(&config, &route).await;
    assert!(
        ran.code == 0 && ran.stdout.contains("0 replayed"),
        "{ran:?}"
    );
    let everything = ["replay", "--route", queue.as_str(), "--include-replayed"];
    let ran = dlq(&config, &everything).await;
    assert!(
        ran.code == 0 && ran.stdout.contains("0 replayed"),
        "{ran:?}"
    );
    let ran = dlq(&config, &["replay", id_arg]).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(ran.stderr.contains("was edited"), "{ran:?}");
    let later = collect(&client, &queue, Duration::from_secs(2)).await;
    assert!(later.is_empty(), "the original never reaches the queue");

    // The archive keeps the original, and the edit.
    let d = archived(&store, id).await;
    assert_eq!(d.letter.body, original, "the original is kept as it was");
    assert!(d.edited_at.is_some());
    let events = store.dead_letter_events(id).await.expect("events");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].actor.as_deref(), Some("cli"));
    let ran = dlq(&config, &["show", id_arg, "--journey"]).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stdout.contains("edited by cli"), "{ran:?}");
    let what = "body changed (25 → 19 bytes); set x-fixed-by = \"ops\"; unset x-broken";
    assert!(ran.stdout.contains(what), "{ran:?}");
    delete_queue(&client, &queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_edit_through_a_running_gateway() {
    let events = unique("events");
    Client::connect().await.sink(&events).await;
    let route = Route::start_from("edit", Arc::default(), |queue, exchange| {
        counter_config(queue, exchange, &events)
    })
    .await;
    let store = &route.gw.store;
    let config = route.gw.dir.path().join("carteiro.toml");
    let record = NewDeadLetter {
        headers: vec![
            (":message-id".into(), "e-1".into()),
            (":content-type".into(), "application/json".into()),
            ("x-counter-key".into(), "broken".into()),
        ],
        body: br#"{"n":1}"#.to_vec(),
        ..counter_dead_letter(&route.queue, "bad counter key", 1)
    };
    let id = store.dead_letter_insert(&record).await.expect("archive");
    let id_text = id.to_string();
    let id_arg = id_text.as_str();
    let dir = tempfile::tempdir().expect("tempdir");
    let body = dir.path().join("body.json");

    // --body-file and --set-header: the handler runs on the edited copy.
    std::fs::write(&body, br#"{"n":2}"#).expect("body file");
    let edit = [
        "edit",
        id_arg,
        "--body-file",
        path(&body),
        "--set-header",
        "x-counter-key=fixed",
    ];
    send_edit(&config, &edit, &[], store, 1).await;
    assert_eq!(counter_value(store, "counter/fixed").await, 1);
    let broken = counter_value(store, "counter/broken").await;
    assert_eq!(broken, 0, "the original never ran");
    assert_eq!(counter_value(store, "seen/e-1").await, 1);

    // The route deduplicates by message id and e-1 is applied: the same id is refused.
    let again = ["edit", id_arg, "--set-header", "x-counter-key=again"];
    let ran = dlq(&config, &again).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(ran.stderr.contains("already applied"), "{ran:?}");
    assert!(ran.stderr.contains("--new-id"), "{ran:?}");

    // A new id: processed as a new message.
    let fresh = [
        "edit",
        id_arg,
        "--set-header",
        "x-counter-key=again",
        "--new-id",
    ];
    send_edit(&config, &fresh, &[], store, 2).await;
    assert_eq!(counter_value(store, "counter/again").await, 1);

    // Without --body-file or header changes the body opens in $EDITOR.
    let editor = [("VISUAL", ""), ("EDITOR", "sed -i s/1/4/")];
    let ran = send_edit(&config, &["edit", id_arg, "--new-id"], &editor, store, 3).await;
    assert!(ran.stdout.contains("body changed (7 → 7 bytes)"), "{ran:?}");
    let edits = store.dead_letter_events(id).await.expect("events");
    assert_eq!(edits.len(), 3, "no refusal recorded: {edits:?}");
    let sent = edits[2].body.clone().unwrap_or_default();
    assert_eq!(sent, br#"{"n":4}"#);

    let ran = dlq(&config, &["show", id_arg, "--journey"]).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let edited = ran.stdout.lines().filter(|l| l.contains("edited by cli"));
    assert_eq!(edited.count(), 3, "{ran:?}");
    assert!(ran.stdout.contains("outcome: applied"), "{ran:?}");
    route.gw.stop().await;
}

/// Two edits of one dead letter in a row, both keeping its message id, on a queue nobody
/// consumes yet: the first copy is still in the queue, so the route's inbox does not know the
/// id. The second must be refused (its copy would be acked as a duplicate of the first, and
/// dropped, once the route consumes them), naming why and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_edit_keeping_the_id_waits_until_the_first_copy_settles() {
    let client = Client::connect().await;
    let (queue, dir, store) = unconsumed_route(&client, "edittwice").await;
    let record = NewDeadLetter {
        headers: vec![
            (":message-id".into(), "tw-1".into()),
            ("x-tenant".into(), "acme".into()),
        ],
        body: b"{\"n\":1}".to_vec(),
        ..counter_dead_letter(&queue, "boom", 1)
    };
    let id = store.dead_letter_insert(&record).await.expect("archive");
    let id_text = id.to_string();
    let config = dir.path().join("carteiro.toml");

    let first = ["edit", id_text.as_str(), "--set-header", "x-fix=1"];
    let ran = dlq(&config, &first).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let second = ["edit", id_text.as_str(), "--set-header", "x-fix=2"];
    let ran = dlq(&config, &second).await;
    assert_eq!(
        ran.code, 1,
        "a second edit keeping message id tw-1 was sent while the first copy is still queued: \
         {ran:?}"
    );
    assert!(ran.stderr.contains("has not settled"), "{ran:?}");
    assert!(ran.stderr.contains("--new-id"), "{ran:?}");
    assert!(ran.stderr.contains("nothing was sent"), "{ran:?}");
    // A new id is a new message: sent at once.
    let fresh = [
        "edit",
        id_text.as_str(),
        "--set-header",
        "x-fix=3",
        "--new-id",
    ];
    let ran = dlq(&config, &fresh).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let copies = collect(&client, &queue, Duration::from_secs(2)).await;
    let fixes: Vec<_> = copies.iter().map(|c| header(c, "x-fix")).collect();
    assert_eq!(fixes, [Some("1".to_owned()), Some("3".to_owned())]);
    let events = store.dead_letter_events(id).await.expect("events");
    assert_eq!(
        events.len(),
        2,
        "the refused edit is not recorded: {events:?}"
    );
    delete_queue(&client, &queue).await;
}
