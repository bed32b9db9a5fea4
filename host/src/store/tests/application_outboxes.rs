//! The bookkeeping of application outboxes: one relay leads an outbox until its lease runs
//! out or it steps down; a failure is counted once per attempt, parked or in backoff, and
//! forgotten once the row is published.

use super::{TestDb, both_backends};
use crate::store::Wait;

both_backends!(
    one_relay_leads_until_its_lease_runs_out_or_it_steps_down,
    failures_count_attempts_wait_and_are_forgotten
);

async fn one_relay_leads_until_its_lease_runs_out_or_it_steps_down(db: &TestDb) {
    let s = &db.store;
    assert!(s.app_outbox_lead("o", "a", 400).await.unwrap());
    assert!(!s.app_outbox_lead("o", "b", 400).await.unwrap(), "a leads");
    assert!(s.app_outbox_lead("o", "a", 400).await.unwrap(), "a renews");
    assert!(
        s.app_outbox_lead("other", "b", 400).await.unwrap(),
        "per outbox"
    );
    assert_eq!(
        s.app_outbox_leader("o").await.unwrap().as_deref(),
        Some("a")
    );
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert!(
        s.app_outbox_lead("o", "b", 60_000).await.unwrap(),
        "a's lease ran out"
    );
    assert!(
        !s.app_outbox_lead("o", "a", 400).await.unwrap(),
        "b leads now"
    );
    s.app_outbox_step_down("o", "a").await.unwrap();
    assert_eq!(
        s.app_outbox_leader("o").await.unwrap().as_deref(),
        Some("b"),
        "a cannot free b's lease"
    );
    s.app_outbox_step_down("o", "b").await.unwrap();
    assert!(
        s.app_outbox_lead("o", "a", 400).await.unwrap(),
        "b stepped down"
    );
}

async fn failures_count_attempts_wait_and_are_forgotten(db: &TestDb) {
    let s = &db.store;
    s.app_outbox_record_failure("o", (7, "e-7", "k"), "unroutable", Wait::Retry(60_000))
        .await
        .unwrap();
    s.app_outbox_record_failure(
        "o",
        (7, "e-7", "k"),
        "unroutable again",
        Wait::Retry(60_000),
    )
    .await
    .unwrap();
    s.app_outbox_record_failure("o", (9, "e-9", ""), "too big", Wait::Park)
        .await
        .unwrap();
    s.app_outbox_record_failure("o", (3, "e-3", "k"), "nack", Wait::Retry(0))
        .await
        .unwrap();
    let all = s.app_outbox_failures("o", false).await.unwrap();
    assert_eq!(all.iter().map(|f| f.row_id).collect::<Vec<_>>(), [3, 7, 9]);
    assert_eq!(
        (all[1].attempts, all[1].last_error.as_str()),
        (2, "unroutable again")
    );
    assert!(all[2].parked() && !all[1].parked());
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let waiting = s.app_outbox_failures("o", true).await.unwrap();
    assert_eq!(
        waiting.iter().map(|f| f.row_id).collect::<Vec<_>>(),
        [7, 9],
        "row 3's backoff is over"
    );
    assert!(
        s.app_outbox_failures("other", false)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(s.app_outbox_forget("o", &[3, 9, 42]).await.unwrap(), 2);
    let left = s.app_outbox_failures("o", false).await.unwrap();
    assert_eq!(left.iter().map(|f| f.row_id).collect::<Vec<_>>(), [7]);
}
