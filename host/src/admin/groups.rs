//! Dead letters grouped by route and normalised reason: the numbers, hex ids, UUIDs and
//! quoted values of a reason are stripped, so `missing field `a` at line 1 column 7` and
//! `missing field `b` at line 3 column 2` are one group. A group is selected in the store
//! by the exact reasons that normalise to it, so the replay engine and purge see exactly
//! the group's rows.

use crate::store::{DeadLetterFilter, DeadLetterStat, Store, StoreError};
use std::collections::BTreeMap;

/// One group of dead letters.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Group {
    /// Route (work queue).
    pub route: String,
    /// The normalised reason: the group's name.
    pub reason: String,
    /// One of the reasons as stored (the most frequent).
    pub example: String,
    /// Dead letters in the group.
    pub count: i64,
    /// Not replayed yet.
    pub unreplayed: i64,
    /// Oldest and newest `dead_lettered_at` (unix ms).
    pub first_at: i64,
    pub last_at: i64,
    /// The exact reasons in the group.
    #[serde(skip)]
    pub reasons: Vec<String>,
}

impl Group {
    /// The store filter for this group's rows (as the store holds them now).
    pub fn filter(&self) -> DeadLetterFilter {
        DeadLetterFilter {
            route: Some(self.route.clone()),
            reasons: Some(self.reasons.clone()),
            ..Default::default()
        }
    }
}

/// Every group (of `route`, when given), largest first.
pub async fn groups(store: &Store, route: Option<&str>) -> Result<Vec<Group>, StoreError> {
    let filter = DeadLetterFilter {
        route: route.map(str::to_owned),
        ..Default::default()
    };
    Ok(merge(store.dead_letter_groups(&filter).await?))
}

/// The group `reason` (normalised) of `route`, if it has dead letters.
pub async fn find(store: &Store, route: &str, reason: &str) -> Result<Option<Group>, StoreError> {
    Ok(groups(store, Some(route))
        .await?
        .into_iter()
        .find(|g| g.reason == reason))
}

/// Merges per-(route, exact reason) counts into groups, largest first.
pub fn merge(stats: Vec<DeadLetterStat>) -> Vec<Group> {
    let mut by_key: BTreeMap<(String, String), Group> = BTreeMap::new();
    // `stats` come largest first, so the first reason seen is the group's example.
    for s in stats {
        let key = (s.route.clone(), normalise_reason(&s.reason));
        let group = by_key.entry(key.clone()).or_insert_with(|| Group {
            route: key.0,
            reason: key.1,
            example: s.reason.clone(),
            count: 0,
            unreplayed: 0,
            first_at: s.first_at,
            last_at: s.last_at,
            reasons: Vec::new(),
        });
        group.count += s.count;
        group.unreplayed += s.unreplayed;
        group.first_at = group.first_at.min(s.first_at);
        group.last_at = group.last_at.max(s.last_at);
        group.reasons.push(s.reason);
    }
    let mut out: Vec<Group> = by_key.into_values().collect();
    out.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.route.cmp(&b.route))
            .then_with(|| a.reason.cmp(&b.reason))
    });
    out
}

