//! Background jobs are bounded: a replay rate outside 0.01–10,000 a second is refused (a
//! rate of `1e-300` used to panic the job's thread and leave it "running" forever, `1e300`
//! was no limit at all), and past four running replays a fifth is refused with 429.

use super::{TOKEN, WAIT, dead_letter, gateway, http, loopback};
use crate::support::{unique, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_rates_and_running_jobs_are_bounded() {
    let queue = unique("console-limits");
    let (port, listen) = loopback();
    let gw = gateway(&queue, &listen, true).await;
    for i in 0..10 {
        dead_letter(
            &gw.store,
            &queue,
            &format!("slow lane {i}"),
            &format!("s-{i}"),
            b"{}",
        )
        .await;
    }
    let bearer = format!("Bearer {TOKEN}");
    let headers = [
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
    ];
    let replay =
        |rate: &str| format!(r#"{{"route":"{queue}","reason":"slow lane <n>","rate":{rate}}}"#);

    for rate in ["1e-300", "1e300", "0", "-5"] {
        let (status, _, body) =
            http(port, "POST", "/api/dlq/replay", &headers, &replay(rate)).await;
        assert_eq!(status, 400, "rate {rate}: {body}");
        assert!(
            body.contains("between 0.01 and 10000"),
            "rate {rate}: {body}"
        );
    }
    let form = format!("route={queue}&reason=slow+lane+%3Cn%3E&scope=group&rate=1e-300");
    let (status, _, body) = http(
        port,
        "POST",
        "/dead-letters/replay",
        &[("authorization", &bearer)],
        &form,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (_, _, jobs) = http(port, "GET", "/api/jobs", &[], "").await;
    assert_eq!(jobs.trim(), "[]", "no job was started: {jobs}");

    // Four slow replays run; a fifth is refused until one of them ends.
    let mut running = Vec::new();
    for _ in 0..4 {
        let (status, _, body) =
            http(port, "POST", "/api/dlq/replay", &headers, &replay("0.01")).await;
        assert_eq!(status, 202, "{body}");
        let job: serde_json::Value = serde_json::from_str(&body).expect("job");
        running.push(format!("/api/jobs/{}", job["id"]));
    }
    let (status, _, body) = http(port, "POST", "/api/dlq/replay", &headers, &replay("0.01")).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("4 replays are running already"), "{body}");
    for location in &running {
        let (status, _, _) = http(port, "POST", &format!("{location}/stop"), &headers, "").await;
        assert_eq!(status, 200);
        wait_for("the stopped replay to end", WAIT, || async {
            let (_, _, body) = http(port, "GET", location, &[], "").await;
            let job: serde_json::Value = serde_json::from_str(&body).ok()?;
            (job["finished"] == true).then_some(())
        })
        .await;
    }
    let (status, _, body) = http(port, "POST", "/api/dlq/replay", &headers, &replay("100")).await;
    assert_eq!(status, 202, "room again: {body}");
    gw.stop().await;
}
