-- Dead letters whose text the columns cannot hold as is (a NUL byte, which PostgreSQL text
-- refuses; a route too long for its index; a reason over 16 MiB) are stored with a visible
-- stand-in in the column and their exact original text here, as JSON
-- ({"route": "...", "reason": "...", "cut": {...}}); NULL when every column holds its text
-- verbatim. See host/src/store/dead_letter_text.rs.
ALTER TABLE dead_letters ADD COLUMN original TEXT;
