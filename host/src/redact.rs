//! One redaction for every URL that may carry a password (the broker's and the store's), and
//! a scrub for error texts that may quote one.
//!
//! It works on text, not a parsed URL, so that a URL no parser accepts can still be shown,
//! and it prefers hiding too much to hiding too little. Two places can hold a password:
//! - the userinfo, `scheme://user:PASSWORD@host`: the credentials end at the *last* `@`, so a
//!   password with a raw `@`, `/`, `?` or `#` is hidden whole (at worst some of the host or
//!   path is hidden with it);
//! - a query parameter whose name contains `pass`, `pwd`, `secret` or `token`
//!   (`?password=...`, `sslpassword=`): everything from its value to the end of the URL is
//!   hidden, so a raw `&` or `#` inside the value cannot leak its tail.

/// `url` with every password replaced by `***`, e.g. `amqp://user:***@host:5672/vhost`.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    let mut at = 0;
    for (start, end) in secret_ranges(rest) {
        out.push_str(&rest[at..start]);
        out.push_str("***");
        at = end;
    }
    out.push_str(&rest[at..]);
    out
}

/// `text` (an error message) with `url` shown redacted and every string that may be a
/// password of `url`, raw and percent-decoded, replaced by `***`.
pub fn scrub(text: &str, url: &str) -> String {
    let mut out = text.replace(url, &redact_url(url));
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let mut candidates = password_candidates(rest);
    candidates.extend(candidates.clone().iter().map(|c| percent_decode(c)));
    // Longest first, so a password is replaced whole before any shorter candidate inside it.
    candidates.sort_by_key(|c| std::cmp::Reverse(c.len()));
    for secret in candidates {
        if !secret.is_empty() {
            out = out.replace(&secret, "***");
        }
    }
    out
}

/// Every string of `rest` that may be the password as a client sees it: the userinfo from
/// its first `:` to each later `@`, and a secret parameter's value to each later `&` or
/// `#` and to the end.
fn password_candidates(rest: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(last_at) = rest.rfind('@')
        && let Some(colon) = rest[..last_at].find(':')
    {
        for (at, _) in rest.match_indices('@').filter(|(at, _)| *at > colon) {
            out.push(rest[colon + 1..at].to_owned());
        }
    }
    if let Some(value) = first_secret_param(rest) {
        for (end, _) in rest[value..].match_indices(['&', '#']) {
            out.push(rest[value..value + end].to_owned());
        }
        out.push(rest[value..].to_owned());
    }
    out
}

