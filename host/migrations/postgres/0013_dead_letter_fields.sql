-- Search with a bounded cost (host/src/store/dead_letters/search_page.rs, docs/dead-letters.md
-- "Search"): a body field's dead letters as B-tree entries (path, value, dead_letter_id), as on
-- SQLite, instead of the GIN index over `search_fields` of migration 0011.
--
-- A GIN index answers `search_fields @> ...` with every dead letter that has the field, at
-- once and in no order: a search whose other terms (a route, a second field) reject most of
-- them read them all, however few it showed (338 ms for 0 rows at a million). A B-tree walks
-- one field's dead letters newest first and stops where the page is full or where the search
-- gives up (`SEARCH_EXAMINED_MAX` entries), which a GIN scan cannot.
CREATE TABLE dead_letter_fields (
    path           TEXT   NOT NULL,
    value          TEXT   NOT NULL,
    dead_letter_id BIGINT NOT NULL REFERENCES dead_letters (id) ON DELETE CASCADE,
    PRIMARY KEY (path, value, dead_letter_id)
);
-- The cascade finds a deleted dead letter's fields by it.
CREATE INDEX dead_letter_fields_letter ON dead_letter_fields (dead_letter_id);

-- The fields archived since migration 0011, moved over as they are (the same canonical text).
INSERT INTO dead_letter_fields (path, value, dead_letter_id)
SELECT f.key, f.value, d.id
FROM dead_letters d, jsonb_each_text(d.search_fields) AS f
WHERE d.search_fields IS NOT NULL;

DROP INDEX dead_letters_search_fields;
ALTER TABLE dead_letters DROP COLUMN search_fields;
