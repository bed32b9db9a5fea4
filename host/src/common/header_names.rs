//! Carteiro's own AMQP headers: the attempt counter travels with the message through the
//! retry tiers (never derived from `x-death`), and dead letters carry their story. All of
//! them are sealed (`broker::seal`) and believed only when the seal holds.

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
/// The attempts a message made so far (bounded JSON, see `common::journey`), carried on its
/// retry and dead-letter copies so the archive can show its journey without a store write
/// per failed attempt.
pub const JOURNEY: &str = "x-carteiro-journey";
/// On a replay or an edited copy: the archive id of the dead letter it was sent from, so a
/// dead letter it becomes again is linked to it (`dead_letters.replay_of`).
pub const REPLAY_OF: &str = "x-carteiro-replay-of";

/// Pseudo-headers under which an archived dead letter keeps its AMQP properties, so a
/// replay restores them.
pub const PROP_MESSAGE_ID: &str = ":message-id";
pub const PROP_CONTENT_TYPE: &str = ":content-type";
pub const PROP_CORRELATION_ID: &str = ":correlation-id";
/// Further properties a foreign dead letter keeps (`foreign_dlq`), restored by its replay.
pub const PROP_CONTENT_ENCODING: &str = ":content-encoding";
pub const PROP_REPLY_TO: &str = ":reply-to";
pub const PROP_PRIORITY: &str = ":priority";
pub const PROP_TYPE: &str = ":type";
pub const PROP_APP_ID: &str = ":app-id";
/// A foreign dead letter's headers whose AMQP value is not a string (numbers, booleans, void,
/// arrays, tables), as one JSON object `{name: value}`: its replay sends them typed again (a
/// Celery worker reads `retries` as a number and `timelimit` as a list).
pub const TYPED_HEADERS: &str = ":typed-headers";
/// Where a foreign dead letter's replay goes: the exchange and routing key it was published
/// with before it died (its latest `x-death` record), or its publisher's
/// `x-original-exchange` / `x-original-routing-key` headers (the Celery snippet's copy).
pub const ORIGIN_EXCHANGE: &str = ":origin-exchange";
pub const ORIGIN_ROUTING_KEY: &str = ":origin-routing-key";
/// Reason headers a foreign consumer sets (docs/dead-letters.md, "Foreign dead-letter
/// queues"): the exception's type and its message.
pub const EXCEPTION_TYPE: &str = "x-exception-type";
pub const EXCEPTION: &str = "x-exception";
/// What a dead letter is searched by instead of its body (a JSON object), when its body is
/// not one: a Celery task's `{task, id, args, kwargs}` (`foreign_dlq::celery`).
pub const SEARCH_FIELDS: &str = ":search-fields";
/// Where a foreign publisher that dead-letters by hand says the message came from.
pub const ORIGIN_EXCHANGE_HEADER: &str = "x-original-exchange";
pub const ORIGIN_ROUTING_KEY_HEADER: &str = "x-original-routing-key";
