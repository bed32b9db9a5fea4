//! The filters `list`, `replay` and `purge` share, and the store filter they make.

use crate::store::DeadLetterFilter;

/// Filters shared by `list`, `replay` and `purge`. Times compare with `dead_lettered_at`:
/// when the gateway that gave up on the message stamped it (`x-carteiro-dead-lettered-at`,
/// that gateway's clock), or when it was archived if nobody did; "now" is this machine's
/// clock.
#[derive(Debug, clap::Args)]
pub struct FilterArgs {
    /// Only this route (work queue).
    #[arg(long)]
    pub route: Option<String>,
    /// Only reasons containing this text (case-sensitive, no wildcards).
    #[arg(long)]
    pub reason: Option<String>,
    /// Only dead letters dead-lettered within this long before now (at or after now − D),
    /// e.g. `1h`: the newest ones.
    #[arg(long, value_parser = crate::common::units::parse_duration)]
    pub since: Option<std::time::Duration>,
    /// Only dead letters dead-lettered more than this long before now (before now − D),
    /// e.g. `7d`: the oldest ones.
    #[arg(long, value_parser = crate::common::units::parse_duration)]
    pub older_than: Option<std::time::Duration>,
    /// Only dead letters this search finds, from the archive's indexes: `id:MESSAGE-ID`,
    /// `correlation:ID`, `body.PATH = VALUE` (VALUE a JSON number, "string", true, false or
    /// null; `body.a.b` is a nested field), `route:R`, `reason:TEXT`; terms separated by
    /// spaces all hold. E.g. --search 'body.matricula_id = 123'.
    #[arg(long, value_name = "QUERY")]
    pub search: Option<String>,
}

impl FilterArgs {
    /// The store filter; a search that does not parse (or contradicts `--route` or
    /// `--reason`) is refused with the column where it goes wrong.
    pub(super) fn filter(&self) -> anyhow::Result<DeadLetterFilter> {
        let ago = |d: std::time::Duration| {
            crate::common::now_ms().saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        };
        let filter = DeadLetterFilter {
            route: self.route.clone(),
            reason_contains: self.reason.clone(),
            since_ms: self.since.map(ago),
            until_ms: self.older_than.map(ago),
            ..Default::default()
        };
        let Some(query) = &self.search else {
            return Ok(filter);
        };
        let search = crate::dlq::search::parse(query)
            .map_err(|e| anyhow::anyhow!("--search: {e}\n{}", e.pointer(query)))?;
        search
            .narrow(filter)
            .map_err(|why| anyhow::anyhow!("--search: {why}"))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.route.is_none()
            && self.reason.is_none()
            && self.since.is_none()
            && self.older_than.is_none()
            && self.search.is_none()
    }
}
