//! The dead-letter search syntax, parsed in one place for the console's search box,
//! `GET /dlq?q=` and `carteiro dlq list|replay|purge --search`, into a [`Search`] that narrows
//! a store filter. Every term is answered from an index (`store::dead_letters::search`).
//!
//! A query is terms separated by spaces; a dead letter must match every one:
//! - `id:VALUE`: its message id (the AMQP `message_id` property) is exactly VALUE;
//! - `correlation:VALUE`: its correlation id is exactly VALUE;
//! - `route:VALUE`: its route (work queue) is VALUE; `reason:VALUE`: its reason contains
//!   VALUE (as `--route` and `--reason`);
//! - `task:NAME`: a Celery task's name (`body.task = "NAME"`: a Celery dead letter of a
//!   `[[dead_letter_queues]]` queue is searched as `{task, id, args, kwargs}`);
//! - `body.PATH = VALUE`: its body is a JSON object whose field PATH holds exactly VALUE
//!   (`body.args[0]`: position 0 of a Celery task's arguments).
//!   PATH is keys joined by `.` (`body.endereco.cidade` is `{"endereco": {"cidade": ..}}`);
//!   a key with characters other than letters, digits, `_` and `-` is written in double
//!   quotes (`body."e.mail"`). VALUE is one JSON value: a number (`123`; `123.0` is the same
//!   number), a string in double quotes (`"late"`; the string `"123"` is not the number `123`),
//!   `true`, `false` or `null`.
//!
//! After `id:`, `correlation:`, `route:` and `reason:`, VALUE runs to the next space, or is a
//! JSON string in double quotes (`reason:"bad input"`). A query that does not parse is
//! refused with the column where it stops making sense ([`SearchError`]).
//!
//! A page of results reads one index: the first `body.` term's (else `id:`'s, else
//! `correlation:`'s), newest first; every other term is checked on the dead letters it names.
//! It reads at most `store::SEARCH_EXAMINED_MAX` entries; a page that stops there before it is
//! full says so ([`stopped_short`]) and the next one continues below.

use serde_json::Value;

use crate::store::{BodyField, DeadLetterFilter, MAX_FIELD_BYTES};

/// One term of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// `id:VALUE`
    MessageId(String),
    /// `correlation:VALUE`
    CorrelationId(String),
    /// `route:VALUE`
    Route(String),
    /// `reason:VALUE` (contained in the reason)
    Reason(String),
    /// `body.PATH = VALUE`, in the archive's canonical form.
    Body(BodyField),
}

/// A parsed query: every term must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Search {
    /// The terms, in the order given.
    pub terms: Vec<Term>,
}

/// Why a query was refused, and where: `column` counts characters from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {column}: {message}")]
pub struct SearchError {
    /// Where the query stops making sense (characters, from 1).
    pub column: usize,
    /// What is wrong there, and what would be right.
    pub message: String,
}

impl SearchError {
    /// `query` with a caret under the column, for a terminal or a `<pre>`.
    pub fn pointer(&self, query: &str) -> String {
        let line = query.replace(['\n', '\r', '\t'], " ");
        format!("{line}\n{}^", " ".repeat(self.column.saturating_sub(1)))
    }
}

/// What a term may start with, for messages.
const TERMS: &str = "id:, correlation:, route:, reason:, task: or body.FIELD = VALUE";

/// Parses `query` (module docs).
pub fn parse(query: &str) -> Result<Search, SearchError> {
    let mut cursor = Cursor { text: query, at: 0 };
    let mut terms: Vec<(usize, Term)> = Vec::new();
    loop {
        cursor.skip_spaces();
        if cursor.peek().is_none() {
            break;
        }
        let start = cursor.at;
        let term = cursor.term()?;
        if let Some(earlier) = terms.iter().find(|(_, t)| same_kind(t, &term)) {
            return Err(cursor.error(
                start,
                format!(
                    "{} is given twice (also at column {}); a dead letter has one",
                    kind(&term),
                    cursor.column(earlier.0)
                ),
            ));
        }
        terms.push((start, term));
    }
    if terms.is_empty() {
        return Err(cursor.error(0, format!("an empty search: give {TERMS}")));
    }
    Ok(Search {
        terms: terms.into_iter().map(|(_, term)| term).collect(),
    })
}

