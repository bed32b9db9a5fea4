-- Foreign dead-letter queues (`[[dead_letter_queues]]`, docs/dead-letters.md): one row per dead
-- letter. A message redelivered after a crash between its archive commit and its ack carries
-- the same key (its queue, message id, `x-death` time and count, body digest), and the unique
-- index refuses the second row. Routes' dead letters have none (NULL never conflicts).
ALTER TABLE dead_letters ADD COLUMN dedupe_key TEXT;
CREATE UNIQUE INDEX dead_letters_dedupe_key ON dead_letters (dedupe_key);
