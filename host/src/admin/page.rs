//! The console's page shell (header, banners, main) and small formatting helpers. Every
//! value is escaped by maud. The stylesheet and script are files of their own
//! (`/console.css`, `/console.js`): the CSP (`origin::CSP`) allows nothing inline.

use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

/// The console's stylesheet and script (ours, constant).
pub const CSS: &str = include_str!("assets/console.css");
pub const JS: &str = include_str!("assets/console.js");

/// A whole page: `title`, the banners (`super::banners`), then `body`.
pub fn page(title: &str, banners: &[String], body: Markup) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Carteiro" }
                link rel="stylesheet" href="/console.css";
            }
            body {
                header {
                    a.brand href="/" { "Carteiro" }
                    a href="/" { "Routes" }
                    a href="/dead-letters" { "Dead letters" }
                    a href="/jobs" { "Jobs" }
                    a href="/login" { "Log in" }
                }
                main {
                    // Banners (dead-letter alerts and the like) go first on every page.
                    div #banners {
                        @for b in banners { div.banner role="alert" { (b) } }
                    }
                    h1 { (title) }
                    (body)
                }
                script src="/console.js" {}
            }
        }
    };
    Html(markup.into_string()).into_response()
}

/// A page with an error status.
pub fn error_page(status: StatusCode, banners: &[String], message: &str) -> Response {
    let mut response = page(
        status.canonical_reason().unwrap_or("Error"),
        banners,
        html! { div.error { (message) } p { a href="/" data-back { "Back" } } },
    );
    *response.status_mut() = status;
    response
}

/// `303 See Other` to `to` (after a form post).
pub fn see_other(to: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to.to_owned())]).into_response()
}

pub use crate::common::rfc3339 as time;

/// `12s`, `3m 4s`: a duration in ms for people.
pub fn age(ms: i64) -> String {
    let secs = u64::try_from(ms / 1000).unwrap_or(0);
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

/// A retry tier's delay for people: `250ms`, `1s 500ms`, `5m` (whole seconds would show a
/// tier under a second as `0s`).
pub fn delay(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

/// A duration in words where humantime writes a word unit: `1 day`, `2 days 3h`, `1 month`.
pub fn spelled(d: std::time::Duration) -> String {
    let text = humantime::format_duration(d).to_string();
    ["day", "week", "month", "year"]
        .iter()
        .fold(text, |t, unit| t.replace(unit, &format!(" {unit}")))
}

/// A query string from pairs (`a=1&b=x%20y`).
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

/// A url-encoded form body or query, with repeated fields kept.
pub struct Fields(Vec<(String, String)>);

impl Fields {
    pub fn parse(text: &str) -> Self {
        Self(
            form_urlencoded::parse(text.as_bytes())
                .into_owned()
                .collect(),
        )
    }

    /// The first value of `name`, if non-empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, v)| k == name && !v.trim().is_empty())
            .map(|(_, v)| v.trim())
    }

    /// Every value of `name`.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_keep_repeats_and_decode() {
        let f = Fields::parse("id=1&id=22&route=a%20b&reason=x%26y&empty=");
        assert_eq!(f.all("id"), ["1", "22"]);
        assert_eq!(f.get("route"), Some("a b"));
        assert_eq!(f.get("reason"), Some("x&y"));
        assert_eq!(f.get("empty"), None);
        assert_eq!(query(&[("reason", "a&b `c`")]), "reason=a%26b+%60c%60");
    }
}
