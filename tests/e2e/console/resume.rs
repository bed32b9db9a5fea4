//! A console replay is the `dlq replay` engine: stopped half-way and started again, it
//! replays each dead letter exactly once, oldest first, at the rate asked; and it stops with
//! its gateway.

use super::{Console, count, http, post_json, runs};
use crate::support::{archived, wait_for};
use std::time::{Duration, Instant};

const N: i64 = 30;

async fn job(port: u16, location: &str) -> serde_json::Value {
    let (_, _, body) = http(port, "GET", location, &[], "").await;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("job JSON {body}: {e}"))
}

/// The job at `location` once it has finished.
async fn finished(port: u16, location: &str, what: &str) -> serde_json::Value {
    wait_for(what, super::WAIT, || async {
        let j = job(port, location).await;
        (j["finished"] == true).then_some(j)
    })
    .await
}

/// The replay count of each dead letter of `ids`, in their order.
async fn replay_counts(store: &carteiro::store::Store, ids: &[i64]) -> Vec<i64> {
    let mut counts = Vec::with_capacity(ids.len());
    for id in ids {
        counts.push(archived(store, *id).await.replay_count);
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_replay_stops_and_resumes_once() {
    let Console {
        gw,
        queue,
        port,
        ids,
    } = Console::with_dead_letters("console-resume", "content service 503 for order", "m", N).await;
    let start =
        format!(r#"{{"route":"{queue}","reason":"content service <n> for order <n>","rate":10}}"#);

    let started = Instant::now();
    let (status, _, body) = post_json(port, "/api/dlq/replay", &start).await;
    assert_eq!(status, 202, "{body}");
    let first: serde_json::Value = serde_json::from_str(&body).expect("job");
    let location = format!("/api/jobs/{}", first["id"]);
    wait_for("a third replayed", super::WAIT, || async {
        let j = job(port, &location).await;
        (j["done"].as_i64() >= Some(N / 3)).then_some(())
    })
    .await;
    // Rate-limited: 10 a second cannot do a third of 30 in under 0.9 s.
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    let (status, _, _) = post_json(port, &format!("{location}/stop"), "").await;
    assert_eq!(status, 200);
    let stopped = finished(port, &location, "the job to stop").await;
    assert_eq!(stopped["stopped"], true, "{stopped}");
    let marked = count(&gw.store, &queue, "content service", Some(true)).await;
    assert!((N / 3..N).contains(&marked), "stopped half-way: {marked}");
    // Oldest first: the marked ones are exactly the oldest `marked` ids.
    let counts = replay_counts(&gw.store, &ids).await;
    for (i, (id, replay_count)) in ids.iter().zip(counts).enumerate() {
        assert_eq!(
            replay_count,
            i64::from((i as i64) < marked),
            "#{id} (index {i})"
        );
    }

    // Started again: takes only what is left.
    let fast = start.replace(r#""rate":10"#, r#""rate":200"#);
    let (status, _, body) = post_json(port, "/api/dlq/replay", &fast).await;
    assert_eq!(status, 202, "{body}");
    let second: serde_json::Value = serde_json::from_str(&body).expect("job");
    let location = format!("/api/jobs/{}", second["id"]);
    let done = finished(port, &location, "the second run to finish").await;
    assert_eq!(done["planned"].as_i64(), Some(N - marked), "{done}");
    assert_eq!(done["done"].as_i64(), Some(N - marked), "{done}");
    assert_eq!(done["remaining"], 0);
    runs(&gw.store, N).await;
    for (id, replay_count) in ids.iter().zip(replay_counts(&gw.store, &ids).await) {
        assert_eq!(replay_count, 1, "#{id} replayed exactly once");
    }
    // A third run finds nothing.
    let (_, _, body) = post_json(port, "/api/dlq/replay", &fast).await;
    let third: serde_json::Value = serde_json::from_str(&body).expect("job");
    let location = format!("/api/jobs/{}", third["id"]);
    let done = finished(port, &location, "the third run to finish").await;
    assert_eq!(done["done"], 0, "{done}");
    gw.stop().await;
}

/// A replay still running when its gateway stops is stopped with it: nothing is replayed
/// once the gateway's `stop` has returned. (It used to go on at its rate, through the
/// console's broker connection, and a runtime dropped under it waited for it for ever: a CI
/// run hung on it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_replay_stops_with_its_gateway() {
    let Console {
        gw, queue, port, ..
    } = Console::with_dead_letters("console-shutdown", "slow lane", "z", N).await;
    let start = format!(r#"{{"route":"{queue}","reason":"slow lane <n>","rate":5}}"#);
    let (status, _, body) = post_json(port, "/api/dlq/replay", &start).await;
    assert_eq!(status, 202, "{body}");
    let started: serde_json::Value = serde_json::from_str(&body).expect("job");
    let location = format!("/api/jobs/{}", started["id"]);
    wait_for("two replayed", super::WAIT, || async {
        (job(port, &location).await["done"].as_i64() >= Some(2)).then_some(())
    })
    .await;
    let store = gw.store.clone();
    let _dir = gw.stop().await;
    let at_stop = count(&store, &queue, "slow lane", Some(true)).await;
    assert!(at_stop < N, "the replay was still running: {at_stop}");
    // At 5 a second, a replay that outlived its gateway marks 7 more in this time.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let later = count(&store, &queue, "slow lane", Some(true)).await;
    assert_eq!(later, at_stop, "replayed after the gateway stopped");
}
