//! Placeholder lists for statements built per batch (`IN (...)`, multi-row `VALUES`).

use super::Dialect;

/// Most rows (or `IN` values) per batch statement: 128 outbox rows are 1,408 parameters,
/// well under SQLite's 32,766 and PostgreSQL's 65,535.
const MAX_ROWS: usize = 128;

/// Splits `items` into statement-sized chunks whose lengths come from a fixed set (128, 64,
/// 32, .., 1). sqlx caches prepared statements by their SQL text, so batches of any size
/// reuse at most eight shapes per statement instead of parsing a new one every time.
pub(super) fn shaped_chunks<T>(items: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = rest.len().min(MAX_ROWS);
        let (head, tail) = rest.split_at(1 << n.ilog2());
        rest = tail;
        Some(head)
    })
}

/// Placeholders in order of appearance, bound in the same order, as the dialect spells
/// them (`$1, $2, ...` on PostgreSQL, plain `?` on SQLite).
pub(super) struct Placeholders {
    dialect: &'static dyn Dialect,
    count: usize,
}

impl Placeholders {
    pub(super) fn new(dialect: &'static dyn Dialect) -> Self {
        Self { dialect, count: 0 }
    }

    pub(super) fn next(&mut self) -> String {
        let mut out = String::new();
        self.push(&mut out);
        out
    }

    fn push(&mut self, out: &mut String) {
        self.count += 1;
        self.dialect.placeholder(self.count, out);
    }

    /// `a, b, c` for `n` parameters.
    pub(super) fn list(&mut self, n: usize) -> String {
        let mut out = String::with_capacity(n * 6);
        self.push_list(&mut out, n);
        out
    }

    fn push_list(&mut self, out: &mut String, n: usize) {
        for i in 0..n {
            if i > 0 {
                out.push_str(", ");
            }
            self.push(out);
        }
    }

    /// `(a, b), (c, d), ...`: `rows` rows of `width` parameters.
    pub(super) fn rows(&mut self, rows: usize, width: usize) -> String {
        let mut out = String::with_capacity(rows * (width * 6 + 4));
        for i in 0..rows {
            out.push_str(if i > 0 { ", (" } else { "(" });
            self.push_list(&mut out, width);
            out.push(')');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Placeholders, shaped_chunks};
    use crate::store::{Postgres, Sqlite};

    #[test]
    fn chunks_come_in_few_shapes() {
        let items: Vec<u32> = (0..300).collect();
        let sizes: Vec<usize> = shaped_chunks(&items).map(<[u32]>::len).collect();
        assert_eq!(sizes, [128, 128, 32, 8, 4]);
        let rejoined: Vec<u32> = shaped_chunks(&items).flatten().copied().collect();
        assert_eq!(rejoined, items);
        assert_eq!(shaped_chunks::<u32>(&[]).count(), 0);
    }

    #[test]
    fn numbered_on_postgres_anonymous_on_sqlite() {
        let mut pg = Placeholders::new(&Postgres);
        assert_eq!(pg.next(), "$1");
        assert_eq!(pg.rows(2, 2), "($2, $3), ($4, $5)");
        let mut lite = Placeholders::new(&Sqlite);
        assert_eq!(lite.next(), "?");
        assert_eq!(lite.list(3), "?, ?, ?");
    }
}
