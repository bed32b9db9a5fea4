-- Search (host/src/store/dead_letter_fields.rs, docs/dead-letters.md "Search"): dead letters
-- found by message id, by correlation id and by a field of a JSON body, each through an index,
-- at a million dead letters as at ten.
--
-- `message_id` and `correlation_id`: the first `:message-id` and `:correlation-id` property the
-- dead letter was archived with (the same text as the columns' stand-in: no NUL, at most
-- 1,024 bytes). Filled at archive time; filled here for the dead letters archived before,
-- from their headers' JSON, except where the headers hold a NUL anywhere (`\u0000`, which
-- jsonb refuses) or the id is over 1,024 bytes: those older rows are found by their other
-- terms only. The indexes carry `id` so a search's newest-first page needs no sort.
ALTER TABLE dead_letters ADD COLUMN message_id TEXT;
ALTER TABLE dead_letters ADD COLUMN correlation_id TEXT;

UPDATE dead_letters SET
    message_id = (
        SELECT CASE WHEN octet_length(h.e ->> 1) <= 1024 THEN h.e ->> 1 END
        FROM jsonb_array_elements(CAST(
            CASE WHEN strpos(headers, E'\\u0000') = 0 THEN headers ELSE '[]' END AS jsonb))
            WITH ORDINALITY AS h(e, n)
        WHERE h.e ->> 0 = ':message-id'
        ORDER BY h.n LIMIT 1),
    correlation_id = (
        SELECT CASE WHEN octet_length(h.e ->> 1) <= 1024 THEN h.e ->> 1 END
        FROM jsonb_array_elements(CAST(
            CASE WHEN strpos(headers, E'\\u0000') = 0 THEN headers ELSE '[]' END AS jsonb))
            WITH ORDINALITY AS h(e, n)
        WHERE h.e ->> 0 = ':correlation-id'
        ORDER BY h.n LIMIT 1)
WHERE strpos(headers, '":message-id"') > 0 OR strpos(headers, '":correlation-id"') > 0;

CREATE INDEX dead_letters_message_id ON dead_letters (message_id, id);
CREATE INDEX dead_letters_correlation_id ON dead_letters (correlation_id, id);

-- The scalar fields of each JSON body (at most 64, paths and values of at most 256 bytes) in
-- canonical form, as one object {"path": "value's JSON text", ...}; NULL without fields. A
-- search `body.matricula_id = 123` is `search_fields @> '{"matricula_id": "123"}'`: one GIN
-- entry (jsonb_path_ops hashes each path with its value). Filled at archive time only: dead
-- letters archived before this migration have none (their bodies are not parsed here; they
-- are found by message or correlation id).
ALTER TABLE dead_letters ADD COLUMN search_fields JSONB;
CREATE INDEX dead_letters_search_fields ON dead_letters USING GIN (search_fields jsonb_path_ops);
