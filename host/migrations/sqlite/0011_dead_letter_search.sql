-- Search (host/src/store/dead_letter_fields.rs, docs/dead-letters.md "Search"): dead letters
-- found by message id, by correlation id and by a field of a JSON body, each with one indexed
-- equality, at a million dead letters as at ten.
--
-- `message_id` and `correlation_id`: the first `:message-id` and `:correlation-id` property the
-- dead letter was archived with (the same text as the columns' stand-in: no NUL, at most
-- 1,024 bytes). Filled at archive time; filled here for the dead letters archived before,
-- from their headers' JSON, except where the headers hold a NUL anywhere (`\u0000`) or the id
-- is over 1,024 bytes: those older rows are found by their other terms only.
ALTER TABLE dead_letters ADD COLUMN message_id TEXT;
ALTER TABLE dead_letters ADD COLUMN correlation_id TEXT;

UPDATE dead_letters SET
    message_id = (
        SELECT json_extract(h.value, '$[1]') FROM json_each(dead_letters.headers) AS h
        WHERE json_extract(h.value, '$[0]') = ':message-id'
        ORDER BY h.key LIMIT 1),
    correlation_id = (
        SELECT json_extract(h.value, '$[1]') FROM json_each(dead_letters.headers) AS h
        WHERE json_extract(h.value, '$[0]') = ':correlation-id'
        ORDER BY h.key LIMIT 1)
WHERE instr(headers, '\u0000') = 0 AND json_valid(headers)
    AND (instr(headers, '":message-id"') > 0 OR instr(headers, '":correlation-id"') > 0);
UPDATE dead_letters SET message_id = NULL WHERE length(CAST(message_id AS BLOB)) > 1024;
UPDATE dead_letters SET correlation_id = NULL
    WHERE length(CAST(correlation_id AS BLOB)) > 1024;

CREATE INDEX dead_letters_message_id ON dead_letters (message_id);
CREATE INDEX dead_letters_correlation_id ON dead_letters (correlation_id);

-- The scalar fields of each JSON body (at most 64, paths and values of at most 256 bytes), in
-- canonical form: a search `body.matricula_id = 123` reads the primary key for
-- ('matricula_id', '123') and then each dead letter by its id. WITHOUT ROWID: the table is its
-- own index. Filled at archive time only: dead letters archived before this migration have
-- no fields (their bodies are not parsed here; they are found by message or correlation id).
CREATE TABLE dead_letter_fields (
    path           TEXT    NOT NULL,
    value          TEXT    NOT NULL,
    dead_letter_id INTEGER NOT NULL,
    PRIMARY KEY (path, value, dead_letter_id)
) WITHOUT ROWID;
CREATE INDEX dead_letter_fields_letter ON dead_letter_fields (dead_letter_id);

-- A dead letter's fields go with it, whoever deletes it (`dlq purge`, the console, retention).
CREATE TRIGGER dead_letter_fields_forget AFTER DELETE ON dead_letters
BEGIN
    DELETE FROM dead_letter_fields WHERE dead_letter_id = OLD.id;
END;
