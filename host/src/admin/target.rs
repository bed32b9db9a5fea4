//! What a console action or a JSON action applies to: a group (route and normalised
//! reason), a selection of ids on a route, or a whole route; resolved into the store filter
//! the replay engine, shadow runs and purge all use.

use super::page::query;
use super::{Refusal, groups};
use crate::store::{DeadLetterFilter, Store};
use axum::http::StatusCode;

/// A route, and a group of it or some of its ids.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct Target {
    /// The route (work queue).
    pub route: String,
    /// A group: the normalised reason, as the groups page shows it.
    pub reason: Option<String>,
    /// A selection: these ids (of `route`).
    #[serde(default)]
    pub ids: Vec<i64>,
}

/// A target as a store filter, with words for people.
pub struct Resolved {
    pub filter: DeadLetterFilter,
    /// `route orders, group "timeout after <n>s"`.
    pub title: String,
    /// The page to go back to.
    pub back: String,
}

impl Target {
    pub async fn resolve(&self, store: &Store) -> Result<Resolved, Refusal> {
        if self.route.is_empty() {
            return Err(Refusal::new(StatusCode::BAD_REQUEST, "a route is required"));
        }
        let route_page = format!("/dead-letters?{}", query(&[("route", &self.route)]));
        if !self.ids.is_empty() {
            return Ok(Resolved {
                filter: DeadLetterFilter {
                    route: Some(self.route.clone()),
                    ids: Some(self.ids.clone()),
                    ..Default::default()
                },
                title: format!("route {}: {} selected", self.route, self.ids.len()),
                back: self
                    .reason
                    .as_deref()
                    .map_or(route_page, |reason| group_url(&self.route, reason)),
            });
        }
        let Some(reason) = &self.reason else {
            return Ok(Resolved {
                filter: DeadLetterFilter {
                    route: Some(self.route.clone()),
                    ..Default::default()
                },
                title: format!("route {}: every dead letter", self.route),
                back: route_page,
            });
        };
        let group = groups::find(store, &self.route, reason)
            .await
            .map_err(|e| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?
            .ok_or_else(|| {
                Refusal::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "route {} has no dead letters in group \"{reason}\"",
                        self.route
                    ),
                )
            })?;
        Ok(Resolved {
            filter: group.filter(),
            title: format!("route {}, group \"{reason}\"", self.route),
            back: group_url(&self.route, reason),
        })
    }
}

/// The page of group `reason` of `route`.
pub fn group_url(route: &str, reason: &str) -> String {
    format!(
        "/dead-letters/group?{}",
        query(&[("route", route), ("reason", reason)])
    )
}
