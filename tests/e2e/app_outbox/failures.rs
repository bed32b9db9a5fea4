//! `[[outboxes]]` when something is wrong: a missing column is named before anything runs, a
//! row that can never be published is parked and reported while the others go out, and a
//! second relay stands by until the first one dies.

use std::time::{Duration, Instant};

use super::{AppDb, Story, WAIT, receive_all, relay};
use crate::resilience::{carteiro, run_to_end};
use crate::support::wait_for;

#[tokio::test]
async fn a_missing_column_is_named_by_check_and_relay_refuses_to_start() {
    let db = AppDb::postgres().await;
    db.create_table();
    let Story {
        exchange,
        config,
        dir: _dir,
        ..
    } = Story::new(&db, "poll", "").await;
    let mut ok = carteiro();
    ok.args(["check", "-c"]).arg(&config);
    let checked = run_to_end(ok, WAIT).await;
    assert_eq!(checked.code, Some(0), "{}", checked.stderr);
    assert!(
        checked
            .stdout
            .contains("outbox   matriculas: table outbox_events checked")
    );
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        text.replace("\"publicado_em\"", "\"publicada_em\""),
    )
    .expect("edit");
    for command in ["check", "relay"] {
        let mut cmd = carteiro();
        cmd.args([command, "-c"]).arg(&config);
        let ended = run_to_end(cmd, WAIT).await;
        assert_ne!(ended.code, Some(0), "{command} with a missing column");
        assert!(
            ended
                .stderr
                .contains("columns.published_at = \"publicada_em\"")
                && ended.stderr.contains("has no such column"),
            "{command}: {}",
            ended.stderr
        );
    }
    // A missing exchange is named too.
    std::fs::write(&config, text.replace(&exchange, "no-such-exchange")).expect("edit");
    let mut cmd = carteiro();
    cmd.args(["check", "-c"]).arg(&config);
    let ended = run_to_end(cmd, WAIT).await;
    assert_ne!(ended.code, Some(0));
    assert!(
        ended.stderr.contains("no-such-exchange"),
        "{}",
        ended.stderr
    );
}

#[tokio::test]
async fn an_oversized_row_is_parked_and_reported_while_the_others_go_out() {
    let db = AppDb::sqlite();
    db.create_table();
    let Story {
        client,
        sink,
        dir,
        config,
        ..
    } = Story::new(&db, "poll", "max_payload = \"2KiB\"\n").await;
    db.execute(
        "INSERT INTO outbox_events (evento_id, tipo, routing_key, payload, criado_em, publicado) \
         VALUES ('too-big', 'matricula.confirmada', 'matricula.confirmada', \
         printf('%.4000c', 'x'), '2026-12-05 10:00:00.000000', 0)",
    )
    .await;
    let committed = db
        .write(
            &dir.path().join("written.json"),
            40,
            &["--rollback-share", "0"],
        )
        .committed;
    let running = relay(&config, "(active)").await;
    let seen = receive_all(&client, &sink, &committed).await;
    assert!(!seen.contains_key("too-big"));
    let mut status = carteiro();
    status.args(["outbox", "status", "-c"]).arg(&config);
    let shown = wait_for("the parked row in outbox status", WAIT, || {
        let config = config.clone();
        async move {
            let mut status = carteiro();
            status.args(["outbox", "status", "-c"]).arg(&config);
            let out = run_to_end(status, WAIT).await;
            out.stdout
                .contains("parked             1")
                .then_some(out.stdout)
        }
    })
    .await;
    assert!(
        shown.contains("row 1 (event too-big): parked")
            && shown.contains("over max_payload (2048 bytes)"),
        "{shown}"
    );
    assert_eq!(
        db.count("SELECT CAST(COUNT(*) AS BIGINT) FROM outbox_events WHERE NOT publicado")
            .await,
        1,
        "only the parked row is left"
    );
    running.kill().await;
}

/// What a relay of `mode` logs once it publishes.
fn active(mode: &str) -> &'static str {
    if mode == "cdc" {
        "CDC relay active"
    } else {
        "(active)"
    }
}

#[tokio::test]
async fn a_second_relay_stands_by_and_takes_over_within_seconds_polling() {
    standby_takes_over("poll").await;
}

#[tokio::test]
async fn a_second_relay_stands_by_and_takes_over_within_seconds_from_the_slot() {
    standby_takes_over("cdc").await;
}

async fn standby_takes_over(mode: &str) {
    let db = AppDb::postgres().await;
    db.create_table();
    let Story {
        client,
        sink,
        dir,
        config,
        ..
    } = Story::new(&db, mode, "").await;
    let first = relay(&config, active(mode)).await;
    let mut second = relay(&config, "standing by").await;
    let committed = db.write(&dir.path().join("one.json"), 100, &[]).committed;
    receive_all(&client, &sink, &committed).await;
    assert!(
        !second.stderr().contains(active(mode)),
        "two relays active at once"
    );
    first.kill().await;
    let killed = Instant::now();
    second
        .wait_stderr(active(mode), Duration::from_secs(30))
        .await;
    let took = killed.elapsed();
    let committed = db.write(&dir.path().join("two.json"), 100, &[]).committed;
    receive_all(&client, &sink, &committed).await;
    wait_for("every row marked", WAIT, || async {
        (db.unpublished().await == 0).then_some(())
    })
    .await;
    second.kill().await;
    if mode == "cdc" {
        crate::cdc::drop_slot(&db.url, &db.slot).await;
    }
    assert!(took <= Duration::from_secs(10), "took over after {took:?}");
    eprintln!("{mode}: the standing-by relay took over {took:?} after the kill");
}

/// An application's database that does not answer at start holds nothing back: the relay
/// starts, says it waits, and relays the table once the database is there.
#[tokio::test]
async fn a_database_down_at_start_is_waited_for() {
    let db = AppDb::postgres_later();
    let Story {
        client,
        sink,
        dir,
        config,
        ..
    } = Story::new(&db, "poll", "").await;
    let mut check = carteiro();
    check.args(["check", "-c"]).arg(&config);
    let checked = run_to_end(check, WAIT).await;
    assert_ne!(checked.code, Some(0), "check names an unreachable database");
    assert!(
        checked
            .stderr
            .contains("outbox matriculas: the application's database does not answer"),
        "{}",
        checked.stderr
    );
    let mut running = relay(&config, "its relay waits for it").await;
    db.create_database().await;
    db.create_table();
    let committed = db.write(&dir.path().join("late.json"), 50, &[]).committed;
    running.wait_stderr("(active)", WAIT).await;
    receive_all(&client, &sink, &committed).await;
    wait_for("every row marked", WAIT, || async {
        (db.unpublished().await == 0).then_some(())
    })
    .await;
    running.kill().await;
}