impl std::str::FromStr for Search {
    type Err = SearchError;

    fn from_str(query: &str) -> Result<Self, Self::Err> {
        parse(query)
    }
}

/// A search term that disagrees with the filter it narrows ([`Search::narrow`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Disagree {
    #[error("route:{searched} in the search and route {given} cannot both hold")]
    Route { searched: String, given: String },
    #[error("reason:{searched} in the search and reason {given:?}: give one of them")]
    Reason { searched: String, given: String },
}

impl Search {
    /// `filter` narrowed by every term. A `route:` or `reason:` term and the filter's own
    /// route or reason must agree (refused otherwise: the two cannot both hold, or would be
    /// a second reason).
    pub fn narrow(&self, mut filter: DeadLetterFilter) -> Result<DeadLetterFilter, Disagree> {
        for term in &self.terms {
            match term {
                Term::MessageId(id) => filter.search.message_id = Some(id.clone()),
                Term::CorrelationId(id) => filter.search.correlation_id = Some(id.clone()),
                Term::Body(field) => filter.search.body.push(field.clone()),
                Term::Route(route) => agree(&mut filter.route, route, |searched, given| {
                    Disagree::Route { searched, given }
                })?,
                Term::Reason(text) => {
                    agree(&mut filter.reason_contains, text, |searched, given| {
                        Disagree::Reason { searched, given }
                    })?
                }
            }
        }
        Ok(filter)
    }
}

/// Sets `slot` to `searched`, unless it holds another value already: then the two disagree.
fn agree(
    slot: &mut Option<String>,
    searched: &str,
    disagree: fn(String, String) -> Disagree,
) -> Result<(), Disagree> {
    match slot {
        Some(given) if given != searched => Err(disagree(searched.to_owned(), given.clone())),
        _ => {
            *slot = Some(searched.to_owned());
            Ok(())
        }
    }
}

/// What a search page that stopped short says (the console, `carteiro dlq list`, and `GET
/// /dlq`'s header): the store read `examined` index entries (`store::SEARCH_EXAMINED_MAX`, the
/// most one page reads) without filling the page, and did not look below `before_id`.
pub fn stopped_short(examined: i64, before_id: i64) -> String {
    format!(
        "The search stopped after reading {examined} index entries (the most one page reads) \
         without filling the page: dead letters below #{before_id} were not looked at. \
         Continue below #{before_id}, or narrow the search: what is read is the dead letters \
         of its first body term (else of its id: or correlation:), so put first the field \
         that the fewest dead letters share; route:, reason: and times are checked on those \
         and do not shorten the read."
    )
}

/// Two terms of a kind cannot both be given (the same body path counts as one kind).
fn same_kind(a: &Term, b: &Term) -> bool {
    match (a, b) {
        (Term::Body(a), Term::Body(b)) => a.path == b.path,
        _ => std::mem::discriminant(a) == std::mem::discriminant(b),
    }
}

/// How a term reads in a message: `id:`, `body.a.b`.
fn kind(term: &Term) -> String {
    match term {
        Term::MessageId(_) => "id:".to_owned(),
        Term::CorrelationId(_) => "correlation:".to_owned(),
        Term::Route(_) => "route:".to_owned(),
        Term::Reason(_) => "reason:".to_owned(),
        Term::Body(field) => format!("body.{}", field.path),
    }
}

