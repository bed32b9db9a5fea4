//! The console in headless Chromium, as an operator uses it.

use super::driver::Browser;
use super::{PASSWORD, USER, WAIT, console, count, dead_letter, runs};
use crate::support::wait_for;
use fantoccini::elements::Element;
use fantoccini::{Client, Locator};

const MISSING: &str = "missing field `…` at line <n> column <n>";
const ORDER: &str = "order <uuid> not found";
const HOSTILE_BODY: &[u8] =
    br#"{"note":"<img src=x onerror=alert(1)>","customer":{"email":"a@example.com","tags":["x","y"]}}"#;

pub(super) async fn text(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no element {css}: {e}"))
        .text()
        .await
        .expect("text")
}

/// The text of the element `locator` finds, or `None` while the page does not show it (yet).
pub(super) async fn shown_text(c: &Client, locator: Locator<'_>) -> Option<String> {
    c.find(locator).await.ok()?.text().await.ok()
}

/// The text of the element with id `id` once the page shows it; `what` names it in a timeout.
pub(super) async fn wait_shown(c: &Client, what: &str, id: &str) -> String {
    wait_text(c, what, Locator::Id(id), |_| true).await
}

/// The text of the element `locator` finds once the page shows it with a text `done`
/// accepts; `what` names it in a timeout.
async fn wait_text(
    c: &Client,
    what: &str,
    locator: Locator<'_>,
    done: impl Fn(&str) -> bool,
) -> String {
    wait_for(what, WAIT, || async {
        let text = shown_text(c, locator).await?;
        done(&text).then_some(text)
    })
    .await
}

/// Logs in to the console at `listen` as [`USER`]: the credentials in the URL answer
/// `/login`'s challenge, and the browser sends them with this origin's later requests.
pub(super) async fn log_in(c: &Client, listen: &str) {
    c.goto(&format!("http://{USER}:{PASSWORD}@{listen}/login"))
        .await
        .expect("log in");
}

/// The element `locator` finds; `what` names it in a failure.
async fn element(c: &Client, locator: Locator<'_>, what: &str) -> Element {
    c.find(locator).await.expect(what)
}

/// Clicks the element with id `id`.
pub(super) async fn click(c: &Client, id: &str) {
    c.find(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("no element #{id}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click #{id}: {e}"));
}

/// Types `keys` into the field with id `id`.
pub(super) async fn type_into(c: &Client, id: &str, keys: &str) {
    c.find(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("no field #{id}: {e}"))
        .send_keys(keys)
        .await
        .unwrap_or_else(|e| panic!("type into #{id}: {e}"));
}

/// The groups page's (count, not replayed) of group `reason`, if listed.
async fn group_counts(c: &Client, base: &str, reason: &str) -> Option<(i64, i64)> {
    c.goto(&format!("{base}/dead-letters"))
        .await
        .expect("groups page");
    for row in c.find_all(Locator::Css("tr.group")).await.expect("rows") {
        if row.attr("data-reason").await.expect("attr").as_deref() == Some(reason) {
            let n = |css: &'static str| {
                let row = row.clone();
                async move {
                    let cell = row.find(Locator::Css(css)).await.expect("cell");
                    cell.text()
                        .await
                        .expect("text")
                        .trim()
                        .parse::<i64>()
                        .expect("a number")
                }
            };
            return Some((
                n("[data-field=count]").await,
                n("[data-field=unreplayed]").await,
            ));
        }
    }
    None
}

