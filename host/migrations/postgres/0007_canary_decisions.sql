-- How a canary ended (rolled back, promoted, aborted), keyed by the plugin and the canary
-- component's digest, so the decision holds across restarts and reloads and for every
-- gateway on this store. A new canary version (another digest) starts afresh.
CREATE TABLE canary_decisions (
    plugin        TEXT   NOT NULL,
    canary_digest TEXT   NOT NULL,
    decision      TEXT   NOT NULL,
    reason        TEXT   NOT NULL,
    decided_at    BIGINT NOT NULL,
    PRIMARY KEY (plugin, canary_digest)
);
