//! Search at a million dead letters (issue 25, item 3), on SQLite and PostgreSQL: how long one
//! search takes — the console's page of the newest 100, through `Store::dead_letters_list`,
//! the code path of the console, `GET /dlq?q=` and `carteiro dlq list --search` — when the
//! archive holds `BENCH_SEARCH_ROWS` (default 1,000,000) dead letters.
//!
//! The archive is filled in SQL, in transactions of `BENCH_SEARCH_CHUNK` (100,000) rows, with
//! what `Store::dead_letter_insert` writes for a realistic dead letter (a ~280-byte JSON body
//! with a `matricula_id`, a nested `turma`, a `status` of five values; its message id and
//! correlation id, two dead letters per correlation id), indexes in place. Before anything is
//! timed, sampled rows are checked against the archive's own reading of their bodies
//! (`carteiro::store::body_fields`): a fill that differs from what the archive writes stops
//! the bench. PostgreSQL then gets `VACUUM ANALYZE`, as autovacuum would have run by then.
//!
//! Timed per backend, `BENCH_ROUNDS` (3) rounds of `BENCH_SEARCH_QUERIES` (200) queries of each
//! kind, random keys (seeded), after a warm-up; median and p99 per kind, and each answer's
//! length checked:
//! - `id:` a message id (1 row), `correlation:` (2 rows);
//! - `body.matricula_id = K` (1 row), `body.turma.codigo = "T-K"` (nested, ~1,000 rows: a page
//!   of 100), `body.status = "late"` (a fifth of the archive: a page of 100), two fields;
//! - `body.status = "late"` on a route no dead letter has: no row, so the search reads
//!   `SEARCH_EXAMINED_MAX` (10,000) entries and stops;
//! - **baseline**: the same `matricula_id` search without the index, a scan of every body
//!   (SQLite `json_extract`, PostgreSQL `::jsonb ->>`), `BENCH_SEARCH_SCANS` (5) times a round;
//!   its median over the indexed one's is the index's gain.
//!
//! Then the archive's cost: `BENCH_SEARCH_ARCHIVES` (1,000) `dead_letter_insert`s into the full
//! archive, alternating a JSON body (whose fields are indexed) and the same bytes made
//! non-JSON (no fields); median and p99 of each and their ratio. Each archived one is then
//! found by its message id and its `matricula_id`. Printed first: `uptime` (the load average;
//! measure with it under 0.5), last: the store's size on disk.
//!
//! Run: `bench/run.sh search`, or with PostgreSQL up and its URL exported:
//! `CARTEIRO_TEST_POSTGRES_URL=... cargo bench -p carteiro --bench search` (without the URL the
//! PostgreSQL run is skipped). Knobs: `BENCH_SEARCH_ROWS`, `BENCH_SEARCH_CHUNK`,
//! `BENCH_SEARCH_QUERIES`, `BENCH_SEARCH_SCANS`, `BENCH_SEARCH_ARCHIVES`, `BENCH_ROUNDS`,
//! `BENCH_BACKENDS` (`sqlite,postgres`), `BENCH_SEED` (1).

mod common;

use carteiro::store::{
    BodyField, DeadLetterFilter, NewDeadLetter, SearchTerms, Store, body_fields,
};
use common::{Backend, Named, backends, create_pg_database, drop_pg_database, env_or};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sqlx::{AnyConnection, AssertSqlSafe, Connection, Executor};
use std::time::{Duration, Instant};

struct Settings {
    pg_admin: Option<String>,
    backends: Vec<Backend>,
    rows: i64,
    chunk: i64,
    queries: usize,
    scans: usize,
    archives: usize,
    rounds: usize,
    seed: u64,
}

fn settings() -> Settings {
    let (backends, pg_admin) = backends();
    Settings {
        pg_admin,
        backends,
        rows: env_or("BENCH_SEARCH_ROWS", 1_000_000i64).max(10_000),
        chunk: env_or("BENCH_SEARCH_CHUNK", 100_000i64).max(1_000),
        queries: env_or("BENCH_SEARCH_QUERIES", 200usize).max(10),
        scans: env_or("BENCH_SEARCH_SCANS", 5usize),
        archives: env_or("BENCH_SEARCH_ARCHIVES", 1_000usize).max(2),
        rounds: env_or("BENCH_ROUNDS", 3usize).max(1),
        seed: env_or("BENCH_SEED", 1u64),
    }
}

// ---------------------------------------------------------------- the dead letters