async fn open_group(c: &Client, base: &str, reason: &str) {
    c.goto(&format!("{base}/dead-letters"))
        .await
        .expect("groups page");
    let link = c
        .find(Locator::XPath(&format!("//tr[@data-reason='{reason}']//a")))
        .await
        .unwrap_or_else(|e| panic!("no link to group {reason}: {e}"));
    link.click().await.expect("open the group");
    wait_shown(c, "the group page", "group-summary").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_browser() {
    let (queue, _, listen, gw) = console("console").await;
    let store = &gw.store;
    // The known mix: 6 "missing field" variants, 3 unknown orders, 1 hostile message.
    for i in 0..6 {
        let field = ["email", "name", "sku"][i % 3];
        let reason = format!("missing field `{field}` at line 1 column {}", 10 + i);
        let body = format!(r#"{{"id":{i},"items":[1,2]}}"#);
        dead_letter(store, &queue, &reason, &format!("mf-{i}"), body.as_bytes()).await;
    }
    for i in 0..3 {
        let reason = format!("order 0193a4f2-7b1c-7d3e-9f00-00000000000{i} not found");
        dead_letter(store, &queue, &reason, &format!("o-{i}"), b"{}").await;
    }
    let hostile_reason = "<script>alert(1)</script> rejected";
    let hostile = dead_letter(store, &queue, hostile_reason, "h-1", HOSTILE_BODY).await;

    let browser = Browser::start().await;
    let c = &browser.client;
    let base = format!("http://{listen}");
    // Log in, which lands on the routes page.
    log_in(c, &listen).await;

    // Routes.
    let route_css = format!("tr[data-route='{queue}']");
    let route_row = element(c, Locator::Css(&route_css), "the route's row").await;
    let row_text = route_row.text().await.expect("text");
    assert!(row_text.contains("counter"), "plugin name: {row_text}");
    let row_html = route_row.html(false).await.expect("html");
    for (delay, tier) in [("1s", "1000ms"), ("5s", "5000ms")] {
        let shown = format!("<code title=\"{queue}.retry.{tier}\">{delay}</code>: 0");
        assert!(row_html.contains(&shown), "retry tier {tier}: {row_html}");
    }
    assert!(text(c, "#outbox").await.contains("pending"));
    Browser::screenshot(c, "routes").await;

    // Groups with the right counts.
    assert_eq!(group_counts(c, &base, MISSING).await, Some((6, 6)));
    assert_eq!(group_counts(c, &base, ORDER).await, Some((3, 3)));
    assert_eq!(
        group_counts(c, &base, "<script>alert(<n>)</script> rejected").await,
        Some((1, 1)),
        "the hostile reason is shown as text"
    );
    Browser::screenshot(c, "dead-letter-groups").await;

    // A message: pretty JSON, headers, attempts; hostile text escaped, never run.
    c.goto(&format!("{base}/dead-letters/message/{hostile}"))
        .await
        .expect("message page");
    let body = text(c, "#body").await;
    assert!(
        body.contains("\"note\": \"<img src=x onerror=alert(1)>\""),
        "{body}"
    );
    assert!(
        body.contains("\n  \"customer\": {\n    \"email\""),
        "pretty-printed: {body}"
    );
    assert_eq!(text(c, "#reason").await, hostile_reason);
    assert_eq!(text(c, "#attempts").await, "3");
    assert!(text(c, "#headers").await.contains("<b>acme</b>"));
    let source = c.source().await.expect("source");
    assert!(!source.contains("<img src=x"), "the body is escaped");
    assert!(!source.contains("<script>alert"), "the reason is escaped");
    assert!(source.contains("&lt;img src=x onerror=alert(1)&gt;"));
    let images = c.find_all(Locator::Css("img")).await.expect("img");
    assert!(images.is_empty(), "no element came from the message");
    Browser::screenshot(c, "message").await;

    // Open a group, then one of its messages from the list.
    open_group(c, &base, MISSING).await;
    let first = element(c, Locator::Css("tr.message a"), "a message link").await;
    first.click().await.expect("open the message");
    wait_text(c, "the message page", Locator::Id("body"), |body| {
        body.contains("\"items\": [")
    })
    .await;

    // Replay the group, rate-limited, and watch the counts change.
    open_group(c, &base, MISSING).await;
    let rate = element(c, Locator::Id("replay-rate"), "rate field").await;
    rate.clear().await.expect("clear");
    rate.send_keys("3").await.expect("rate");
    click(c, "replay-group-submit").await;
    wait_shown(c, "the job page", "job").await;
    wait_text(
        c,
        "the first replays on the page",
        Locator::Css("[data-field=done]"),
        |done| done.trim().parse::<u64>().is_ok_and(|n| n >= 1),
    )
    .await;
    Browser::screenshot(c, "replay-in-progress").await;
    wait_text(
        c,
        "the replay to finish on the page",
        Locator::Id("job-state"),
        |state| state.contains("done"),
    )
    .await;
    let progress = text(c, "#job").await;
    assert!(progress.contains("6 of 6 replayed"), "{progress}");
    assert!(text(c, "#remaining").await.starts_with("0 matching"));
    Browser::screenshot(c, "replay-done").await;
    runs(store, 6).await;
    assert_eq!(
        group_counts(c, &base, MISSING).await,
        Some((6, 0)),
        "all six replayed"
    );
    assert_eq!(
        group_counts(c, &base, ORDER).await,
        Some((3, 3)),
        "the others untouched"
    );

    // Purge with a confirmation: a wrong count deletes nothing; the right one deletes.
    open_group(c, &base, ORDER).await;
    click(c, "purge-group-submit").await;
    wait_shown(c, "the confirmation page", "purge-count").await;
    assert_eq!(text(c, "#purge-count").await, "3");
    Browser::screenshot(c, "purge-confirm").await;
    let confirm_url = c.current_url().await.expect("url");
    type_into(c, "confirm", "2").await;
    click(c, "purge-submit").await;
    wait_for("the refusal", WAIT, || async {
        let page = c.source().await.ok()?;
        page.contains("does not match").then_some(())
    })
    .await;
    assert_eq!(
        count(store, &queue, "not found", None).await,
        3,
        "nothing deleted"
    );
    c.goto(confirm_url.as_str())
        .await
        .expect("confirm page again");
    type_into(c, "confirm", "3").await;
    click(c, "purge-submit").await;
    wait_text(c, "the purge", Locator::Id("purged"), |done| {
        done.contains("3 dead letters deleted")
    })
    .await;
    assert_eq!(count(store, &queue, "not found", None).await, 0);
    assert_eq!(
        group_counts(c, &base, ORDER).await,
        None,
        "the group is gone"
    );

    // A shadow run of a group against another plugin file: a report, nothing replayed.
    let hostile_group = "<script>alert(<n>)</script> rejected";
    open_group(c, &base, hostile_group).await;
    let path = crate::support::plugin("counter").display().to_string();
    type_into(c, "shadow-path", &path).await;
    click(c, "shadow-submit").await;
    let report = wait_shown(c, "the shadow report", "shadow-summary").await;
    let report = report.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(report.contains("dead-letter → ack 1"), "{report}");
    assert!(text(c, "#shadow-lines").await.contains("→ ack"));
    Browser::screenshot(c, "shadow-report").await;
    assert_eq!(
        count(store, &queue, "rejected", Some(true)).await,
        0,
        "a shadow replays nothing"
    );

    // A browser without credentials may look (loopback) but not change anything: the
    // actions show disabled, with why and a way to log in (the server refuses the posts
    // anyway: console::auth).
    let anonymous = browser.another_session().await;
    open_group(&anonymous, &base, hostile_group).await;
    let replay = element(&anonymous, Locator::Id("replay-group-submit"), "button").await;
    assert!(
        !replay.is_enabled().await.expect("enabled?"),
        "replay is disabled"
    );
    let note = text(&anonymous, "#actions-off").await;
    assert!(
        note.contains("need the [admin] credentials") && note.contains("log in"),
        "{note}"
    );
    Browser::screenshot(&anonymous, "actions-off").await;
    let _ = anonymous.close().await;
    assert_eq!(
        count(store, &queue, "rejected", Some(true)).await,
        0,
        "nothing replayed"
    );

    browser.close().await;
    gw.stop().await;
}