/// A position in the query (a byte offset on a character boundary).
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<char> {
        self.text[self.at..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += c.len_utf8();
        Some(c)
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.bump();
        }
    }

    /// The characters from here while `keep` holds.
    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> &'a str {
        let start = self.at;
        while self.peek().is_some_and(&keep) {
            self.bump();
        }
        &self.text[start..self.at]
    }

    /// The column (characters from 1) of byte offset `at`.
    fn column(&self, at: usize) -> usize {
        self.text[..at].chars().count() + 1
    }

    fn error(&self, at: usize, message: impl Into<String>) -> SearchError {
        SearchError {
            column: self.column(at),
            message: message.into(),
        }
    }

    /// One term, from its first character.
    fn term(&mut self) -> Result<Term, SearchError> {
        let start = self.at;
        let word = self.take_while(is_key_char);
        match (word, self.peek()) {
            ("body", Some('.')) => self.body(start),
            ("body", _) => Err(self.error(
                self.at,
                "expected `.` and a field after body: body.matricula_id = 123",
            )),
            (key, Some(':')) => {
                self.bump();
                let make: fn(String) -> Term = match key {
                    "id" => Term::MessageId,
                    "correlation" => Term::CorrelationId,
                    "route" => Term::Route,
                    "reason" => Term::Reason,
                    "task" => {
                        let name = Value::String(self.word(key)?);
                        let task = BodyField::new(&["task"], &name).ok_or_else(|| {
                            self.error(
                                start,
                                format!("a task name of at most {MAX_FIELD_BYTES} bytes"),
                            )
                        })?;
                        return Ok(Term::Body(task));
                    }
                    _ => {
                        return Err(
                            self.error(start, format!("unknown term `{key}:`; a term is {TERMS}"))
                        );
                    }
                };
                Ok(make(self.word(key)?))
            }
            _ => Err(self.error(start, format!("expected {TERMS}"))),
        }
    }

    /// The value after `key:`: a JSON string in double quotes, or the text up to a space.
    fn word(&mut self, key: &str) -> Result<String, SearchError> {
        if self.peek() == Some('"') {
            return self.quoted();
        }
        let at = self.at;
        let value = self.take_while(|c| !c.is_whitespace());
        if value.is_empty() {
            return Err(self.error(
                at,
                format!("expected a value after {key}: (in double quotes if it has spaces)"),
            ));
        }
        Ok(value.to_owned())
    }

    /// A JSON string literal from its opening quote.
    fn quoted(&mut self) -> Result<String, SearchError> {
        let start = self.at;
        self.bump();
        loop {
            match self.bump() {
                None => {
                    return Err(self.error(start, "this string has no closing double quote"));
                }
                Some('\\') => {
                    self.bump();
                }
                Some('"') => break,
                Some(_) => {}
            }
        }
        serde_json::from_str(&self.text[start..self.at])
            .map_err(|e| self.error(start, format!("not a JSON string: {e}")))
    }

    /// `.PATH = VALUE` after `body` (the term began at `start`).
    fn body(&mut self, start: usize) -> Result<Term, SearchError> {
        let mut keys = Vec::new();
        while matches!(self.peek(), Some('.' | '[')) {
            if self.bump() == Some('[') {
                // `args[0]`: an array's item, as the archive keeps a Celery task's arguments.
                let at = self.at;
                let index = self.take_while(|c| c.is_ascii_digit()).to_owned();
                if index.is_empty() || self.bump() != Some(']') {
                    return Err(self.error(at, "expected a position and `]`: body.args[0]"));
                }
                keys.push(index);
                continue;
            }
            let at = self.at;
            let key = if self.peek() == Some('"') {
                self.quoted()?
            } else {
                self.take_while(is_key_char).to_owned()
            };
            if key.is_empty() && self.at == at {
                return Err(self.error(
                    at,
                    "expected a key after `.` (letters, digits, _ and -; any other key in \
                     double quotes: body.\"e.mail\")",
                ));
            }
            keys.push(key);
        }
        let path_end = self.at;
        self.skip_spaces();
        if self.peek() != Some('=') {
            return Err(self.error(
                self.at,
                "expected `=` and a value after the field: body.matricula_id = 123",
            ));
        }
        self.bump();
        self.skip_spaces();
        let at = self.at;
        let value = self.json_value()?;
        let Some(field) = BodyField::new(&keys, &value) else {
            let path = &self.text[start..path_end];
            let why = if matches!(value, Value::Array(_) | Value::Object(_)) {
                "only one value can be searched (a number, a string in double quotes, true, \
                 false or null): arrays and objects are not indexed"
                    .to_owned()
            } else {
                format!(
                    "the archive indexes paths and values of at most {MAX_FIELD_BYTES} bytes: \
                     {path} = ... cannot be found"
                )
            };
            return Err(self.error(at, why));
        };
        Ok(Term::Body(field))
    }

    /// One JSON value: a string in double quotes, or the text up to a space.
    fn json_value(&mut self) -> Result<Value, SearchError> {
        let at = self.at;
        if self.peek() == Some('"') {
            return self.quoted().map(Value::String);
        }
        let token = self.take_while(|c| !c.is_whitespace());
        if token.is_empty() {
            return Err(self.error(
                at,
                "expected a value after `=`: a number, a string in double quotes, true, false \
                 or null",
            ));
        }
        serde_json::from_str(token).map_err(|_| {
            if token.starts_with(char::is_alphabetic) && token.chars().all(is_key_char) {
                self.error(
                    at,
                    format!(
                        "strings need double quotes: \"{token}\" (numbers, true, false and \
                         null do not)"
                    ),
                )
            } else {
                self.error(
                    at,
                    format!(
                        "`{token}` is not a JSON value: a number, a string in double quotes, \
                         true, false or null"
                    ),
                )
            }
        })
    }
}