/// Dead letter `i`'s status (a fifth of the archive each), in SQL and here.
const STATUSES: [&str; 5] = ["late", "ok", "pending", "cancelled", "review"];
const STATUS_SQL: &str = "CASE i % 5 WHEN 0 THEN 'late' WHEN 1 THEN 'ok' WHEN 2 THEN 'pending' \
                          WHEN 3 THEN 'cancelled' ELSE 'review' END";
const CITIES: [&str; 4] = ["Campinas", "Santos", "Sorocaba", "Jundiai"];
const CITY_SQL: &str = "CASE i % 4 WHEN 0 THEN 'Campinas' WHEN 1 THEN 'Santos' \
                        WHEN 2 THEN 'Sorocaba' ELSE 'Jundiai' END";
/// A free-text field, as bodies carry (plain ASCII: the same text in JSON and in SQL).
const NOTE: &str = "Matricula recusada pela regra de vagas: turma cheia no periodo solicitado, \
                    aguardando nova turma ou ajuste manual";

/// Dead letter `i`'s body, as the fill writes it in SQL.
fn body(i: i64) -> String {
    let status = STATUSES[(i % 5) as usize];
    let city = CITIES[(i % 4) as usize];
    format!(
        r#"{{"matricula_id":{i},"usuario_id":"U-{}","curso_id":"C-{}","status":"{status}","turma":{{"codigo":"T-{}","cidade":"{city}","uf":"SP"}},"valor":{}.5,"observacao":"{NOTE}"}}"#,
        i % 50_000,
        i % 400,
        i % 1_000,
        i % 1_000,
    )
}

/// [`body`] as a SQL expression of `i`.
fn body_sql() -> String {
    format!(
        "'{{\"matricula_id\":' || i || ',\"usuario_id\":\"U-' || (i % 50000) || \
         '\",\"curso_id\":\"C-' || (i % 400) || '\",\"status\":\"' || ({STATUS_SQL}) || \
         '\",\"turma\":{{\"codigo\":\"T-' || (i % 1000) || '\",\"cidade\":\"' || ({CITY_SQL}) || \
         '\",\"uf\":\"SP\"}},\"valor\":' || (i % 1000) || '.5,\"observacao\":\"{NOTE}\"}}'"
    )
}

/// The fields the archive keeps of [`body`] (`store::dead_letters::search`), each as (path, SQL
/// expression of `i` giving its canonical value text).
fn fields_sql() -> Vec<(&'static str, String)> {
    vec![
        ("curso_id", "'\"C-' || (i % 400) || '\"'".to_owned()),
        ("matricula_id", "CAST(i AS TEXT)".to_owned()),
        ("observacao", format!("'\"{NOTE}\"'")),
        ("status", format!("'\"' || ({STATUS_SQL}) || '\"'")),
        ("usuario_id", "'\"U-' || (i % 50000) || '\"'".to_owned()),
        ("valor", "(i % 1000) || '.5'".to_owned()),
        ("turma.cidade", format!("'\"' || ({CITY_SQL}) || '\"'")),
        ("turma.codigo", "'\"T-' || (i % 1000) || '\"'".to_owned()),
        ("turma.uf", "'\"SP\"'".to_owned()),
    ]
}

/// The dead letters with ids `$1..=$2` (`i`), dead-lettered at `$3 + i` (unix ms), as one
/// `INSERT ... SELECT` with `id = i`; their fields written apart ([`fields_insert`]).
fn dead_letters_insert(backend: Backend) -> String {
    let body = body_sql();
    let headers = "'[[\":message-id\",\"m-' || i || '\"],[\":correlation-id\",\"pedido-' || \
                   (i / 2) || '\"],[\":content-type\",\"application/json\"]]'";
    let columns = "route, queue, reason, plugin, attempts, headers, body, first_failed_at, \
                   dead_lettered_at, replay_count, message_id, correlation_id";
    let values = format!(
        "'matriculas', 'matriculas.dlq', 'curso ' || (i % 400) || ' lotado', 'enrollment', 3, \
         {headers}"
    );
    let ids = "'m-' || i, 'pedido-' || (i / 2)";
    match backend {
        Backend::Sqlite => format!(
            "{} INSERT INTO dead_letters (id, {columns}) \
             SELECT i, {values}, CAST({body} AS BLOB), $3 + i - 60000, $3 + i, 0, {ids} FROM n",
            numbers(backend)
        ),
        Backend::Postgres => format!(
            "INSERT INTO dead_letters (id, {columns}) \
             SELECT i, {values}, convert_to({body}, 'UTF8'), $3 + i - 60000, $3 + i, 0, {ids} \
             FROM {}",
            numbers(backend)
        ),
    }
}

