-- Dead-letter retention (`[dead_letters] retain`, with its default `expire = "replayed"`)
-- deletes, a batch at a time, the replayed dead letters dead-lettered before a cutoff. This
-- index holds only replayed rows, in dead_lettered_at order, so each batch reads just the rows
-- it deletes, however many unreplayed dead letters the archive keeps. (`expire = "all"` reads
-- dead_letters_time, and the outbox's retention outbox_published_at, both from 0001.)
-- See host/src/store/dead_letters.rs `dead_letters_purge_expired`.
CREATE INDEX dead_letters_replayed_time ON dead_letters (dead_lettered_at)
    WHERE replayed_at IS NOT NULL;
