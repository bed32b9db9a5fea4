//! The console's charts in headless Chromium: a known mix through the `mixed` fixture (3
//! acked at once, 2 retried once then acked, 3 dead-lettered by the handler), then on the
//! routes page a line of 60 points per outcome whose latest point is the mix, and the
//! handler's dead letters per minute; on the dead-letters page, the group's line of 24
//! hours ending in 3. With `CARTEIRO_CONSOLE_SCREENSHOTS=docs/console` it writes
//! `routes-charts.png` and `dead-letter-charts.png`.

use super::driver::Browser;
use super::{WAIT, count, gateway_on, loopback};
use crate::support::{Client, json_props, plugin_route, sqlite_config_head, unique, wait_for};
use carteiro::common::now_ms;
use fantoccini::Locator;
use fantoccini::elements::Element;
use std::collections::BTreeMap;
use std::time::Duration;

const MINUTE_MS: i64 = 60_000;
/// Points of a route's charts (a minute each) and of a group's (an hour each).
const MINUTES: usize = 60;
const HOURS: usize = 24;
/// The `mixed` fixture dead-letters `remember` with `runs 1 1` (a fresh instance each time).
const GROUP: &str = "runs <n> <n>";

/// The attribute `name` of `element`, which must have it.
async fn attr(element: &Element, name: &str) -> String {
    element
        .attr(name)
        .await
        .expect("attribute")
        .unwrap_or_else(|| panic!("no attribute {name}"))
}

/// The lines `css` finds, by `data-series`: each one's values (`data-values`), checked to
/// have one drawn point each and as many as `data-points` says.
async fn lines(c: &fantoccini::Client, css: &str) -> BTreeMap<String, Vec<u64>> {
    let mut out = BTreeMap::new();
    for line in c.find_all(Locator::Css(css)).await.expect("polylines") {
        let name = attr(&line, "data-series").await;
        let values: Vec<u64> = attr(&line, "data-values")
            .await
            .split(',')
            .map(|v| v.parse().expect("a count"))
            .collect();
        let drawn = attr(&line, "points").await.split_whitespace().count();
        let declared: usize = attr(&line, "data-points").await.parse().expect("a number");
        assert_eq!(
            (drawn, declared),
            (values.len(), values.len()),
            "{name}: one point per value"
        );
        out.insert(name, values);
    }
    out
}

/// Each line's total.
fn totals(lines: &BTreeMap<String, Vec<u64>>) -> BTreeMap<String, u64> {
    lines
        .iter()
        .map(|(name, values)| (name.clone(), values.iter().sum()))
        .collect()
}

/// The minute of now, since the epoch.
fn minute() -> i64 {
    now_ms().div_euclid(MINUTE_MS)
}

