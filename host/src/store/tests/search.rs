//! Search (migration 0011): each kind of term finds exactly its dead letters among decoys
//! (a string that reads like the number, a non-JSON body, the same key one level down, an
//! array, a dotted key, a body past the 64-field bound), terms combine with each other and
//! with the other filters, pages and purges work on them; and every kind reads an index, not
//! the table (`EXPLAIN`).

use serde_json::{Value, json};

use super::{TestDb, both_backends};
use crate::store::{Backend, BodyField, DeadLetter, DeadLetterFilter, NewDeadLetter, SearchTerms};

both_backends!(
    each_search_finds_exactly_its_dead_letters,
    searches_read_an_index_not_the_table
);

fn ids(rows: Vec<DeadLetter>) -> Vec<i64> {
    rows.into_iter().map(|d| d.id).collect()
}

/// A dead letter of `route` with message id `message_id`, correlation id `correlation` (if
/// any) and `body`.
fn letter(route: &str, message_id: &str, correlation: Option<&str>, body: &[u8]) -> NewDeadLetter {
    let mut headers = vec![
        ("x-tenant".to_owned(), "acme".to_owned()),
        (":message-id".to_owned(), message_id.to_owned()),
    ];
    if let Some(c) = correlation {
        headers.push((":correlation-id".to_owned(), c.to_owned()));
    }
    NewDeadLetter {
        route: route.into(),
        queue: format!("{route}.dlq"),
        reason: "boom".into(),
        plugin: Some("p".into()),
        attempts: 3,
        headers,
        body: body.to_vec(),
        first_failed_at: None,
        dead_lettered_at: 1_000,
    }
}

/// `body.KEYS = value`.
fn field(keys: &[&str], value: Value) -> BodyField {
    BodyField::new(keys, &value).expect("a scalar")
}

/// A filter of these search terms only.
fn search(terms: SearchTerms) -> DeadLetterFilter {
    DeadLetterFilter {
        search: terms,
        ..Default::default()
    }
}

/// A filter of these body fields.
fn body(fields: Vec<BodyField>) -> DeadLetterFilter {
    search(SearchTerms {
        body: fields,
        ..Default::default()
    })
}

fn message(id: &str) -> DeadLetterFilter {
    search(SearchTerms {
        message_id: Some(id.into()),
        ..Default::default()
    })
}

fn correlation(id: &str) -> DeadLetterFilter {
    search(SearchTerms {
        correlation_id: Some(id.into()),
        ..Default::default()
    })
}

