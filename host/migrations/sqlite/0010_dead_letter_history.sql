-- A dead letter's history beyond its row (host/src/store/dead_letter_history.rs):
-- - `replay_of`: the dead letter whose replay (or edited copy) this one is, from the sealed
--   `x-carteiro-replay-of` header the copy carried back; a message's journey follows it.
-- - `edited_at`: an edited copy of this dead letter was sent (its last edit); its original is
--   never replayed again (replay claims skip edited rows).
-- - `dead_letter_events`: each replay and each edit of a dead letter, who made it and when;
--   an edit keeps what changed (`detail`, JSON) and the body it sent (`body`). The archived
--   row itself is never changed: the original stays as it was dead-lettered.
ALTER TABLE dead_letters ADD COLUMN replay_of BIGINT;
ALTER TABLE dead_letters ADD COLUMN edited_at BIGINT;
CREATE INDEX dead_letters_replay_of ON dead_letters (replay_of) WHERE replay_of IS NOT NULL;

CREATE TABLE dead_letter_events (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    dead_letter_id BIGINT  NOT NULL,
    kind           TEXT    NOT NULL,
    happened_at    BIGINT  NOT NULL,
    actor          TEXT,
    detail         TEXT    NOT NULL,
    body           BLOB
);
CREATE INDEX dead_letter_events_letter ON dead_letter_events (dead_letter_id, id);
