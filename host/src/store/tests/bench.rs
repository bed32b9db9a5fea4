//! Rough throughput of `commit_batch` (ignored; run on demand):
//! `cargo test -p carteiro --lib store::tests::bench -- --ignored --nocapture`
//! Absolute numbers drift on shared machines; compare batch sizes within one run.

use std::time::Instant;

use super::{TestDb, event, request, write};

async fn measure(db: &TestDb, label: &str) {
    for (batch, total) in [(1usize, 400usize), (64, 6400)] {
        let start = Instant::now();
        for n in 0..total / batch {
            let reqs: Vec<_> = (0..batch)
                .map(|i| {
                    let key = format!("{label}-{batch}-{n}-{i}");
                    let mut r = request("bench", &key);
                    r.writes = vec![write(&key, Some(b"value"))];
                    r.outbox = vec![event("bench.done", &[7u8; 256])];
                    r
                })
                .collect();
            db.store.commit_batch(&reqs).await.unwrap();
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{label}: batch {batch:>2}: {total} requests in {secs:.2} s = {:.0} requests/s",
            total as f64 / secs
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark, run on demand"]
async fn sqlite() {
    let db = TestDb::sqlite().await;
    measure(&db, "sqlite").await;
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark, run on demand"]
async fn postgres() {
    let db = TestDb::postgres().await;
    measure(&db, "postgres").await;
    db.finish().await;
}
