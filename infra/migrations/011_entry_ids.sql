-- Conflicting duplicates (issue 16): the entry id applied at each sequence number of a run, for
-- the projection that keeps them (run-stats), so a different entry sent under a number already
-- taken is told from a repeat of the same one; and how many such conflicts each run had.
CREATE TABLE IF NOT EXISTS al_entry_ids (
    projection  text   NOT NULL,
    build       text   NOT NULL,
    run_id      text   NOT NULL,
    sequence_no bigint NOT NULL,
    entry_id    text   NOT NULL,
    PRIMARY KEY (projection, build, run_id, sequence_no)
);
ALTER TABLE al_run_state ADD COLUMN IF NOT EXISTS conflicts integer NOT NULL DEFAULT 0;
