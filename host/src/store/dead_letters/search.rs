//! What makes a dead letter findable without reading the archive (migration 0011): its
//! message id and correlation id (the `:message-id` and `:correlation-id` properties it was
//! archived with) in indexed columns, and the scalar fields of a JSON body, each as a
//! canonical path and value ([`BodyField`]). All of it is worked out here, once, when the dead
//! letter is archived (`Store::dead_letter_insert`); a search is then one indexed equality.
//!
//! Which fields of a body are kept, so an archive costs a bounded amount whatever it holds:
//! - only a body that is a JSON object (its first non-blank byte `{`) of at most
//!   [`MAX_INDEXED_BODY`] bytes; any other body (text, binary, an array, invalid JSON) has none;
//! - its scalar leaves reached through objects, breadth first (the top-level fields, then one
//!   level down, ...; keys in byte order within an object), at most [`MAX_FIELDS`] of them;
//!   arrays and what is inside them are skipped;
//! - a field whose path or value is over [`MAX_FIELD_BYTES`] is skipped (never cut: a cut value
//!   would match what it is not).
//!
//! Canonical forms, so the search and the archive agree however the JSON was written:
//! - a path is its keys joined by `.`, each key as it is when made of ASCII letters, digits,
//!   `_` and `-`, and otherwise as a JSON string (`a.b` is `{"a": {"b": ..}}`, `"a.b"` is
//!   `{"a.b": ..}`): two different key paths never read alike;
//! - a value is its JSON text: `"late"` (a string, quoted), `true`, `false`, `null`, and a number
//!   in one spelling: an integral number below 2^53 as an integer (`123`, `123.0` and `1.23e2`
//!   are all `123`), any other as the shortest text that reads back as the same `f64`. A string
//!   `"123"` is not the number `123`.
//!
//! Stored alike on both backends (the choice is explained in `docs/dead-letters.md`, "Search"):
//! one row per field in `dead_letter_fields (path, value, dead_letter_id)`, whose primary key
//! is the index a search reads, newest first (SQLite: a `WITHOUT ROWID` table, a trigger
//! deletes a dead letter's fields with it; PostgreSQL: migration 0013, a foreign key with
//! `ON DELETE CASCADE`). A B-tree, rather than a GIN index, because a search must be able to
//! stop after a bounded number of entries (`dead_letters::search_page`).
//!
//! [`SearchTerms`] are a filter's terms answered from these indexes; the SQL that reads them
//! (which table a filter starts from, and its conditions) is built here too, so that the
//! plan a search gets is decided in one place (`store::tests::search` checks it).

use std::collections::VecDeque;

use serde_json::{Map, Value};

use super::text::{NewDeadLetter, SHORT_MAX, stand_in};
use crate::common::header_names::{PROP_CORRELATION_ID, PROP_MESSAGE_ID, SEARCH_FIELDS};
use crate::store::{Dialect, IndexWalk};

/// At most this many fields of one body are kept.
pub const MAX_FIELDS: usize = 64;
/// A field whose canonical path or value is longer (bytes) is not kept.
pub const MAX_FIELD_BYTES: usize = 256;
/// A body longer than this (bytes) is not parsed for fields.
pub const MAX_INDEXED_BODY: usize = 1 << 20;

/// Integers up to this magnitude are exact in an `f64`; such a float reads as the integer.
const EXACT_INTEGER: f64 = 9_007_199_254_740_992.0; // 2^53

/// One scalar field of a JSON body, in canonical form (module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BodyField {
    /// The keys from the top of the body, joined by `.` (`endereco.cidade`).
    pub path: String,
    /// The value's JSON text (`123`, `"late"`, `true`, `null`).
    pub value: String,
}

impl BodyField {
    /// The field at the keys `segments` holding `value`; `None` when `value` is an array or an
    /// object (only scalars are kept) or the path or value is over [`MAX_FIELD_BYTES`].
    pub fn new<S: AsRef<str>>(segments: &[S], value: &Value) -> Option<BodyField> {
        let mut path = String::new();
        for segment in segments {
            push_segment(&mut path, segment.as_ref());
        }
        let value = field_value(value)?;
        (!path.is_empty() && path.len() <= MAX_FIELD_BYTES).then_some(BodyField { path, value })
    }
}

/// `path` with one more key, in canonical form.
fn push_segment(path: &mut String, key: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        path.push_str(key);
    } else {
        path.push_str(&Value::from(key).to_string());
    }
}

