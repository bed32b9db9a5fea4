//! Placeholder lists for statements built per batch (`IN (...)`, multi-row `VALUES`).

use super::Backend;

/// Bound parameters per statement, well under SQLite's 32,766 and PostgreSQL's 65,535.
pub(super) const MAX_PARAMS: usize = 8_000;

/// Placeholders in order of appearance, bound in the same order: `$1, $2, ...` on
/// PostgreSQL, plain `?` on SQLite. (SQLite looks `$N` names up by linear scan when it
/// prepares and binds, which makes a statement with thousands of them quadratic.)
pub(super) struct Placeholders {
    backend: Backend,
    count: usize,
}

impl Placeholders {
    pub(super) fn new(backend: Backend) -> Self {
        Self { backend, count: 0 }
    }

    pub(super) fn next(&mut self) -> String {
        self.count += 1;
        match self.backend {
            Backend::Postgres => format!("${}", self.count),
            Backend::Sqlite => "?".to_owned(),
        }
    }

    /// `a, b, c` for `n` parameters.
    pub(super) fn list(&mut self, n: usize) -> String {
        (0..n).map(|_| self.next()).collect::<Vec<_>>().join(", ")
    }

    /// `(a, b), (c, d), ...`: `rows` rows of `width` parameters.
    pub(super) fn rows(&mut self, rows: usize, width: usize) -> String {
        (0..rows)
            .map(|_| format!("({})", self.list(width)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::{Backend, Placeholders};

    #[test]
    fn numbered_on_postgres_anonymous_on_sqlite() {
        let mut pg = Placeholders::new(Backend::Postgres);
        assert_eq!(pg.next(), "$1");
        assert_eq!(pg.rows(2, 2), "($2, $3), ($4, $5)");
        let mut lite = Placeholders::new(Backend::Sqlite);
        assert_eq!(lite.next(), "?");
        assert_eq!(lite.list(3), "?, ?, ?");
    }
}