/// The numbers `$1..=$2` as `i`: SQLite's `WITH` clause, PostgreSQL's `FROM` item.
fn numbers(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => {
            "WITH RECURSIVE n(i) AS (SELECT $1 UNION ALL SELECT i + 1 FROM n WHERE i < $2)"
        }
        Backend::Postgres => "generate_series(CAST($1 AS BIGINT), CAST($2 AS BIGINT)) AS i",
    }
}

/// The fields of dead letters `$1..=$2`.
fn fields_insert(backend: Backend) -> String {
    let from = match backend {
        Backend::Sqlite => "n",
        Backend::Postgres => numbers(backend),
    };
    let selects: Vec<String> = fields_sql()
        .into_iter()
        .map(|(path, value)| format!("SELECT '{path}', {value}, i FROM {from}"))
        .collect();
    let with = match backend {
        Backend::Sqlite => numbers(backend),
        Backend::Postgres => "",
    };
    format!(
        "{with} INSERT INTO dead_letter_fields (path, value, dead_letter_id) {}",
        selects.join(" UNION ALL ")
    )
}

// ---------------------------------------------------------------- one backend's archive

struct Archive {
    backend: Backend,
    store: Store,
    /// A connection of its own for the fill, the checks and the baseline scans.
    raw: AnyConnection,
    _dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>, // (admin URL, database name)
    sqlite_file: Option<std::path::PathBuf>,
}