/// A scalar's canonical JSON text; `None` for arrays, objects, and text over
/// [`MAX_FIELD_BYTES`].
pub fn field_value(value: &Value) -> Option<String> {
    let text = match value {
        Value::Array(_) | Value::Object(_) => return None,
        Value::Number(n) => number_text(n),
        scalar => scalar.to_string(),
    };
    (text.len() <= MAX_FIELD_BYTES).then_some(text)
}

/// One spelling per number: integral values below 2^53 as integers, others as the shortest
/// text of their `f64`.
fn number_text(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    match n.as_f64() {
        Some(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < EXACT_INTEGER => {
            (f as i64).to_string()
        }
        Some(f) => serde_json::Number::from_f64(f).map_or_else(|| n.to_string(), |f| f.to_string()),
        None => n.to_string(),
    }
}

/// The fields of `body` that are kept (module docs): none unless it is a JSON object.
pub fn body_fields(body: &[u8]) -> Vec<BodyField> {
    let mut fields = Vec::new();
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if body.len() > MAX_INDEXED_BODY || first != Some(&b'{') {
        return fields;
    }
    let Ok(Value::Object(root)) = serde_json::from_slice::<Value>(body) else {
        return fields;
    };
    let mut objects: VecDeque<(String, &Map<String, Value>)> = VecDeque::new();
    objects.push_back((String::new(), &root));
    while let Some((prefix, object)) = objects.pop_front() {
        for (key, value) in object {
            let mut path = prefix.clone();
            push_segment(&mut path, key);
            if path.len() > MAX_FIELD_BYTES {
                continue;
            }
            match value {
                Value::Object(inner) => objects.push_back((path, inner)),
                Value::Array(_) => {}
                scalar => {
                    if let Some(value) = field_value(scalar) {
                        fields.push(BodyField { path, value });
                        if fields.len() == MAX_FIELDS {
                            return fields;
                        }
                    }
                }
            }
        }
    }
    fields
}

/// The terms of a dead-letter filter that the search indexes answer (migration 0011); each
/// narrows the set. Built from a query by `dlq::search`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchTerms {
    /// The message id (the AMQP `message_id` property) is exactly this.
    pub message_id: Option<String>,
    /// The correlation id is exactly this.
    pub correlation_id: Option<String>,
    /// The body has every one of these fields with exactly this value.
    pub body: Vec<BodyField>,
}

impl SearchTerms {
    /// No term: the filter reads `dead_letters` as before.
    pub fn is_empty(&self) -> bool {
        self.message_id.is_none() && self.correlation_id.is_none() && self.body.is_empty()
    }

    /// What a filter's query reads (its `FROM` clause), from after `FROM` up to and including
    /// its first `WHERE` condition; `bind` binds a text and answers its placeholder number.
    ///
    /// A body field drives the query from `dead_letter_fields`' primary key, each dead letter
    /// then read by its id: newest first that is the key range read backwards, so a page
    /// reads what it shows and a search page's window (`dead_letters::search_page`) bounds it.
    /// The plan is spelled out where a planner could walk the archive instead: each dead
    /// letter is a lookup by id (`Dialect::lookup_join`: SQLite's `CROSS JOIN` keeps the
    /// fields' table outside, PostgreSQL's `LATERAL` lookup is never a merge join that would
    /// read every id between the window's ends), and a message or correlation id reads its
    /// own index where the planner takes hints (SQLite: no statistics to go by, and a route's
    /// index looks as good to it as an id's).
    pub(super) fn tables_clause(
        &self,
        dialect: &dyn Dialect,
        bind: &mut dyn FnMut(String) -> usize,
    ) -> String {
        if let Some(first) = self.body.first() {
            let path = bind(first.path.clone());
            let value = bind(first.value.clone());
            let join = dialect.lookup_join("dead_letters", "f.dead_letter_id");
            return format!(
                "dead_letter_fields f {join} WHERE f.path = ${path} AND f.value = ${value}"
            );
        }
        let index = if self.message_id.is_some() {
            dialect.index_hint("dead_letters_message_id")
        } else if self.correlation_id.is_some() {
            dialect.index_hint("dead_letters_correlation_id")
        } else {
            String::new()
        };
        format!("dead_letters{index} WHERE 1 = 1")
    }

