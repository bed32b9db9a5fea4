-- `[[outboxes]]`: the relay's bookkeeping of an application's own outbox table, kept here so
-- that the application's table needs no column beyond the published ones.

-- Rows whose publish failed: attempts, the last error, and when to try again
-- (9223372036854775807: parked, never again until an operator releases it).
CREATE TABLE application_outbox_failures (
    outbox TEXT NOT NULL,
    row_id BIGINT NOT NULL,
    event_id TEXT NOT NULL,
    ordering_key TEXT NOT NULL,
    attempts BIGINT NOT NULL,
    last_error TEXT NOT NULL,
    retry_at BIGINT NOT NULL,
    failed_at BIGINT NOT NULL,
    PRIMARY KEY (outbox, row_id)
);

-- Which relay publishes each outbox now; the others stand by until `expires_at`.
CREATE TABLE application_outbox_leaders (
    outbox TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
