-- One row the store gate rewrites to prove the store takes writes (a held lock, a full disk,
-- a read-only file or a revoked grant fail it), not only that it answers reads.
CREATE TABLE carteiro_write_probe (
    id        INTEGER NOT NULL PRIMARY KEY,
    probed_at BIGINT NOT NULL
);