    /// The column a filter's ids are ordered and bounded by: when a body field drives the
    /// query, the field's own `dead_letter_id` (the last column of the primary key read, so a
    /// newest-first page is read in index order, from where the last one ended).
    pub(super) fn id_column(&self) -> &'static str {
        if self.body.is_empty() {
            "id"
        } else {
            "f.dead_letter_id"
        }
    }

    /// The walk a search page is bounded by: the ids of the first `cap` entries, newest first,
    /// of the index the search is driven by (its first body field's key range, else its message
    /// id's or correlation id's index), below `before` and above `after`, as `hit`: `SELECT hit
    /// FROM ... LIMIT cap` (`Dialect::index_walk`). `None` without a term. `bind` binds a text
    /// and answers its placeholder number.
    pub(super) fn walk_sql(
        &self,
        dialect: &dyn Dialect,
        (before, after): (Option<i64>, Option<i64>),
        cap: i64,
        bind: &mut dyn FnMut(String) -> usize,
    ) -> Option<String> {
        let (table, index, keys, id) = if let Some(first) = self.body.first() {
            let path = bind(first.path.clone());
            let value = bind(first.value.clone());
            let keys = vec![("path", path), ("value", value)];
            ("dead_letter_fields", None, keys, "dead_letter_id")
        } else if let Some(message) = &self.message_id {
            let keys = vec![("message_id", bind(stand_in(message, SHORT_MAX)))];
            ("dead_letters", Some("dead_letters_message_id"), keys, "id")
        } else {
            let value = bind(stand_in(self.correlation_id.as_ref()?, SHORT_MAX));
            let keys = vec![("correlation_id", value)];
            (
                "dead_letters",
                Some("dead_letters_correlation_id"),
                keys,
                "id",
            )
        };
        Some(dialect.index_walk(&IndexWalk {
            table,
            index,
            keys: &keys,
            id,
            before,
            after,
            cap,
        }))
    }

    /// The order of [`SearchTerms::walk_sql`]'s rows, newest first, over a walk named `w`.
    pub(super) fn walk_order(&self, dialect: &dyn Dialect) -> String {
        let keys = if self.body.is_empty() { 1 } else { 2 };
        dialect.index_walk_order(keys, "w")
    }

    /// ` AND ...` for every term [`SearchTerms::tables_clause`] did not apply. Ids are compared
    /// with the stored text, through the columns' stand-in as at archive time.
    pub(super) fn conditions(&self, sql: &mut String, bind: &mut dyn FnMut(String) -> usize) {
        let ids = [
            ("message_id", &self.message_id),
            ("correlation_id", &self.correlation_id),
        ];
        for (column, id) in ids {
            if let Some(id) = id {
                let n = bind(stand_in(id, SHORT_MAX));
                sql.push_str(&format!(" AND {column} = ${n}"));
            }
        }
        for field in self.body.iter().skip(1) {
            let path = bind(field.path.clone());
            let value = bind(field.value.clone());
            sql.push_str(&format!(
                " AND EXISTS (SELECT 1 FROM dead_letter_fields g WHERE g.path = ${path} \
                 AND g.value = ${value} AND g.dead_letter_id = dead_letters.id)"
            ));
        }
    }
}

/// A dead letter's search columns, as stored.
pub(super) struct SearchColumns {
    /// `message_id`: the first `:message-id` property, through the columns' stand-in.
    pub message_id: Option<String>,
    /// `correlation_id`: the first `:correlation-id` property, likewise.
    pub correlation_id: Option<String>,
    /// The body's fields.
    pub fields: Vec<BodyField>,
}

/// What `dl` is found by.
pub(super) fn search_columns(dl: &NewDeadLetter) -> SearchColumns {
    let property = |name: &str| {
        dl.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| stand_in(v, SHORT_MAX))
    };
    SearchColumns {
        message_id: property(PROP_MESSAGE_ID),
        correlation_id: property(PROP_CORRELATION_ID),
        // A body that is not a JSON object may come with the object it is searched by.
        fields: match dl.headers.iter().find(|(k, _)| k == SEARCH_FIELDS) {
            Some((_, fields)) => body_fields(fields.as_bytes()),
            None => body_fields(&dl.body),
        },
    }
}

