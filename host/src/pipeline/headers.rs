//! Carteiro's own AMQP headers: the attempt counter travels with the message through the
//! retry tiers (never derived from `x-death`), and dead letters carry their story.

pub const ATTEMPT: &str = "x-carteiro-attempt";
pub const FIRST_FAILURE_AT: &str = "x-carteiro-first-failure-at";
pub const LAST_FAILURE_AT: &str = "x-carteiro-last-failure-at";
pub const LAST_REASON: &str = "x-carteiro-last-reason";
pub const REASON: &str = "x-carteiro-reason";
pub const FAILURE_KIND: &str = "x-carteiro-failure";
pub const PLUGIN: &str = "x-carteiro-plugin";
pub const PLUGIN_SHA256: &str = "x-carteiro-plugin-sha256";
pub const ATTEMPTS: &str = "x-carteiro-attempts";
pub const ROUTE: &str = "x-carteiro-route";
pub const ORIGINAL_EXCHANGE: &str = "x-carteiro-original-exchange";
pub const ORIGINAL_ROUTING_KEY: &str = "x-carteiro-original-routing-key";
pub const DEAD_LETTERED_AT: &str = "x-carteiro-dead-lettered-at";

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
