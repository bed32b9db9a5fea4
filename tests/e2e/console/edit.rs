//! Edit and retry in the console: in headless Chromium, the form on a dead letter's page, the
//! inbox rule it states, refusals (invalid JSON, a Carteiro header, an applied id kept), the
//! edit record the page shows and the journey page; over plain HTTP, the credentials and
//! same-origin rules on the edit's form post and who the record names. With
//! `CARTEIRO_CONSOLE_SCREENSHOTS=docs/console` the browser test writes `edit-and-retry.png`,
//! `edit-refused.png` and `journey.png`.

use super::browser::{click, log_in, text, wait_shown};
use super::driver::Browser;
use super::{PASSWORD, USER, WAIT, basic, console, dead_letter, http, post_form, runs};
use crate::resilience::counter_value;
use crate::support::{archived, wait_for};
use fantoccini::{Client, Locator};

const ORIGINAL: &[u8] = br#"{"order":7,"qty":"three"}"#;

/// Replaces the body in the edit form with `body`.
async fn type_body(c: &Client, body: &str) {
    let field = c
        .find(Locator::Id("edit-body"))
        .await
        .expect("the body field");
    field.clear().await.expect("clear the body");
    field.send_keys(body).await.expect("type the body");
}

/// Fills the first empty header row of the edit form with `name` and `value`.
async fn add_header(c: &Client, name: &str, value: &str) {
    let names = c
        .find_all(Locator::Css("input[name=hname]"))
        .await
        .expect("header rows");
    let values = c
        .find_all(Locator::Css("input[name=hvalue]"))
        .await
        .expect("header rows");
    for (field, value_field) in names.iter().zip(&values) {
        let current = field.prop("value").await.expect("value");
        if current.unwrap_or_default().is_empty() {
            field.send_keys(name).await.expect("type a header name");
            value_field.send_keys(value).await.expect("type a value");
            return;
        }
    }
    panic!("no empty header row");
}

