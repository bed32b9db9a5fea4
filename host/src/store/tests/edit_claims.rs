//! An edited copy's claim on its key: held against a second edit until the copy settles
//! (applied by the route, archived again as a copy of the same dead letter with the same
//! message id), lapses on its own, and is given up when the copy was not sent.

use super::{TestDb, both_backends, dl};
use crate::store::{EditKeyClaim, KeyTaken, NewDeadLetter};

both_backends!(an_edit_key_claim_holds_until_its_copy_settles);

fn claim<'a>(key: &'a str, owner: &'a str, lease_ms: i64) -> EditKeyClaim<'a> {
    EditKeyClaim {
        route: "orders",
        key,
        dead_letter_id: 7,
        message_id: Some(key),
        owner,
        lease_ms,
    }
}

/// A dead letter of `orders` that is a copy of dead letter 7 sent with `message_id`.
fn copy_of_7(message_id: &str) -> NewDeadLetter {
    let mut letter = dl("orders", "boom again", 1);
    letter
        .headers
        .push(("x-carteiro-replay-of".into(), "7".into()));
    letter
        .headers
        .push((":message-id".into(), message_id.into()));
    letter
}

async fn an_edit_key_claim_holds_until_its_copy_settles(db: &TestDb) {
    let s = &db.store;
    assert_eq!(
        s.edit_claim_key(&claim("m-1", "a", 60_000)).await.unwrap(),
        Ok(())
    );
    let held = s.edit_claim_key(&claim("m-1", "b", 60_000)).await.unwrap();
    let Err(KeyTaken::Held(held)) = held else {
        panic!("the first copy has not settled: {held:?}");
    };
    assert_eq!(held.dead_letter_id, 7);
    assert!(held.claimed_until >= held.claimed_at + 60_000, "{held:?}");

    // Another copy of 7 (another id) coming back settles nothing; this one's does.
    s.dead_letter_insert(&copy_of_7("m-other")).await.unwrap();
    assert!(
        s.edit_claim_key(&claim("m-1", "b", 60_000))
            .await
            .unwrap()
            .is_err()
    );
    s.dead_letter_insert(&copy_of_7("m-1")).await.unwrap();
    assert_eq!(
        s.edit_claim_key(&claim("m-1", "b", 60_000)).await.unwrap(),
        Ok(())
    );

    // Applied by the route: the claim no longer holds, and no new one is taken, though the
    // edit's inbox check passed before the copy was applied (the fault campaign saw both
    // edits of one dead letter sent on SQLite, the second acked as a duplicate).
    sqlx::query("INSERT INTO inbox (route, key, processed_at) VALUES ('orders', 'm-1', 1)")
        .execute(s.pool())
        .await
        .unwrap();
    assert_eq!(
        s.edit_claim_key(&claim("m-1", "c", 60_000)).await.unwrap(),
        Err(KeyTaken::Applied)
    );
    let left: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM dead_letter_edit_claims WHERE route = 'orders' AND key = 'm-1'",
    )
    .fetch_one(s.pool())
    .await
    .unwrap();
    assert_eq!(left, 0, "the applied key's claim is dropped");

    // Lapsed on its own; given up by its owner.
    s.edit_claim_key(&claim("m-2", "a", -1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        s.edit_claim_key(&claim("m-2", "b", 60_000)).await.unwrap(),
        Ok(())
    );
    s.edit_release_key("orders", "m-2", "someone else")
        .await
        .unwrap();
    assert!(
        s.edit_claim_key(&claim("m-2", "c", 60_000))
            .await
            .unwrap()
            .is_err()
    );
    s.edit_release_key("orders", "m-2", "b").await.unwrap();
    assert_eq!(
        s.edit_claim_key(&claim("m-2", "c", 60_000)).await.unwrap(),
        Ok(())
    );
}