/// The rows of `dead_letter_fields`, as one JSON text `[[path, value], ..]` (one bound
/// parameter, read back with `json_each` or `jsonb_array_elements`); `None` for no fields.
pub(super) fn fields_rows(fields: &[BodyField]) -> Option<String> {
    if fields.is_empty() {
        return None;
    }
    let rows: Vec<Value> = fields
        .iter()
        .map(|f| Value::from(vec![f.path.as_str(), f.value.as_str()]))
        .collect();
    Some(Value::Array(rows).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(path: &str, value: &str) -> BodyField {
        BodyField {
            path: path.into(),
            value: value.into(),
        }
    }

    #[test]
    fn scalar_leaves_breadth_first_with_canonical_paths_and_values() {
        let body = br#" {"status":"late","matricula_id":123,
            "endereco":{"cidade":"Campinas","geo":{"lat":1.5}},
            "tags":["a",{"x":1}],"a.b":true,"":null,"nota":1.0e2}"#;
        assert_eq!(
            body_fields(body),
            vec![
                field(r#""""#, "null"),
                field(r#""a.b""#, "true"),
                field("matricula_id", "123"),
                field("nota", "100"),
                field("status", r#""late""#),
                field("endereco.cidade", r#""Campinas""#),
                field("endereco.geo.lat", "1.5"),
            ]
        );
    }

    #[test]
    fn only_json_objects_have_fields() {
        for body in [
            &b"matricula_id = 123"[..],
            b"[{\"a\":1}]",
            b"{\"a\":",
            b"",
            b"\x00\x9f{}",
            b"123",
        ] {
            assert!(body_fields(body).is_empty(), "{body:?}");
        }
    }

    #[test]
    fn fields_are_bounded_in_number_and_size() {
        let mut object = Map::new();
        for i in 0..100 {
            object.insert(format!("k{i:03}"), json!(i));
        }
        let fields = body_fields(Value::Object(object).to_string().as_bytes());
        assert_eq!(fields.len(), MAX_FIELDS);
        assert_eq!(fields[0], field("k000", "0"));
        assert_eq!(fields[MAX_FIELDS - 1], field("k063", "63"));

        // 254 characters quoted are 256 bytes: kept; one more is not (never cut).
        let sized = json!({
            "fits": "x".repeat(MAX_FIELD_BYTES - 2),
            "over": "x".repeat(MAX_FIELD_BYTES - 1),
            ("k".repeat(MAX_FIELD_BYTES + 1)): 1,
        });
        let fields = body_fields(sized.to_string().as_bytes());
        let paths: Vec<&str> = fields.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["fits"]);
        let huge = format!(r#"{{"a":1,"pad":"{}"}}"#, "x".repeat(MAX_INDEXED_BODY));
        assert!(body_fields(huge.as_bytes()).is_empty());
    }

    #[test]
    fn numbers_have_one_spelling_and_strings_stay_strings() {
        let value = |v: Value| field_value(&v).unwrap();
        assert_eq!(value(json!(123)), "123");
        assert_eq!(value(json!(123.0)), "123");
        assert_eq!(value(serde_json::from_str("1.23e2").unwrap()), "123");
        assert_eq!(value(json!(-0.0)), "0");
        assert_eq!(value(json!(1.5)), "1.5");
        assert_eq!(value(json!(u64::MAX)), u64::MAX.to_string());
        assert_eq!(value(json!(1e300)), "1e+300");
        assert_eq!(value(json!("123")), r#""123""#);
        assert_eq!(
            value(json!("a\u{0}b")),
            r#""a\u0000b""#,
            "no NUL byte in any column"
        );
        assert_eq!(field_value(&json!([1])), None);
        assert_eq!(field_value(&json!({"a": 1})), None);
    }

    #[test]
    fn keys_that_are_not_plain_are_quoted() {
        let path = |keys: &[&str]| BodyField::new(keys, &json!(1)).unwrap().path;
        assert_eq!(path(&["a", "b"]), "a.b");
        assert_eq!(path(&["a.b"]), r#""a.b""#);
        assert_eq!(path(&["e-mail", "ção"]), r#"e-mail."ção""#);
        assert_eq!(path(&["say \"hi\""]), r#""say \"hi\"""#);
        assert_ne!(path(&["a", "b"]), path(&["a.b"]));
        assert_eq!(BodyField::new::<&str>(&[], &json!(1)), None);
    }

    #[test]
    fn storage_forms_hold_the_canonical_text() {
        let fields = vec![field("a.b", "1"), field("s", r#""x""#)];
        assert_eq!(
            fields_rows(&fields).unwrap(),
            r#"[["a.b","1"],["s","\"x\""]]"#
        );
        assert_eq!(fields_rows(&[]), None);
    }
}