/// A reason without its variable parts: UUIDs become `<uuid>`, hex ids (8+ hex digits with
/// a digit among them, or `0x...`) `<hex>`, numbers `<n>`, quoted values (`` `x` ``, `"x"`,
/// `'x'`) keep their quotes around `…`; runs of whitespace become one space.
pub fn normalise_reason(reason: &str) -> String {
    let chars: Vec<char> = reason.chars().collect();
    let mut out = String::with_capacity(reason.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let at_word_start = i == 0 || !is_word(chars[i - 1]);
        if at_word_start && let Some(end) = uuid_end(&chars, i) {
            out.push_str("<uuid>");
            i = end;
        } else if at_word_start && let Some(end) = hex_end(&chars, i) {
            out.push_str("<hex>");
            i = end;
        } else if at_word_start && c.is_ascii_digit() {
            i = number_end(&chars, i);
            out.push_str("<n>");
        } else if let Some(end) = quoted_end(&chars, i, at_word_start) {
            out.push(c);
            out.push('…');
            out.push(c);
            i = end;
        } else if c.is_whitespace() {
            while i < chars.len() && chars[i].is_whitespace() {
                i += 1;
            }
            if !out.is_empty() && i < chars.len() {
                out.push(' ');
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// End of a UUID (8-4-4-4-12 hex digits) starting at `i`, not followed by a word char.
fn uuid_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    for (n, len) in [8, 4, 4, 4, 12].into_iter().enumerate() {
        if n > 0 {
            if chars.get(j) != Some(&'-') {
                return None;
            }
            j += 1;
        }
        for _ in 0..len {
            if !chars.get(j)?.is_ascii_hexdigit() {
                return None;
            }
            j += 1;
        }
    }
    (!chars.get(j).is_some_and(|c| is_word(*c))).then_some(j)
}

/// End of a hex id at `i`: `0x` and hex digits, or 8+ hex digits with a decimal digit and a
/// letter among them (all digits is a number), not followed by a word char.
fn hex_end(chars: &[char], i: usize) -> Option<usize> {
    let run = |from: usize| {
        let mut j = from;
        while chars.get(j).is_some_and(char::is_ascii_hexdigit) {
            j += 1;
        }
        j
    };
    let end = if chars.get(i) == Some(&'0')
        && matches!(chars.get(i + 1), Some('x' | 'X'))
        && chars.get(i + 2).is_some_and(char::is_ascii_hexdigit)
    {
        run(i + 2)
    } else {
        let end = run(i);
        let digits = &chars[i..end];
        let mixed = digits.iter().any(char::is_ascii_digit)
            && digits.iter().any(|c| c.is_ascii_alphabetic());
        if end - i < 8 || !mixed {
            return None;
        }
        end
    };
    (!chars.get(end).is_some_and(|c| is_word(*c))).then_some(end)
}

/// End of a number at `i` (digits, then an optional fraction).
fn number_end(chars: &[char], i: usize) -> usize {
    let digits = |mut j: usize| {
        while chars.get(j).is_some_and(char::is_ascii_digit) {
            j += 1;
        }
        j
    };
    let end = digits(i);
    if chars.get(end) == Some(&'.') && chars.get(end + 1).is_some_and(char::is_ascii_digit) {
        digits(end + 1)
    } else {
        end
    }
}

/// End (after the closing quote) of a quoted value opening at `i`. A `'` opens only at a
/// word start and closes only before a non-word char, so "can't" is not a quote.
fn quoted_end(chars: &[char], i: usize, at_word_start: bool) -> Option<usize> {
    let quote = chars[i];
    if !matches!(quote, '`' | '"' | '\'') || (quote == '\'' && !at_word_start) {
        return None;
    }
    let mut j = i + 1;
    while j < chars.len() {
        if chars[j] == '\\' {
            j += 2;
            continue;
        }
        if chars[j] == quote {
            let closes = quote != '\'' || !chars.get(j + 1).is_some_and(|c| is_word(*c));
            if closes {
                return Some(j + 1);
            }
        }
        j += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_ids_and_quotes_are_stripped() {
        assert_eq!(
            normalise_reason("missing field `email` at line 1 column 17"),
            "missing field `…` at line <n> column <n>"
        );
        assert_eq!(
            normalise_reason("missing field `name` at line 12 column 3"),
            normalise_reason("missing field `email` at line 1 column 17"),
        );
        assert_eq!(
            normalise_reason("order 0193a4f2-7b1c-7d3e-9f00-1234567890ab not found"),
            "order <uuid> not found"
        );
        assert_eq!(
            normalise_reason("digest 9f86d081884c7d659a2feaa0c55ad015 mismatch at 0x1F"),
            "digest <hex> mismatch at <hex>"
        );
        assert_eq!(normalise_reason("runs 1 1"), "runs <n> <n>");
        assert_eq!(
            normalise_reason("timeout after 2.5s (limit 2000ms)"),
            "timeout after <n>s (limit <n>ms)"
        );
        assert_eq!(
            normalise_reason(r#"user "bob" said 'hi' to id=42"#),
            r#"user "…" said '…' to id=<n>"#
        );
    }

    #[test]
    fn words_with_digits_and_apostrophes_stay() {
        assert_eq!(
            normalise_reason("can't parse utf8 sha256"),
            "can't parse utf8 sha256"
        );
        assert_eq!(normalise_reason("e2e v2 http2"), "e2e v2 http2");
        assert_eq!(
            normalise_reason("deadbeefcafe"),
            "deadbeefcafe",
            "no digit: a word"
        );
        assert_eq!(normalise_reason("  spaced \t out \n "), "spaced out");
        assert_eq!(
            normalise_reason("unclosed `quote here"),
            "unclosed `quote here"
        );
        assert_eq!(normalise_reason(""), "");
    }

    #[test]
    fn hostile_text_is_normalised_without_panics() {
        for text in [
            "`",
            "'",
            "\"\\",
            "0x",
            "\u{0}\u{0}",
            "1.",
            "-1",
            "ß1ß",
            "𝄞 9 `x",
        ] {
            let _ = normalise_reason(text);
        }
        assert_eq!(
            normalise_reason("<script>1</script>"),
            "<script><n></script>"
        );
    }

    #[test]
    fn groups_merge_variants_largest_first() {
        let stat = |route: &str, reason: &str, count, at| DeadLetterStat {
            route: route.into(),
            reason: reason.into(),
            count,
            unreplayed: count - 1,
            first_at: at,
            last_at: at + 5,
        };
        let groups = merge(vec![
            stat("q", "missing field `a` at line 1", 5, 100),
            stat("q", "plugin trapped", 4, 50),
            stat("q", "missing field `b` at line 9", 3, 10),
            stat("other", "missing field `a` at line 1", 1, 0),
        ]);
        let summary: Vec<(&str, &str, i64, i64)> = groups
            .iter()
            .map(|g| (g.route.as_str(), g.reason.as_str(), g.count, g.unreplayed))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("q", "missing field `…` at line <n>", 8, 6),
                ("q", "plugin trapped", 4, 3),
                ("other", "missing field `…` at line <n>", 1, 0),
            ]
        );
        assert_eq!((groups[0].first_at, groups[0].last_at), (10, 105));
        assert_eq!(groups[0].example, "missing field `a` at line 1");
        assert_eq!(groups[0].reasons.len(), 2);
    }
}
