//! `BatchedReads` answers exactly what the one-at-a-time reads answer, under concurrency.

use super::{TestDb, both_backends, request, write};
use crate::store::{BatchedReads, StoreError};

both_backends!(batched_reads_match_single_reads);

async fn batched_reads_match_single_reads(db: &TestDb) {
    let s = &db.store;
    let mut batch = Vec::new();
    for i in 0..50 {
        let mut req = request("r", &format!("m-{i}"));
        req.writes = vec![write(&format!("k-{i}"), Some(format!("v{i}").as_bytes()))];
        batch.push(req);
    }
    // One deleted key leaves a tombstone: it reads as absent.
    let mut del = request("r", "del");
    del.writes = vec![write("k-1", None)];
    s.commit_batch(&batch).await.unwrap();
    s.commit_batch(&[del]).await.unwrap();

    let reads = BatchedReads::spawn(s.clone());
    let lookups = (0..400).map(|i| {
        let reads = reads.clone();
        async move {
            let key = format!("{}-{}", if i % 2 == 0 { "m" } else { "k" }, i % 100);
            if i % 2 == 0 {
                let got = reads.inbox_contains("r", &key).await.unwrap();
                let want = s.inbox_contains("r", &key).await.unwrap();
                assert_eq!(got, want, "inbox {key}");
                u32::from(got)
            } else {
                let got = reads.kv_get("ns", &key).await.unwrap();
                let want = s.kv_get("ns", &key).await.unwrap();
                assert_eq!(got, want, "kv {key}");
                u32::from(got.is_some())
            }
        }
    });
    let found: u32 = futures::future::join_all(lookups).await.into_iter().sum();
    // Even i asks m-0, m-2, .. m-98 (hits below 50), odd i asks k-1, k-3, .. k-99 (hits below
    // 50 except the deleted k-1); each key is asked 4 times.
    assert_eq!(found, 100 + 96);

    assert!(matches!(
        reads.kv_get("ns", "bad\0key").await,
        Err(StoreError::Invalid(m)) if m.contains("kv key")
    ));
    s.pool().close().await;
    assert!(matches!(
        reads.inbox_contains("r", "m-1").await,
        Err(StoreError::Unavailable(_))
    ));
}