/// Byte ranges of `rest` (the URL after `scheme://`) that may hold a password, sorted and
/// merged.
fn secret_ranges(rest: &str) -> Vec<(usize, usize)> {
    let mut ranges = Vec::new();
    if let Some(last_at) = rest.rfind('@')
        && let Some(colon) = rest[..last_at].find(':')
    {
        ranges.push((colon + 1, last_at));
    }
    if let Some(value) = first_secret_param(rest) {
        ranges.push((value, rest.len()));
    }
    ranges.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Where the value of the first secret-looking query parameter starts.
fn first_secret_param(rest: &str) -> Option<usize> {
    let bytes = rest.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b != b'?' && b != b'&' {
            continue;
        }
        let name_start = i + 1;
        let Some(eq) = rest[name_start..].find('=').map(|e| name_start + e) else {
            continue;
        };
        let name = rest[name_start..eq].to_ascii_lowercase();
        if name.contains(['&', '?']) {
            continue;
        }
        if ["pass", "pwd", "secret", "token"]
            .iter()
            .any(|s| name.contains(s))
        {
            return Some(eq + 1);
        }
    }
    None
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_the_password_and_keeps_the_rest() {
        let cases = [
            (
                "amqp://guest:s3cret@127.0.0.1:5673/%2f",
                "amqp://guest:***@127.0.0.1:5673/%2f",
            ),
            (
                "amqps://u:p%40ss@host/vh?heartbeat=5",
                "amqps://u:***@host/vh?heartbeat=5",
            ),
            ("amqp://u:pa@ss/w@rd@host:1/v", "amqp://u:***@host:1/v"),
            ("amqp://host:5672/%2f", "amqp://host:5672/%2f"),
            ("amqp://user@host/v", "amqp://user@host/v"),
            ("amqp://u:p@[::1]:5672/%2f", "amqp://u:***@[::1]:5672/%2f"),
            ("u:topsecret@host", "u:***@host"),
            (
                "postgres://app:s3cr%40t@db:5432/carteiro?sslmode=require&password=x",
                "postgres://app:***@db:5432/carteiro?sslmode=require&password=***",
            ),
            ("postgres://app@db/c", "postgres://app@db/c"),
            (
                "postgres://app@db/c?sslmode=disable&application_name=x",
                "postgres://app@db/c?sslmode=disable&application_name=x",
            ),
            ("sqlite://data/carteiro.db", "sqlite://data/carteiro.db"),
            ("sqlite://data/c.db?mode=rwc", "sqlite://data/c.db?mode=rwc"),
            (
                "postgres://db/c?user=app&sslpassword=k3y&sslmode=require",
                "postgres://db/c?user=app&sslpassword=***",
            ),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "redacting {url}");
        }
    }

    /// Passwords with every character that ends a URL part somewhere, raw, in both places.
    #[test]
    fn never_leaks_any_part_of_a_nasty_password() {
        // Upper-case letters appear nowhere else in these URLs, so any of them in the output
        // is a leak.
        let nasty = [
            "QZ/JX",
            "QZ?JX",
            "QZ@JX",
            "QZ#JX",
            "QZ:JX:WV",
            "QZ@JX/WV?KY#VB",
            "/?@#QZ",
            "QZ%2FJX",
            "QZ&x=JX",
            "@@@QZ",
            "QZ JX",
            "QZÄJX",
            "QZ#JX@WV/KY?VB",
            "QZ&password=JX",
        ];
        for password in nasty {
            let urls = [
                format!("postgres://app:{password}@db.internal:5432/carteiro"),
                format!("postgres://app:{password}@db/carteiro?sslmode=require"),
                format!("amqp://guest:{password}@rabbit:5672/%2f"),
                format!("amqps://guest:{password}@rabbit/vh?heartbeat=5"),
                format!("postgres://app@db/c?password={password}"),
                format!("postgres://app@db/c?sslmode=require&password={password}&x=1"),
                format!("postgres://app@db:5432/c?pAssword={password}"),
                format!("postgres://app:{password}@db/c?password={password}"),
            ];
            for url in urls {
                let shown = redact_url(&url);
                for fragment in fragments(password) {
                    assert!(
                        !shown.contains(&fragment),
                        "{fragment:?} of password {password:?} leaked: {url} -> {shown}"
                    );
                }
                assert!(shown.contains("***"), "{url} -> {shown}");
                let error = format!("cannot connect to {url}: bad password {password}");
                let scrubbed = scrub(&error, &url);
                for fragment in fragments(password) {
                    assert!(
                        !scrubbed.contains(&fragment),
                        "{fragment:?} leaked from an error text: {scrubbed}"
                    );
                }
            }
        }
    }

    /// The parts of a password that must not show: its upper-case letters (the URLs' own
    /// text is lower-case).
    fn fragments(password: &str) -> Vec<String> {
        password
            .chars()
            .filter(char::is_ascii_uppercase)
            .map(String::from)
            .collect()
    }

    #[test]
    fn scrub_hides_decoded_passwords_too() {
        let url = "amqp://u:p%40ss@host/v";
        assert_eq!(
            scrub(
                "login for u with p@ss refused at amqp://u:p%40ss@host/v",
                url
            ),
            "login for u with *** refused at amqp://u:***@host/v"
        );
    }
}