async fn each_search_finds_exactly_its_dead_letters(db: &TestDb) {
    let s = &db.store;
    let insert = move |d: NewDeadLetter| async move { s.dead_letter_insert(&d).await.unwrap() };
    let a = insert(letter(
        "orders",
        "m-1",
        Some("c-1"),
        br#"{"matricula_id":123,"status":"late","endereco":{"cidade":"Campinas","uf":"SP"}}"#,
    ))
    .await;
    let b = insert(letter(
        "orders",
        "m-2",
        Some("c-1"),
        br#"{"matricula_id":124,"status":"late","a":{"b":1}}"#,
    ))
    .await;
    // Decoys: the number as a string, a text body that mentions it, the key one level down,
    // inside an array, a value of the other type, a dotted key.
    let string = insert(letter("orders", "m-3", None, br#"{"matricula_id":"123"}"#)).await;
    let text = insert(letter("orders", "m-4", Some("c-4"), b"matricula_id = 123")).await;
    let _binary = insert(letter("orders", "m-5", None, &[0, 159, 146, 150, 0])).await;
    let nested = insert(letter(
        "billing",
        "m-6",
        None,
        br#"{"aluno":{"matricula_id":123}}"#,
    ))
    .await;
    let _array = insert(letter("orders", "m-7", None, br#"[{"matricula_id":123}]"#)).await;
    let other_type = insert(letter("orders", "m-8", None, br#"{"a":{"b":"1"}}"#)).await;
    let dotted = insert(letter("orders", "m-9", None, br#"{"a.b":1}"#)).await;
    // The same number spelled otherwise, on another route.
    let float = insert(letter(
        "billing",
        "m-10",
        None,
        br#" {"status":"ok","matricula_id":1.23e2}"#,
    ))
    .await;
    // 70 fields: only the first 64 (k00..k63) are kept.
    let wide_body: serde_json::Map<String, Value> =
        (0..70).map(|i| (format!("k{i:02}"), json!(i))).collect();
    let wide_body = Value::Object(wide_body).to_string();
    let wide = insert(letter("orders", "m-11", None, wide_body.as_bytes())).await;
    // A message id with a NUL byte (kept through the columns' stand-in).
    let nul = insert(letter("orders", "m\0x", None, b"{}")).await;

    let list =
        move |f: DeadLetterFilter| async move { ids(s.dead_letters_list(&f).await.unwrap()) };
    // Message and correlation ids: exact, newest first.
    assert_eq!(list(message("m-1")).await, [a]);
    assert_eq!(
        list(message("m-")).await,
        Vec::<i64>::new(),
        "exact, not a prefix"
    );
    assert_eq!(list(message("m\0x")).await, [nul]);
    assert_eq!(list(correlation("c-1")).await, [b, a]);
    assert_eq!(list(correlation("c-4")).await, [text]);
    assert_eq!(list(correlation("m-1")).await, Vec::<i64>::new());

    // Body fields.
    let matricula = field(&["matricula_id"], json!(123));
    assert_eq!(list(body(vec![matricula.clone()])).await, [float, a]);
    let as_string = field(&["matricula_id"], json!("123"));
    assert_eq!(list(body(vec![as_string])).await, [string]);
    let late = field(&["status"], json!("late"));
    assert_eq!(list(body(vec![late.clone()])).await, [b, a]);
    let city = field(&["endereco", "cidade"], json!("Campinas"));
    assert_eq!(list(body(vec![city])).await, [a]);
    let deep = field(&["aluno", "matricula_id"], json!(123));
    assert_eq!(list(body(vec![deep])).await, [nested]);
    assert_eq!(list(body(vec![field(&["a", "b"], json!(1))])).await, [b]);
    assert_eq!(
        list(body(vec![field(&["a", "b"], json!("1"))])).await,
        [other_type]
    );
    assert_eq!(list(body(vec![field(&["a.b"], json!(1))])).await, [dotted]);
    assert_eq!(list(body(vec![field(&["k63"], json!(63))])).await, [wide]);
    let past_the_bound = field(&["k64"], json!(64));
    assert_eq!(list(body(vec![past_the_bound])).await, Vec::<i64>::new());

    // Terms combine with each other and with the other filters.
    let both = body(vec![matricula.clone(), late]);
    assert_eq!(list(both).await, [a]);
    let mut on_billing = body(vec![matricula.clone()]);
    on_billing.route = Some("billing".into());
    assert_eq!(list(on_billing).await, [float]);
    let mut id_and_field = correlation("c-1");
    id_and_field.search.body = vec![field(&["a", "b"], json!(1))];
    assert_eq!(list(id_and_field).await, [b]);
    let mut reason = message("m-1");
    reason.reason_contains = Some("nope".into());
    assert_eq!(list(reason).await, Vec::<i64>::new());

    // Pages, oldest first, counts.
    let mut first = body(vec![matricula.clone()]);
    first.limit = Some(1);
    assert_eq!(list(first.clone()).await, [float]);
    first.before_id = Some(float);
    assert_eq!(list(first).await, [a]);
    let f = body(vec![matricula.clone()]);
    assert_eq!(
        ids(s.dead_letters_oldest_first(&f, 10).await.unwrap()),
        [a, float]
    );
    let after = DeadLetterFilter {
        after_id: Some(a),
        ..f.clone()
    };
    assert_eq!(
        ids(s.dead_letters_oldest_first(&after, 10).await.unwrap()),
        [float]
    );
    assert_eq!(s.dead_letters_count(&f).await.unwrap(), 2);
    assert_eq!(s.dead_letters_max_id(&f).await.unwrap(), Some(float));
    let groups = s.dead_letter_groups(&f).await.unwrap();
    assert_eq!(groups.iter().map(|g| g.count).sum::<i64>(), 2);

    // A purge by a search deletes its dead letters, and their fields go with them.
    let ok = body(vec![field(&["status"], json!("ok"))]);
    assert_eq!(s.dead_letters_purge(&ok).await.unwrap(), 1);
    assert_eq!(list(body(vec![matricula])).await, [a]);
    if s.backend() == Backend::Sqlite {
        let left: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM dead_letter_fields WHERE dead_letter_id = $1")
                .bind(float)
                .fetch_one(s.pool())
                .await
                .unwrap();
        assert_eq!(
            left, 0,
            "the trigger deleted the purged dead letter's fields"
        );
    }
}

/// The archive at 20,000 dead letters, filled in SQL with what the archive writes for a body
/// `{"matricula_id": i}`, message id `m-i` and correlation id `c-i`.
async fn fill(db: &TestDb) {
    let pool = db.store.pool();
    let statements: &[&'static str] = match db.store.backend() {
        Backend::Sqlite => &[
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) \
             INSERT INTO dead_letters (id, route, queue, reason, plugin, attempts, headers, body, \
             dead_lettered_at, replay_count, message_id, correlation_id) \
             SELECT i, 'r' || (i % 5), 'q', 'boom', 'p', 1, '[]', \
             CAST('{\"matricula_id\":' || i || '}' AS BLOB), i, 0, 'm-' || i, 'c-' || i FROM n",
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) \
             INSERT INTO dead_letter_fields (path, value, dead_letter_id) \
             SELECT 'matricula_id', CAST(i AS TEXT), i FROM n",
        ],
        Backend::Postgres => &[
            "INSERT INTO dead_letters (route, queue, reason, plugin, attempts, headers, body, \
             dead_lettered_at, replay_count, message_id, correlation_id) \
             SELECT 'r' || (i % 5), 'q', 'boom', 'p', 1, '[]', \
             convert_to('{\"matricula_id\":' || i || '}', 'UTF8'), i, 0, 'm-' || i, 'c-' || i \
             FROM generate_series(1, 20000) AS i",
            "INSERT INTO dead_letter_fields (path, value, dead_letter_id) \
             SELECT 'matricula_id', CAST(dead_lettered_at AS TEXT), id FROM dead_letters",
            "ANALYZE dead_letters",
            "ANALYZE dead_letter_fields",
        ],
    };
    for statement in statements {
        sqlx::query(*statement).execute(pool).await.unwrap();
    }
}

/// Each kind of search, alone and with a route, reads its index: SQLite's plan searches an
/// index and scans no table (each dead letter then read by its id); PostgreSQL's, with table
/// scans and walks of the primary key priced out (`Store::page_plan`), names the index.
async fn searches_read_an_index_not_the_table(db: &TestDb) {
    fill(db).await;
    let s = &db.store;
    let matricula = field(&["matricula_id"], json!(7_777));
    let cases = [
        ("message id", message("m-7777"), "dead_letters_message_id"),
        (
            "correlation id",
            correlation("c-7777"),
            "dead_letters_correlation_id",
        ),
        ("body field", body(vec![matricula.clone()]), "fields"),
        (
            "body field on a route",
            DeadLetterFilter {
                route: Some("r2".into()),
                ..body(vec![matricula])
            },
            "fields",
        ),
        (
            "message id on a route",
            DeadLetterFilter {
                route: Some("r2".into()),
                ..message("m-7777")
            },
            "dead_letters_message_id",
        ),
    ];
    for (what, filter, index) in cases {
        let found = s.dead_letters_list(&filter).await.unwrap();
        assert_eq!(found.len(), 1, "{what}: the one dead letter 7777");
        assert_eq!(found[0].letter.dead_lettered_at, 7_777, "{what}");
        let plan = s.page_plan(&filter).await;
        let shown = plan.join("\n");
        // The body fields' index has its own name on each backend.
        let expected = match (s.backend(), index) {
            (Backend::Sqlite, "fields") => "USING PRIMARY KEY (path=? AND value=?",
            (Backend::Postgres, "fields") => "dead_letter_fields_pkey",
            _ => index,
        };
        assert!(
            shown.contains(expected),
            "{what}: no {expected} in\n{shown}"
        );
        match s.backend() {
            Backend::Sqlite => {
                assert!(
                    plan.iter().all(|line| !line.starts_with("SCAN")),
                    "{what}: a scan in\n{shown}"
                );
                assert!(
                    shown.contains("dead_letters USING INTEGER PRIMARY KEY")
                        || shown.contains(index),
                    "{what}: dead letters not read by id in\n{shown}"
                );
            }
            Backend::Postgres => {
                assert!(!shown.contains("Seq Scan"), "{what}: a scan in\n{shown}");
            }
        }
    }
}