impl Archive {
    async fn new(s: &Settings, backend: Backend) -> Archive {
        let (url, dir, pg, sqlite_file) = match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("tempdir");
                let file = dir.path().join("search.db");
                let url = format!("sqlite://{}", file.display());
                (url, Some(dir), None, Some(file))
            }
            Backend::Postgres => {
                let admin = s.pg_admin.clone().expect("a PostgreSQL URL");
                let (name, url) = create_pg_database(&admin).await;
                (url, None, Some((admin, name)), None)
            }
        };
        let store = Store::connect(&url, 4).await.expect("connect the store");
        store.migrate().await.expect("migrate");
        // Store::connect installed sqlx's drivers for `Any`.
        let mut raw = AnyConnection::connect(&url)
            .await
            .expect("a raw connection");
        let fast = match backend {
            Backend::Sqlite => "PRAGMA synchronous = OFF",
            Backend::Postgres => "SET synchronous_commit = off",
        };
        raw.execute(fast).await.expect("fill settings");
        Archive {
            backend,
            store,
            raw,
            _dir: dir,
            pg,
            sqlite_file,
        }
    }

    /// Fills dead letters `1..=rows`, `chunk` per transaction; returns how long it took.
    async fn fill(&mut self, rows: i64, chunk: i64) -> Duration {
        let started = Instant::now();
        let insert = dead_letters_insert(self.backend);
        let fields = fields_insert(self.backend);
        let base = carteiro::common::now_ms() - rows * 1_000;
        let mut from = 1;
        while from <= rows {
            let to = (from + chunk - 1).min(rows);
            let mut tx = self.raw.begin().await.expect("begin");
            sqlx::query(AssertSqlSafe(insert.clone()))
                .bind(from)
                .bind(to)
                .bind(base)
                .execute(&mut *tx)
                .await
                .expect("insert dead letters");
            sqlx::query(AssertSqlSafe(fields.clone()))
                .bind(from)
                .bind(to)
                .execute(&mut *tx)
                .await
                .expect("insert their fields");
            tx.commit().await.expect("commit");
            from = to + 1;
            eprint!(
                "\r{} filled {to} of {rows} ({:.0} s)",
                self.backend.name(),
                started.elapsed().as_secs_f64()
            );
        }
        eprintln!();
        if self.backend == Backend::Postgres {
            // The ids were given: the archive's own inserts continue after them.
            let settle = [
                "SELECT setval(pg_get_serial_sequence('dead_letters', 'id'), \
                 (SELECT MAX(id) FROM dead_letters))",
                "VACUUM ANALYZE dead_letters",
                "VACUUM ANALYZE dead_letter_fields",
            ];
            for statement in settle {
                self.raw.execute(statement).await.expect("settle the fill");
            }
        }
        started.elapsed()
    }

    /// What the fill wrote as dead letter `i`'s fields, against the archive's own reading of
    /// the body it wrote.
    async fn check_fields(&mut self, i: i64) {
        let message_id = format!("m-{i}");
        let (id, stored_body): (i64, Vec<u8>) =
            sqlx::query_as("SELECT id, body FROM dead_letters WHERE message_id = $1")
                .bind(message_id.as_str())
                .fetch_one(&mut self.raw)
                .await
                .expect("a filled dead letter");
        let stored: Vec<(String, String)> =
            sqlx::query_as("SELECT path, value FROM dead_letter_fields WHERE dead_letter_id = $1")
                .bind(id)
                .fetch_all(&mut self.raw)
                .await
                .expect("its fields");
        assert_eq!(
            String::from_utf8_lossy(&stored_body),
            body(i),
            "the fill's body of dead letter {i}"
        );
        let mut expected: Vec<(String, String)> = body_fields(&stored_body)
            .into_iter()
            .map(|f| (f.path, f.value))
            .collect();
        let mut stored = stored;
        expected.sort();
        stored.sort();
        assert_eq!(
            stored, expected,
            "dead letter {i}: the fill's fields differ from what the archive writes"
        );
    }

    /// The baseline: dead letters whose body's `matricula_id` is `k`, newest first, by reading
    /// every body (no index); returns how many.
    async fn scan(&mut self, k: i64) -> usize {
        let rows: Vec<(i64,)> = match self.backend {
            Backend::Sqlite => sqlx::query_as(
                "SELECT id FROM dead_letters \
                 WHERE json_extract(CAST(body AS TEXT), '$.matricula_id') = $1 \
                 ORDER BY id DESC LIMIT 100",
            )
            .bind(k)
            .fetch_all(&mut self.raw)
            .await
            .expect("scan"),
            Backend::Postgres => sqlx::query_as(
                "SELECT id FROM dead_letters \
                 WHERE CAST(convert_from(body, 'UTF8') AS jsonb) ->> 'matricula_id' = $1 \
                 ORDER BY id DESC LIMIT 100",
            )
            .bind(k.to_string())
            .fetch_all(&mut self.raw)
            .await
            .expect("scan"),
        };
        rows.len()
    }

    /// The store's size on disk, for people.
    async fn size(&mut self) -> String {
        match self.backend {
            Backend::Sqlite => {
                let file = self.sqlite_file.as_ref().expect("the file");
                let mut bytes = 0;
                for suffix in ["", "-wal"] {
                    let path = format!("{}{suffix}", file.display());
                    bytes += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
                }
                format!("file {} MiB", bytes >> 20)
            }
            Backend::Postgres => {
                let (table, fields): (i64, i64) = sqlx::query_as(
                    "SELECT pg_total_relation_size('dead_letters'), \
                     pg_total_relation_size('dead_letter_fields')",
                )
                .fetch_one(&mut self.raw)
                .await
                .expect("sizes");
                format!(
                    "dead_letters with its indexes {} MiB, dead_letter_fields with its indexes \
                     {} MiB",
                    table >> 20,
                    fields >> 20
                )
            }
        }
    }

    async fn finish(self) {
        let Archive {
            store,
            raw,
            pg,
            _dir: dir,
            ..
        } = self;
        let _ = raw.close().await;
        drop(store);
        if let Some((admin, name)) = pg {
            drop_pg_database(&admin, &name).await;
        }
        drop(dir);
    }
}

// ---------------------------------------------------------------- the searches

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    MessageId,
    Correlation,
    Field,
    Nested,
    Common,
    TwoFields,
    Missed,
}

const KINDS: [Kind; 7] = [
    Kind::MessageId,
    Kind::Correlation,
    Kind::Field,
    Kind::Nested,
    Kind::Common,
    Kind::TwoFields,
    Kind::Missed,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::MessageId => "id:m-K",
            Kind::Correlation => "correlation:pedido-K",
            Kind::Field => "body.matricula_id = K",
            Kind::Nested => "body.turma.codigo = \"T-K\"",
            Kind::Common => "body.status = \"late\"",
            Kind::TwoFields => "body.matricula_id = K body.status = ..",
            Kind::Missed => "body.status = \"late\" route:cursos (none: stops at the cap)",
        }
    }
}

/// How many of `1..=rows` are `k` modulo `m`.
fn count_mod(rows: i64, m: i64, k: i64) -> i64 {
    if k == 0 {
        rows / m
    } else if k > rows {
        0
    } else {
        (rows - k) / m + 1
    }
}