/// Waits until a minute has just begun, unless it began less than 15 s ago, so that the mix
/// and the page charting it fall in one minute: the charts' latest point is the current
/// minute. At most 46 s.
async fn top_of_a_minute() {
    let into = now_ms().rem_euclid(MINUTE_MS);
    if into > 15_000 {
        let wait = u64::try_from(MINUTE_MS - into + 200).expect("positive");
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}

/// Asserts that `values` (oldest first) are zero before the last `span` points and add up to
/// `want` over them: the minutes the mix ran in, which are the current one alone when it
/// all ran within a minute.
fn assert_latest(name: &str, values: &[u64], span: usize, want: u64) {
    let (before, during) = values.split_at(values.len().saturating_sub(span));
    assert!(
        before.iter().all(|v| *v == 0),
        "{name}: nothing before the mix: {values:?}"
    );
    assert_eq!(
        during.iter().sum::<u64>(),
        want,
        "{name}: the latest point{} hold the mix: {values:?}",
        if span == 1 { "" } else { "s" }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_charts_in_a_browser() {
    let (queue, exchange) = (unique("charts"), unique("in"));
    let (_, listen) = loopback();
    let client = Client::connect().await;
    client
        .exchange(&exchange, lapin::ExchangeKind::Topic, true)
        .await;
    let toml = sqlite_config_head(&listen)
        + &plugin_route("mixed", "fixture-mixed", "", &queue, &exchange)
        + "routing_key = \"#\"\n[routes.retry]\nmax_attempts = 3\nbackoff = [\"200ms\"]\n";
    let gw = gateway_on(&queue, &listen, &toml).await;
    let browser = Browser::start().await;
    let c = &browser.client;
    let base = format!("http://{listen}");

    // The known mix, published at the top of a minute.
    top_of_a_minute().await;
    let first = minute();
    for (prefix, body, n) in [
        ("ok", "ok", 3),
        ("retry", "retry-until-2", 2),
        ("dead", "remember", 3),
    ] {
        for i in 0..n {
            let props = json_props(&format!("{prefix}-{i}"));
            client.publish(&exchange, "k", props, body.as_bytes()).await;
        }
    }
    let want: BTreeMap<String, u64> = [
        ("acked", 5),
        ("duplicate", 0),
        ("retried", 2),
        ("dead_lettered", 3),
        ("requeued", 0),
        ("archived", 0),
    ]
    .into_iter()
    .map(|(name, n)| (name.to_owned(), n))
    .collect();

    // The routes page: one line of 60 points per outcome, the mix in the latest point.
    let section = format!("section.route-charts[data-route='{queue}']");
    let deliveries = format!("{section} figure[data-chart='deliveries']");
    let outcomes = wait_for("the routes page to chart the mix", WAIT, || async {
        c.goto(&format!("{base}/")).await.ok()?;
        let shown = lines(c, &format!("{deliveries} polyline")).await;
        (totals(&shown) == want).then_some(shown)
    })
    .await;
    let span = usize::try_from(minute() - first).expect("the clock went back") + 1;
    if span > 1 {
        eprintln!("the mix and the page took {span} minutes: checking their points together");
    }
    for (name, values) in &outcomes {
        assert_eq!(values.len(), MINUTES, "{name}: a point a minute");
        assert_latest(name, values, span, want[name]);
    }
    let svg = c
        .find(Locator::Css(&format!("{deliveries} svg")))
        .await
        .expect("the deliveries chart");
    assert_eq!(attr(&svg, "data-points").await, MINUTES.to_string());
    assert_eq!(
        attr(&svg, "data-max").await,
        "5",
        "the largest point labels the axis"
    );
    let title = c
        .find(Locator::Css(&format!("{deliveries} svg > title")))
        .await
        .expect("a title");
    let title = title
        .prop("textContent")
        .await
        .expect("text")
        .unwrap_or_default();
    assert!(title.contains("acked 5, duplicate 0, retried 2"), "{title}");
    // Coloured by the stylesheet (nothing inline): acked is green.
    let acked = c
        .find(Locator::Css(&format!(
            "{deliveries} polyline[data-series='acked']"
        )))
        .await
        .expect("the acked line");
    assert_eq!(
        acked.css_value("stroke").await.expect("stroke"),
        "rgb(47, 158, 68)"
    );
    let dead = lines(
        c,
        &format!("{section} figure[data-chart='dead-letters'] polyline"),
    )
    .await;
    assert_eq!(dead.keys().collect::<Vec<_>>(), ["handler"], "{dead:?}");
    assert_latest("handler", &dead["handler"], span, 3);
    Browser::screenshot(c, "routes-charts").await;

    // The dead-letters page: the group's last day, an hour a point, ending in 3.
    wait_for("the three dead letters archived", WAIT, || async {
        (count(&gw.store, &queue, "runs", None).await == 3).then_some(())
    })
    .await;
    c.goto(&format!("{base}/dead-letters?route={queue}"))
        .await
        .expect("dead-letters page");
    let groups = c.find_all(Locator::Css("tr.group")).await.expect("groups");
    assert_eq!(groups.len(), 1, "the route's one group");
    let reason = attr(&groups[0], "data-reason").await;
    assert!(reason.contains(GROUP), "{reason}");
    let count_cell = c
        .find(Locator::Css("tr.group [data-field=count]"))
        .await
        .expect("the group's count");
    assert_eq!(count_cell.text().await.expect("text").trim(), "3");
    let hours = lines(c, "tr.group polyline").await;
    let day = hours
        .get("dead-letters")
        .unwrap_or_else(|| panic!("no dead-letters line: {hours:?}"));
    assert_eq!(day.len(), HOURS, "a point an hour");
    assert_eq!(day.last(), Some(&3), "{day:?}");
    assert_eq!(day.iter().sum::<u64>(), 3, "{day:?}");
    Browser::screenshot(c, "dead-letter-charts").await;

    browser.close().await;
    gw.stop().await;
}
