-- The console's dead-letter groups (COUNT, unreplayed, first and last seen per route and
-- reason) read this index alone, in (route, reason) order: no sort and no table lookups, at a
-- million dead letters too. See host/src/store/dead_letters.rs `dead_letter_groups`.
CREATE INDEX dead_letters_groups ON dead_letters (route, reason, dead_lettered_at, replayed_at);
