-- The relay's claim asks, once per claim, "which ordering keys have an unpublished row that
-- holds the key back (in backoff, or leased by another relay)?". Only rows that were ever
-- leased or failed can be such a row, so index just those: the claim reads about one
-- in-flight window of index entries, instead of probing every earlier pending row of a key
-- for every candidate (the old per-candidate NOT EXISTS, whose cost grew with the backlog).
-- The old per-key index served only that NOT EXISTS. Same on both backends.
DROP INDEX outbox_pending_ordering;
CREATE INDEX outbox_blocking ON outbox (ordering_key, id)
    WHERE published_at IS NULL AND (lease_owner IS NOT NULL OR attempts > 0);