fn field(path: &[&str], value: Value) -> BodyField {
    BodyField::new(path, &value).expect("a scalar field")
}

/// A search of `kind` with a random key, and the length of its answer (a page of 100).
fn query(kind: Kind, rng: &mut StdRng, rows: i64) -> (DeadLetterFilter, usize) {
    let mut terms = SearchTerms::default();
    let expected = match kind {
        Kind::MessageId => {
            terms.message_id = Some(format!("m-{}", rng.random_range(1..=rows)));
            1
        }
        Kind::Correlation => {
            terms.correlation_id = Some(format!("pedido-{}", rng.random_range(1..rows / 2)));
            2
        }
        Kind::Field => {
            let k = rng.random_range(1..=rows);
            terms.body = vec![field(&["matricula_id"], json!(k))];
            1
        }
        Kind::Nested => {
            let k = rng.random_range(0..1_000i64);
            terms.body = vec![field(&["turma", "codigo"], json!(format!("T-{k}")))];
            count_mod(rows, 1_000, k).min(100)
        }
        Kind::Common => {
            let s = rng.random_range(0..5i64);
            terms.body = vec![field(&["status"], json!(STATUSES[s as usize]))];
            count_mod(rows, 5, s).min(100)
        }
        Kind::TwoFields => {
            let k = rng.random_range(1..=rows);
            terms.body = vec![
                field(&["matricula_id"], json!(k)),
                field(&["status"], json!(STATUSES[(k % 5) as usize])),
            ];
            1
        }
        Kind::Missed => {
            terms.body = vec![field(&["status"], json!("late"))];
            0
        }
    };
    let filter = DeadLetterFilter {
        route: (kind == Kind::Missed).then(|| "cursos".to_owned()),
        search: terms,
        limit: Some(100),
        ..Default::default()
    };
    (filter, usize::try_from(expected).unwrap_or(0))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median and p99 of `samples`, in ms.
fn summary(samples: &[Duration]) -> (f64, f64) {
    let mut sorted = samples.to_vec();
    sorted.sort();
    (ms(percentile(&sorted, 0.5)), ms(percentile(&sorted, 0.99)))
}

/// Times `n` searches of `kind` (each answer's length checked).
async fn time_searches(
    store: &Store,
    kind: Kind,
    n: usize,
    rng: &mut StdRng,
    rows: i64,
) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let (filter, expected) = query(kind, rng, rows);
        let started = Instant::now();
        let found = store.dead_letters_list(&filter).await.expect("search");
        samples.push(started.elapsed());
        assert_eq!(
            found.len(),
            expected,
            "{}: {:?} found {} dead letters",
            kind.name(),
            filter.search,
            found.len()
        );
    }
    samples
}

// ---------------------------------------------------------------- the archive's cost

