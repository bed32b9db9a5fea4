-- A dead letter's history (`dead_letter_events`, migration 0010) goes with it, in the same
-- statement, whoever deletes it (`dlq purge`, the console, retention): each purge batch takes
-- its own dead letters' events along. Until now one `DELETE ... WHERE NOT EXISTS` after a
-- purge read the whole history and deleted every orphan in one transaction, undoing the
-- batching of a retention purge of millions.
--
-- The orphans such a purge may have left behind (a purge stopped before its last statement).
DELETE FROM dead_letter_events
WHERE NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.id = dead_letter_events.dead_letter_id);

CREATE TRIGGER dead_letter_events_forget AFTER DELETE ON dead_letters
BEGIN
    DELETE FROM dead_letter_events WHERE dead_letter_id = OLD.id;
END;
