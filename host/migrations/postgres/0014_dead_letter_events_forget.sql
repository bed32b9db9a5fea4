-- A dead letter's history (`dead_letter_events`, migration 0010) goes with it, in the same
-- statement, whoever deletes it (`dlq purge`, the console, retention): each purge batch takes
-- its own dead letters' events along (found by `dead_letter_events_letter`). Until now one
-- `DELETE ... WHERE NOT EXISTS` after a purge read the whole history and deleted every
-- orphan in one transaction, undoing the batching of a retention purge of millions.
--
-- The orphans such a purge may have left behind (a purge stopped before its last statement).
DELETE FROM dead_letter_events e
WHERE NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.id = e.dead_letter_id);

ALTER TABLE dead_letter_events ADD CONSTRAINT dead_letter_events_letter_fkey
    FOREIGN KEY (dead_letter_id) REFERENCES dead_letters (id) ON DELETE CASCADE;
