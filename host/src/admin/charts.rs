//! What the console charts: on the routes page, each route's last hour a minute at a time
//! (deliveries by outcome, dead letters by reason class: `metrics::history`, kept in the
//! gateway); on the dead-letters page, each group's last day an hour at a time (from the
//! store: `Store::dead_letters_per_hour`). Drawn by `sparkline`.

use super::groups::normalise_reason;
use super::sparkline::{legend, sparkline};
use crate::metrics::{RouteHistory, Series};
use crate::store::{DeadLetterFilter, HOUR_MS, Store, StoreError};
use maud::{Markup, html};
use std::collections::HashMap;

/// Hours charted per dead-letter group: the last day.
pub const HOURS: usize = 24;
/// The routes page's charts, in pixels.
const ROUTE_WIDTH: u32 = 360;
const ROUTE_HEIGHT: u32 = 90;
/// A group's chart on the dead-letters page, in pixels.
const GROUP_WIDTH: u32 = 170;
const GROUP_HEIGHT: u32 = 36;

/// Each group's dead letters per hour over the last day, by (route, normalised reason).
#[derive(Debug, Default)]
pub struct GroupHours(HashMap<(String, String), Vec<u64>>);

/// The counts of a group with no dead letters in the day.
static NO_HOURS: [u64; HOURS] = [0; HOURS];

impl GroupHours {
    /// One query over the last day's dead letters of `route` (every route: `None`), the hour
    /// up to `now_ms` last, grouped as the dead-letters page groups them.
    pub async fn read(store: &Store, route: Option<&str>, now_ms: i64) -> Result<Self, StoreError> {
        let filter = DeadLetterFilter {
            route: route.map(str::to_owned),
            ..Default::default()
        };
        // Hours end at now (included): the last one is the past 60 minutes.
        let since = now_ms + 1 - HOURS as i64 * HOUR_MS;
        let rows = store
            .dead_letters_per_hour(&filter, since, HOURS as u32)
            .await?;
        let mut out: HashMap<(String, String), Vec<u64>> = HashMap::new();
        for row in rows {
            let (Ok(hour), Ok(count)) = (usize::try_from(row.hour), u64::try_from(row.count))
            else {
                continue;
            };
            if hour >= HOURS {
                continue;
            }
            let key = (row.route, normalise_reason(&row.reason));
            out.entry(key).or_insert_with(|| vec![0; HOURS])[hour] += count;
        }
        Ok(Self(out))
    }

    /// The group's [`HOURS`] counts, oldest first (zeros when it had none in the day).
    pub fn of(&self, route: &str, reason: &str) -> &[u64] {
        self.0
            .get(&(route.to_owned(), reason.to_owned()))
            .map_or(&NO_HOURS[..], Vec::as_slice)
    }
}

/// A group's chart: its dead letters per hour over the last day (`None`: the store did not
/// answer).
pub fn group_chart(hours: Option<&[u64]>) -> Markup {
    let Some(counts) = hours else {
        return html! { span.muted title="The store did not answer" { "?" } };
    };
    sparkline(
        "Dead letters per hour over the last day",
        &[("dead-letters", counts)],
        GROUP_WIDTH,
        GROUP_HEIGHT,
    )
}

/// A route's charts: its last hour, one point a minute.
pub fn route_charts(route: &str, history: &RouteHistory) -> Markup {
    let outcomes = pairs(&history.outcomes);
    let dead_letters = pairs(&history.dead_letters);
    html! {
        section.route-charts data-route=(route) {
            h3 { (route) }
            div.charts {
                figure data-chart="deliveries" {
                    figcaption { "Deliveries per minute, by outcome" }
                    (sparkline("Deliveries per minute over the last hour, by outcome", &outcomes, ROUTE_WIDTH, ROUTE_HEIGHT))
                    (legend(&outcomes))
                }
                figure data-chart="dead-letters" {
                    figcaption { "Dead letters per minute, by reason class" }
                    (sparkline("Dead letters per minute over the last hour, by reason class", &dead_letters, ROUTE_WIDTH, ROUTE_HEIGHT))
                    @if dead_letters.is_empty() {
                        p.muted.legend { "None in the last hour." }
                    } @else {
                        (legend(&dead_letters))
                    }
                }
            }
        }
    }
}

/// Series as the (name, counts) pairs `sparkline` takes.
fn pairs(series: &[Series]) -> Vec<(&str, &[u64])> {
    series
        .iter()
        .map(|s| (s.name, s.counts.as_slice()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::labels::Outcome;
    use crate::metrics::{DeliveryHistory, MINUTES};

    #[test]
    fn a_route_has_a_line_of_60_points_per_outcome_and_per_dead_letter_class() {
        let history = DeliveryHistory::default();
        let now = 1_767_261_600_000;
        for _ in 0..5 {
            history.delivery("q", Outcome::Acked, now);
        }
        history.dead_letter("q", crate::common::labels::ReasonClass::Handler, now);
        let html = route_charts("q", &history.last_hour("q", now)).into_string();
        assert_eq!(
            html.matches("<polyline").count(),
            Outcome::ALL.len() + 1,
            "{html}"
        );
        let points = format!("data-points=\"{MINUTES}\"");
        assert_eq!(html.matches(&points).count(), 2 + Outcome::ALL.len() + 1);
        let acked = format!("data-series=\"acked\" data-points=\"{MINUTES}\" data-values=\"");
        assert!(
            html.contains(&format!("{acked}{}5\"", "0,".repeat(59))),
            "{html}"
        );
        assert!(html.contains("data-series=\"handler\""), "{html}");
        assert!(!html.contains("None in the last hour"));

        let quiet = route_charts("q", &history.last_hour("other", now)).into_string();
        assert!(quiet.contains("None in the last hour"), "{quiet}");
    }

    #[test]
    fn a_group_chart_has_24_points_or_says_it_does_not_know() {
        let mut hours = vec![0; HOURS];
        hours[HOURS - 1] = 3;
        let html = group_chart(Some(hours.as_slice())).into_string();
        assert!(
            html.contains("data-series=\"dead-letters\" data-points=\"24\""),
            "{html}"
        );
        let values = format!("data-values=\"{}3\"", "0,".repeat(23));
        assert!(html.contains(&values), "{html}");
        let quiet = GroupHours::default();
        assert_eq!(quiet.of("q", "a reason"), [0; HOURS]);
        let html = group_chart(Some(quiet.of("q", "a reason"))).into_string();
        assert!(html.contains("data-points=\"24\""), "{html}");
        assert!(group_chart(None).into_string().contains('?'));
    }
}
