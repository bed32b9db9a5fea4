//! A search's cost is bounded by what it shows or by `SEARCH_EXAMINED_MAX`, whatever the
//! archive holds: a body field that 20,000 dead letters share, none of them on the route
//! searched (or with the second term), is read at most `SEARCH_EXAMINED_MAX` entries a page,
//! the page says where it stopped, and the next page continues there until the one match far
//! below is found. Work is counted, not timed: the entries the search reports it read, and on
//! PostgreSQL the rows its page query's scans read (`EXPLAIN ANALYZE`).

use serde_json::json;

use super::{TestDb, both_backends};
use crate::store::{
    Backend, BodyField, DeadLetterFilter, DeadLetterPage, SEARCH_EXAMINED_MAX, SearchTerms,
};

both_backends!(a_search_reads_at_most_the_cap_and_says_where_it_stopped);

/// Dead letters sharing `status = "late"`.
const LATE: i64 = 20_000;

/// The archive, filled in SQL with what the archive writes for each body and correlation id:
/// - id 1: route `orders`, `{"status": "late"}`, correlation `c-late` (the one match);
/// - ids 2..=20,001: route `billing`, `{"status": "late"}`, correlation `c-late`;
/// - ids 20,002..=40,001: route `orders`, `{"status": "ok"}`, correlation `c-ok`.
async fn fill(db: &TestDb) {
    let pool = db.store.pool();
    let total = 2 * LATE + 1;
    // (route, status, correlation) of dead letter `i`, in SQL.
    let route = format!(
        "CASE WHEN i = 1 OR i > {} THEN 'orders' ELSE 'billing' END",
        LATE + 1
    );
    let late = format!("i <= {}", LATE + 1);
    let status = format!("CASE WHEN {late} THEN '\"late\"' ELSE '\"ok\"' END");
    let correlation = format!("CASE WHEN {late} THEN 'c-late' ELSE 'c-ok' END");
    let body = format!("'{{\"status\":' || {status} || '}}'");
    let statements: Vec<String> = match db.store.backend() {
        Backend::Sqlite => {
            let numbers = format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {total})"
            );
            vec![
                format!(
                    "{numbers} INSERT INTO dead_letters (id, route, queue, reason, plugin, \
                     attempts, headers, body, dead_lettered_at, replay_count, correlation_id) \
                     SELECT i, {route}, 'q', 'boom', 'p', 1, '[]', CAST({body} AS BLOB), i, 0, \
                     {correlation} FROM n"
                ),
                format!(
                    "{numbers} INSERT INTO dead_letter_fields (path, value, dead_letter_id) \
                     SELECT 'status', {status}, i FROM n"
                ),
            ]
        }
        Backend::Postgres => vec![
            format!(
                "INSERT INTO dead_letters (id, route, queue, reason, plugin, attempts, headers, \
                 body, dead_lettered_at, replay_count, correlation_id) \
                 SELECT i, {route}, 'q', 'boom', 'p', 1, '[]', convert_to({body}, 'UTF8'), i, 0, \
                 {correlation} FROM generate_series(1, {total}) AS i"
            ),
            format!(
                "INSERT INTO dead_letter_fields (path, value, dead_letter_id) \
                 SELECT 'status', {status}, i FROM generate_series(1, {total}) AS i"
            ),
            "ANALYZE dead_letters".to_owned(),
            "ANALYZE dead_letter_fields".to_owned(),
        ],
    };
    for statement in statements {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(pool)
            .await
            .unwrap();
    }
}

fn late() -> BodyField {
    BodyField::new(&["status"], &json!("late")).unwrap()
}

/// The page of `filter` below `before`, after checking what it read.
async fn page(db: &TestDb, what: &str, filter: &DeadLetterFilter) -> DeadLetterPage {
    if db.store.backend() == Backend::Postgres {
        let scanned = db.store.search_page_rows_scanned(filter).await;
        assert!(
            scanned <= SEARCH_EXAMINED_MAX,
            "{what}: a scan of the page query read {scanned} rows, over the cap of \
             {SEARCH_EXAMINED_MAX}"
        );
    }
    let page = db.store.dead_letters_search(filter).await.unwrap();
    assert!(
        page.examined <= SEARCH_EXAMINED_MAX,
        "{what}: the search read {} index entries, over the cap of {SEARCH_EXAMINED_MAX}",
        page.examined
    );
    page
}

async fn a_search_reads_at_most_the_cap_and_says_where_it_stopped(db: &TestDb) {
    fill(db).await;
    let on_orders = |search: SearchTerms| DeadLetterFilter {
        route: Some("orders".into()),
        search,
        ..Default::default()
    };
    let by_field = on_orders(SearchTerms {
        body: vec![late()],
        ..Default::default()
    });
    let by_correlation = on_orders(SearchTerms {
        correlation_id: Some("c-late".into()),
        ..Default::default()
    });
    let two_fields = DeadLetterFilter {
        search: SearchTerms {
            body: vec![late(), BodyField::new(&["x"], &json!(1)).unwrap()],
            ..Default::default()
        },
        ..Default::default()
    };
    let cases = [
        ("a body field on a route", by_field),
        ("a correlation id on a route", by_correlation),
        ("two body fields", two_fields.clone()),
    ];
    let window = SEARCH_EXAMINED_MAX;
    for (what, filter) in cases {
        let first = page(db, what, &filter).await;
        assert!(first.rows.is_empty(), "{what}: {:?}", first.rows.len());
        // The newest entries are ids 20,001 down to 20,002 - window.
        let first_stop = LATE + 2 - window;
        assert_eq!(
            (first.examined, first.stopped_before),
            (window, Some(first_stop)),
            "{what}: the first page says where it stopped"
        );
        // Continuing below: the next window, then the one match (id 1) if it matches.
        let mut next = filter.clone();
        next.before_id = Some(first_stop);
        let second = page(db, what, &next).await;
        assert_eq!(second.stopped_before, Some(first_stop - window), "{what}");
        next.before_id = second.stopped_before;
        let last = page(db, what, &next).await;
        assert_eq!(last.stopped_before, None, "{what}: the index ends there");
        let found: Vec<i64> = last.rows.iter().map(|d| d.id).collect();
        let expected: &[i64] = if filter == two_fields { &[] } else { &[1] };
        assert_eq!(found, expected, "{what}");
    }

    // A page that fills reads no further than it needs, and stops nowhere.
    let full = DeadLetterFilter {
        search: SearchTerms {
            body: vec![late()],
            ..Default::default()
        },
        limit: Some(100),
        ..Default::default()
    };
    let full = page(db, "a full page", &full).await;
    assert_eq!(full.rows.len(), 100);
    assert_eq!(full.rows[0].id, LATE + 1);
    assert_eq!(full.stopped_before, None);
    assert!(
        full.examined <= 1_000,
        "a page that fills from the first window ({} entries) reads no more",
        full.examined
    );
}