/// Archives `n` dead letters into the full archive, alternating a JSON body and the same
/// bytes made non-JSON; their timings (JSON, text), then checks each is found.
async fn time_archives(store: &Store, n: usize, rows: i64) -> (Vec<Duration>, Vec<Duration>) {
    let (mut json_bodies, mut text_bodies) = (Vec::new(), Vec::new());
    let mut probes = Vec::new();
    for j in 0..n {
        let i = rows + 1 + j as i64;
        let is_json = j % 2 == 0;
        let mut bytes = body(i).into_bytes();
        if !is_json {
            bytes.insert(0, b'#');
        }
        let message_id = format!("probe-{i}");
        let letter = NewDeadLetter {
            route: "matriculas".into(),
            queue: "matriculas.dlq".into(),
            reason: format!("curso {} lotado", i % 400),
            plugin: Some("enrollment".into()),
            attempts: 3,
            headers: vec![
                (":message-id".into(), message_id.clone()),
                (":content-type".into(), "application/json".into()),
            ],
            body: bytes,
            first_failed_at: None,
            dead_lettered_at: carteiro::common::now_ms(),
        };
        let started = Instant::now();
        store.dead_letter_insert(&letter).await.expect("archive");
        let took = started.elapsed();
        if is_json {
            json_bodies.push(took);
        } else {
            text_bodies.push(took);
        }
        probes.push((i, message_id, is_json));
    }
    for (i, message_id, is_json) in probes.iter().step_by(std::cmp::max(1, n / 50)) {
        let by_id = DeadLetterFilter {
            search: SearchTerms {
                message_id: Some(message_id.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            store.dead_letters_list(&by_id).await.expect("by id").len(),
            1
        );
        let by_field = DeadLetterFilter {
            search: SearchTerms {
                body: vec![field(&["matricula_id"], json!(i))],
                ..Default::default()
            },
            ..Default::default()
        };
        let found = store.dead_letters_list(&by_field).await.expect("by field");
        assert_eq!(found.len(), usize::from(*is_json), "probe {i}");
    }
    (json_bodies, text_bodies)
}

// ---------------------------------------------------------------- the run

/// `uptime`'s line (the load average), or `/proc/loadavg`.
fn load_average() -> String {
    std::process::Command::new("uptime")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .or_else(|| std::fs::read_to_string("/proc/loadavg").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

async fn run(s: &Settings, backend: Backend) {
    let name = backend.name();
    let mut archive = Archive::new(s, backend).await;
    let took = archive.fill(s.rows, s.chunk).await;
    println!(
        "{name}: {} dead letters filled in {:.1} s ({:.0}/s; SQL, transactions of {})",
        s.rows,
        took.as_secs_f64(),
        s.rows as f64 / took.as_secs_f64(),
        s.chunk
    );
    for i in [1, 2, 3, 4, 5, s.rows / 2, s.rows - 1, s.rows] {
        archive.check_fields(i).await;
    }

    let mut rng = StdRng::seed_from_u64(s.seed);
    let store = archive.store.clone();
    // Warm-up: the first reads of a freshly filled archive come from the disk.
    for kind in KINDS {
        time_searches(&store, kind, 20, &mut rng, s.rows).await;
    }
    archive.scan(1).await;

    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); KINDS.len()];
    let mut round_medians: Vec<Vec<f64>> = vec![Vec::new(); KINDS.len()];
    let mut scans = Vec::new();
    for round in 1..=s.rounds {
        for (n, kind) in KINDS.into_iter().enumerate() {
            let got = time_searches(&store, kind, s.queries, &mut rng, s.rows).await;
            round_medians[n].push(summary(&got).0);
            samples[n].extend(got);
        }
        for _ in 0..s.scans {
            let k = rng.random_range(1..=s.rows);
            let started = Instant::now();
            let found = archive.scan(k).await;
            scans.push(started.elapsed());
            assert_eq!(found, 1, "the scan of matricula_id {k}");
        }
        eprintln!("{name}: round {round} of {} done", s.rounds);
    }
    for (n, kind) in KINDS.into_iter().enumerate() {
        let (p50, p99) = summary(&samples[n]);
        let rounds: Vec<String> = round_medians[n].iter().map(|m| format!("{m:.3}")).collect();
        println!(
            "{name}: {:<40} median {p50:>9.3} ms  p99 {p99:>9.3} ms  ({} queries; round medians {} ms)",
            kind.name(),
            samples[n].len(),
            rounds.join(", ")
        );
    }
    let field_at = KINDS.iter().position(|k| *k == Kind::Field).unwrap_or(0);
    if !scans.is_empty() {
        let (p50, p99) = summary(&scans);
        let (indexed, _) = summary(&samples[field_at]);
        println!(
            "{name}: {:<40} median {p50:>9.3} ms  p99 {p99:>9.3} ms  ({} scans)",
            "baseline: matricula_id, every body read",
            scans.len()
        );
        println!(
            "{name}: body.matricula_id with the index / without: {:.0}x faster (medians)",
            p50 / indexed.max(1e-6)
        );
    }

    let (json_bodies, text_bodies) = time_archives(&store, s.archives, s.rows).await;
    let (json_p50, json_p99) = summary(&json_bodies);
    let (text_p50, text_p99) = summary(&text_bodies);
    println!(
        "{name}: archive into the full archive: JSON body (9 fields indexed) median {json_p50:.3} \
         ms p99 {json_p99:.3} ms; the same bytes not JSON median {text_p50:.3} ms p99 \
         {text_p99:.3} ms; JSON / not JSON {:.2} (medians, {} each)",
        json_p50 / text_p50.max(1e-6),
        json_bodies.len()
    );
    println!("{name}: store size: {}", archive.size().await);
    archive.finish().await;
}

#[tokio::main]
async fn main() {
    let s = settings();
    println!("load average at the start (uptime): {}", load_average());
    println!(
        "{} cores; {} dead letters per backend; {} queries of each kind x {} rounds",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        s.rows,
        s.queries,
        s.rounds
    );
    for backend in s.backends.clone() {
        run(&s, backend).await;
    }
}
