-- A replay claims a dead letter before publishing it (`replaying_by`, until `replaying_until`
-- by the database's clock), so two replays running at once (a console job and
-- `carteiro dlq replay`, a double click) split the rows instead of publishing each twice.
-- A claim whose run died expires on its own.
ALTER TABLE dead_letters ADD COLUMN replaying_by TEXT;
ALTER TABLE dead_letters ADD COLUMN replaying_until BIGINT;