/// Submits the edit form and waits for a page that contains `expected`.
async fn submit_until(c: &Client, expected: &str) -> String {
    click(c, "edit-submit").await;
    wait_for(&format!("a page saying {expected:?}"), WAIT, || async {
        let page = c.source().await.ok()?;
        page.contains(expected).then_some(page)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_edit_and_retry_in_a_browser() {
    let (queue, _, listen, gw) = console("consoleedit").await;
    let store = &gw.store;
    let id = dead_letter(store, &queue, "qty is not a number", "ed-1", ORIGINAL).await;

    let browser = Browser::start().await;
    let c = &browser.client;
    log_in(c, &listen).await;
    let page = format!("http://{listen}/dead-letters/message/{id}");
    c.goto(&page).await.expect("message page");
    let note = text(c, "#inbox-note").await;
    assert!(note.contains("message id"), "{note}");
    assert!(note.contains("not applied yet"), "{note}");

    // Refused, nothing sent: a body that is no longer JSON, a Carteiro header.
    type_body(c, r#"{"order":7,"qty":}"#).await;
    let refusal = submit_until(c, "not valid JSON").await;
    assert!(refusal.contains("line 1 column"), "{refusal}");
    c.goto(&page).await.expect("message page");
    add_header(c, "x-carteiro-attempt", "1").await;
    submit_until(c, "x-carteiro-attempt` cannot be edited").await;
    assert_eq!(counter_value(store, "runs").await, 0, "nothing was sent");

    // The edit: the page shows who changed what; the handler runs on the edited copy.
    c.goto(&page).await.expect("message page");
    type_body(c, r#"{"order":7,"qty":3}"#).await;
    add_header(c, "x-fixed-in", "console").await;
    click(c, "edit-submit").await;
    let record = wait_shown(c, "the edit on the page", "edits").await;
    assert!(record.contains("body changed (25 → 19 bytes)"), "{record}");
    assert!(record.contains("set x-fixed-in = \"console\""), "{record}");
    assert_eq!(text(c, "#edits td.actor").await, USER);
    assert_ne!(text(c, "#edited").await, "never");
    Browser::screenshot(c, "edit-and-retry").await;
    runs(store, 1).await;
    assert_eq!(counter_value(store, "seen/ed-1").await, 1);

    // Applied now: the page says so, and an edit keeping the id is refused.
    c.goto(&page).await.expect("message page");
    let note = text(c, "#inbox-note").await;
    assert!(note.contains("already applied"), "{note}");
    type_body(c, r#"{"order":7,"qty":4}"#).await;
    let refusal = submit_until(c, "Ask for a new message id").await;
    assert!(refusal.contains("already applied"), "{refusal}");
    Browser::screenshot(c, "edit-refused").await;
    // With a new id it is a new message.
    c.goto(&page).await.expect("message page");
    type_body(c, r#"{"order":7,"qty":4}"#).await;
    click(c, "edit-new-id").await;
    click(c, "edit-submit").await;
    wait_for("the second edit on the page", WAIT, || async {
        let rows = c.find_all(Locator::Css("#edits tr.edit")).await.ok()?;
        (rows.len() == 2).then_some(())
    })
    .await;
    runs(store, 2).await;

    // The journey: the dead-lettering and both edits, and the outcome.
    click(c, "journey-link").await;
    let outcome = wait_shown(c, "the journey page", "journey-outcome").await;
    assert!(outcome.contains("applied"), "{outcome}");
    let edits = c
        .find_all(Locator::Css("#journey tr[data-kind=edited]"))
        .await
        .expect("rows");
    assert_eq!(edits.len(), 2);
    let dead = c
        .find_all(Locator::Css("#journey tr[data-kind=dead-lettered]"))
        .await
        .expect("rows");
    assert_eq!(dead.len(), 1);
    Browser::screenshot(c, "journey").await;

    browser.close().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_edit_needs_credentials_and_the_console_origin() {
    let (queue, port, _, gw) = console("editauth").await;
    let id = dead_letter(&gw.store, &queue, "boom", "ea-1", b"{}").await;
    let path = format!("/dead-letters/message/{id}/edit");
    let form = "body=%7B%22a%22%3A1%7D";
    let (status, _, _) = http(port, "POST", &path, &[], form).await;
    assert_eq!(status, 401, "no credentials");
    let auth = basic(USER, PASSWORD);
    let cross = [
        ("authorization", auth.as_str()),
        ("sec-fetch-site", "cross-site"),
    ];
    let (status, _, _) = http(port, "POST", &path, &cross, form).await;
    assert_eq!(status, 403, "another site's page");
    let d = archived(&gw.store, id).await;
    assert!(d.edited_at.is_none() && d.replay_count == 0, "nothing sent");

    // From the console's own page: sent, and recorded as the basic-auth user.
    let same = [
        ("authorization", auth.as_str()),
        ("sec-fetch-site", "same-origin"),
    ];
    let (status, head, _) = http(port, "POST", &path, &same, form).await;
    assert_eq!(status, 303, "{head}");
    // With the bearer token (and a new id): recorded as `token`.
    let (status, head, _) = post_form(port, &path, "body=%7B%22a%22%3A2%7D&new_id=1").await;
    assert_eq!(status, 303, "{head}");
    let events = gw.store.dead_letter_events(id).await.expect("events");
    let actors: Vec<_> = events.iter().map(|e| e.actor.as_deref()).collect();
    assert_eq!(actors, [Some(USER), Some("token")]);
    runs(&gw.store, 2).await;
    gw.stop().await;
}

/// The console refuses an edit whose key an earlier edit's copy still holds (that copy waits
/// in the queue, so the inbox does not know the key yet), as `carteiro dlq edit` does; once
/// the claim is gone the same form post is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_edit_waits_until_an_earlier_copy_with_the_key_settles() {
    let (queue, port, _, gw) = console("editwait").await;
    let id = dead_letter(&gw.store, &queue, "boom", "ew-1", b"{}").await;
    let earlier = carteiro::store::EditKeyClaim {
        route: &queue,
        key: "ew-1",
        dead_letter_id: id,
        message_id: Some("ew-1"),
        owner: "an earlier edit",
        lease_ms: 60_000,
    };
    let claimed = gw.store.edit_claim_key(&earlier).await.expect("claim");
    assert_eq!(claimed, Ok(()));
    let path = format!("/dead-letters/message/{id}/edit");
    let form = "body=%7B%22a%22%3A1%7D";
    let (status, _, page) = post_form(port, &path, form).await;
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("has not settled"), "{page}");
    assert!(page.contains("new message id"), "{page}");
    let d = archived(&gw.store, id).await;
    assert!(d.edited_at.is_none() && d.replay_count == 0, "nothing sent");

    gw.store
        .edit_release_key(&queue, "ew-1", "an earlier edit")
        .await
        .expect("release");
    let (status, head, _) = post_form(port, &path, form).await;
    assert_eq!(status, 303, "{head}");
    runs(&gw.store, 1).await;
    gw.stop().await;
}
