//! Background jobs are bounded: a replay rate outside 0.01–10,000 a second is refused (a
//! rate of `1e-300` used to panic the job's thread and leave it "running" forever, `1e300`
//! was no limit at all), and past four running replays a fifth is refused with 429.

use super::{Console, WAIT, assert_no_jobs, http, post_form, post_json};
use crate::support::wait_for;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_rates_and_running_jobs_are_bounded() {
    let Console {
        gw, queue, port, ..
    } = Console::with_dead_letters("console-limits", "slow lane", "s", 10).await;
    let replay =
        |rate: &str| format!(r#"{{"route":"{queue}","reason":"slow lane <n>","rate":{rate}}}"#);

    for rate in ["1e-300", "1e300", "0", "-5"] {
        let (status, _, body) = post_json(port, "/api/dlq/replay", &replay(rate)).await;
        assert_eq!(status, 400, "rate {rate}: {body}");
        assert!(
            body.contains("between 0.01 and 10000"),
            "rate {rate}: {body}"
        );
    }
    let form = format!("route={queue}&reason=slow+lane+%3Cn%3E&scope=group&rate=1e-300");
    let (status, _, body) = post_form(port, "/dead-letters/replay", &form).await;
    assert_eq!(status, 400, "{body}");
    assert_no_jobs(port, "no job was started").await;

    // Four slow replays run; a fifth is refused until one of them ends.
    let mut running = Vec::new();
    for _ in 0..4 {
        let (status, _, body) = post_json(port, "/api/dlq/replay", &replay("0.01")).await;
        assert_eq!(status, 202, "{body}");
        let job: serde_json::Value = serde_json::from_str(&body).expect("job");
        running.push(format!("/api/jobs/{}", job["id"]));
    }
    let (status, _, body) = post_json(port, "/api/dlq/replay", &replay("0.01")).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("4 replays are running already"), "{body}");
    for location in &running {
        let (status, _, _) = post_json(port, &format!("{location}/stop"), "").await;
        assert_eq!(status, 200);
        wait_for("the stopped replay to end", WAIT, || async {
            let (_, _, body) = http(port, "GET", location, &[], "").await;
            let job: serde_json::Value = serde_json::from_str(&body).ok()?;
            (job["finished"] == true).then_some(())
        })
        .await;
    }
    let (status, _, body) = post_json(port, "/api/dlq/replay", &replay("100")).await;
    assert_eq!(status, 202, "room again: {body}");
    gw.stop().await;
}