/// A character of a bare word: a term's name or a plain key.
fn is_key_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '-'
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(keys: &[&str], value: Value) -> Term {
        Term::Body(BodyField::new(keys, &value).unwrap())
    }

    fn terms(query: &str) -> Vec<Term> {
        parse(query)
            .unwrap_or_else(|e| panic!("{query}: {e}"))
            .terms
    }

    /// The column and message of the refusal of `query`.
    fn refused(query: &str) -> (usize, String) {
        let e = parse(query).expect_err(query);
        (e.column, e.message)
    }

    /// Each query parses to exactly the one term beside it.
    fn parses_to(cases: &[(&str, Term)]) {
        for (query, term) in cases {
            assert_eq!(terms(query), std::slice::from_ref(term), "{query}");
        }
    }

    #[test]
    fn each_kind_of_term() {
        parses_to(&[
            ("id:ABC", Term::MessageId("ABC".into())),
            ("correlation:XYZ", Term::CorrelationId("XYZ".into())),
            ("route:orders", Term::Route("orders".into())),
            (r#"reason:"bad input""#, Term::Reason("bad input".into())),
            (
                "body.matricula_id = 123",
                field(&["matricula_id"], json!(123)),
            ),
            (r#"body.status = "late""#, field(&["status"], json!("late"))),
            ("body.a.b = 1", field(&["a", "b"], json!(1))),
            ("body.ok=true", field(&["ok"], json!(true))),
            ("body.gone = null", field(&["gone"], json!(null))),
            ("body.x = -1.5e3", field(&["x"], json!(-1500))),
        ]);
    }

    #[test]
    fn values_and_keys_in_quotes() {
        parses_to(&[
            (
                r#"id:"m 1 \"quoted\"""#,
                Term::MessageId(r#"m 1 "quoted""#.into()),
            ),
            (
                r#"body."e.mail"."x y" = "a@b""#,
                field(&["e.mail", "x y"], json!("a@b")),
            ),
            (
                r#"body.nome = "Jos\u00e9""#,
                field(&["nome"], json!("José")),
            ),
            // Non-ASCII keys may be typed bare.
            ("body.ção = 1", field(&["ção"], json!(1))),
        ]);
        // A plain key typed in quotes is the same key.
        assert_eq!(terms(r#"body."a".b = 1"#), terms("body.a.b = 1"));
    }

    #[test]
    fn numbers_are_the_archive_s_numbers() {
        assert_eq!(terms("body.x = 123.0"), terms("body.x = 123"));
        assert_eq!(terms("body.x = 1.23e2"), terms("body.x = 123"));
        assert_ne!(terms(r#"body.x = "123""#), terms("body.x = 123"));
    }

    #[test]
    fn celery_tasks_are_found_by_name_and_argument_position() {
        assert_eq!(
            terms("task:tasks.liberar_acesso_curso body.args[0] = 42 body.args[1][2] = 1"),
            [
                field(&["task"], json!("tasks.liberar_acesso_curso")),
                field(&["args", "0"], json!(42)),
                field(&["args", "1", "2"], json!(1)),
            ]
        );
        assert!(parse("body.args[x] = 1").is_err());
        assert!(parse("body.args[0 = 1").is_err());
    }

    #[test]
    fn terms_combine() {
        assert_eq!(
            terms(r#"  route:orders   body.status = "late"  id:m-1 body.a.b=1 "#),
            [
                Term::Route("orders".into()),
                field(&["status"], json!("late")),
                Term::MessageId("m-1".into()),
                field(&["a", "b"], json!(1)),
            ]
        );
    }

    #[test]
    fn a_search_narrows_a_filter() {
        let search =
            parse(r#"id:m-1 correlation:c-1 body.a = 1 body.b = "x" route:orders"#).unwrap();
        let base = DeadLetterFilter {
            route: Some("orders".into()),
            limit: Some(10),
            ..Default::default()
        };
        let f = search.narrow(base.clone()).unwrap();
        assert_eq!(f.search.message_id.as_deref(), Some("m-1"));
        assert_eq!(f.search.correlation_id.as_deref(), Some("c-1"));
        assert_eq!(f.search.body.len(), 2);
        assert_eq!((f.route.as_deref(), f.limit), (Some("orders"), Some(10)));
        let other = parse("route:billing").unwrap();
        let why = other.narrow(base).unwrap_err().to_string();
        assert!(why.contains("cannot both hold"), "{why}");
        let reason = parse("reason:timeout").unwrap();
        let f = reason.narrow(DeadLetterFilter::default()).unwrap();
        assert_eq!(f.reason_contains.as_deref(), Some("timeout"));
    }

    #[test]
    fn bad_queries_say_where_and_why() {
        let cases: &[(&str, usize, &str)] = &[
            ("", 1, "an empty search"),
            ("   ", 1, "an empty search"),
            (
                "body.status = late",
                15,
                r#"strings need double quotes: "late""#,
            ),
            ("body", 5, "expected `.` and a field"),
            ("body.", 6, "expected a key"),
            ("body.x", 7, "expected `=`"),
            ("body.x 1", 8, "expected `=`"),
            ("body.x =", 9, "expected a value"),
            ("body.a..b = 1", 8, "expected a key"),
            ("body.x = [1, 2]", 10, "not a JSON value"),
            ("body.x = [1]", 10, "arrays and objects are not indexed"),
            ("body.x = 01", 10, "not a JSON value"),
            ("body.x = 1 2", 12, "expected id:"),
            (r#"body.x = "open"#, 10, "no closing double quote"),
            (r#"body.x = "\q""#, 10, "not a JSON string"),
            ("matricula_id:1", 1, "unknown term `matricula_id:`"),
            ("id:", 4, "expected a value after id:"),
            ("id: x", 4, "expected a value after id:"),
            ("id:a id:b", 6, "id: is given twice (also at column 1)"),
            ("body.a = 1 body.a = 2", 12, "body.a is given twice"),
            ("=1", 1, "expected id:"),
            ("body.ção = x", 12, "strings need double quotes"),
        ];
        for (query, column, says) in cases {
            let (at, message) = refused(query);
            assert_eq!(at, *column, "{query}: {message}");
            assert!(message.contains(says), "{query}: {message}");
        }
        let long = format!(r#"body.x = "{}""#, "x".repeat(MAX_FIELD_BYTES));
        let (at, message) = refused(&long);
        assert_eq!(at, 10);
        assert!(message.contains("at most 256 bytes"), "{message}");
    }

    #[test]
    fn a_refusal_points_at_its_column() {
        let query = "body.status = late";
        let e = parse(query).unwrap_err();
        assert_eq!(e.to_string(), format!("column 15: {}", e.message));
        assert_eq!(e.pointer(query), "body.status = late\n              ^");
    }
}
