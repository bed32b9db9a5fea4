-- An edited copy's idempotency key, claimed on its route until the copy settles
-- (host/src/store/edit_claims.rs): the route's inbox cannot see a copy still in its queue,
-- so without this a second edit keeping the key would be sent too, and acked as a duplicate
-- of the first without running the handler. Settled: the route applied the key (inbox), or
-- the copy came back as a dead letter of its own (`replay_of` = `dead_letter_id`, same
-- `message_id`: the archive deletes the claim), or `claimed_until` passed.
CREATE TABLE dead_letter_edit_claims (
    route          TEXT   NOT NULL,
    key            TEXT   NOT NULL,
    dead_letter_id BIGINT NOT NULL,
    message_id     TEXT,
    claimed_by     TEXT   NOT NULL,
    claimed_at     BIGINT NOT NULL,
    claimed_until  BIGINT NOT NULL,
    PRIMARY KEY (route, key)
);
CREATE INDEX dead_letter_edit_claims_letter ON dead_letter_edit_claims (dead_letter_id);
