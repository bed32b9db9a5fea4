-- Secrets shared by every gateway on this store. `header-seal` is the HMAC key that seals
-- Carteiro's own x-carteiro-* headers on the copies it publishes (retry tiers, dead
-- letters, replays), so a header a publisher forged is never believed. Created on first
-- use by whichever gateway comes first; hex text, the same on both backends.
CREATE TABLE carteiro_secrets (
    name  TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
);
