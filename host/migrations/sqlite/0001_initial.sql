-- Carteiro store, SQLite flavour. Same logical schema as ../postgres/0001_initial.sql:
-- timestamps are unix milliseconds (BIGINT), bytes are BLOB, headers are JSON text
-- ([["name","value"], ...], order and duplicates kept).

-- Idempotency records: one row per (route, idempotency key) whose effects committed.
CREATE TABLE inbox (
    route        TEXT   NOT NULL,
    key          TEXT   NOT NULL,
    processed_at BIGINT NOT NULL,
    PRIMARY KEY (route, key)
);
CREATE INDEX inbox_processed_at ON inbox (processed_at);

-- Plugin state; version starts at 1 and grows by one per write (optimistic concurrency).
-- A delete leaves a tombstone (value NULL, version+1) so a recreated key never gets back an
-- old version: a read made before the delete can never pass the check (no ABA).
CREATE TABLE kv (
    namespace  TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    value      BLOB,
    version    BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, key)
);

-- Transactional outbox. AUTOINCREMENT: ids never reused after purges.
CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        TEXT    NOT NULL UNIQUE,
    route           TEXT    NOT NULL,
    plugin          TEXT    NOT NULL,
    exchange        TEXT    NOT NULL,
    routing_key     TEXT    NOT NULL,
    headers         TEXT    NOT NULL,
    content_type    TEXT,
    payload         BLOB    NOT NULL,
    ordering_key    TEXT    NOT NULL,
    created_at      BIGINT  NOT NULL,
    published_at    BIGINT,
    attempts        BIGINT  NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at BIGINT  NOT NULL DEFAULT 0,
    lease_owner     TEXT,
    lease_until     BIGINT
);
-- The relay scans unpublished rows in id order.
CREATE INDEX outbox_pending ON outbox (id) WHERE published_at IS NULL;
-- Per ordering key: "is an earlier row of this key still unpublished?"
CREATE INDEX outbox_pending_ordering ON outbox (ordering_key, id) WHERE published_at IS NULL;
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;

-- Archived dead letters: queryable and replayable.
CREATE TABLE dead_letters (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    route            TEXT    NOT NULL,
    queue            TEXT    NOT NULL,
    reason           TEXT    NOT NULL,
    plugin           TEXT,
    attempts         BIGINT  NOT NULL,
    headers          TEXT    NOT NULL,
    body             BLOB    NOT NULL,
    first_failed_at  BIGINT,
    dead_lettered_at BIGINT  NOT NULL,
    replayed_at      BIGINT,
    replay_count     BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX dead_letters_route_time ON dead_letters (route, dead_lettered_at);
CREATE INDEX dead_letters_time ON dead_letters (dead_lettered_at);
