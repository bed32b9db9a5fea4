//! Placeholder lists for statements built per batch (`IN (...)`, multi-row `VALUES`).

/// Bound parameters per statement, well under SQLite's 32,766 and PostgreSQL's 65,535.
pub(super) const MAX_PARAMS: usize = 8_000;

/// `$first+1, ..., $first+n`.
pub(super) fn params(n: usize, first: usize) -> String {
    (1..=n)
        .map(|i| format!("${}", first + i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `($2, .., $w+1, $1), ...`: rows of `width` own parameters followed by the shared `$1`.
pub(super) fn rows_with_shared_last(rows: usize, width: usize) -> String {
    (0..rows)
        .map(|row| format!("({}, $1)", params(width, 1 + row * width)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::{params, rows_with_shared_last};

    #[test]
    fn placeholders() {
        assert_eq!(params(3, 1), "$2, $3, $4");
        assert_eq!(rows_with_shared_last(2, 2), "($2, $3, $1), ($4, $5, $1)");
    }
}
