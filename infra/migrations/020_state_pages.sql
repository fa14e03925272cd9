-- Bounded checkpoint rows (issue 25): a large checkpoint's members that grow with the run (the
-- evidence index of every entry id, ...) are stored in pages of 512 members, each named by the
-- hash of its content (projectors/paging.py). al_run_state.state names them; ``pages`` counts
-- them (0: the state is whole, nothing to look up). A checkpoint writes the pages it names that
-- are new and deletes its run's pages it no longer names, in the same transaction.
ALTER TABLE al_run_state ADD COLUMN IF NOT EXISTS pages integer NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS al_state_pages (
    projection  text  NOT NULL,
    build       text  NOT NULL,
    run_id      text  NOT NULL,
    page_id     text  NOT NULL,
    page        jsonb NOT NULL,
    PRIMARY KEY (projection, build, run_id, page_id)
);
ALTER TABLE al_state_pages SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 1000);
DO $$
BEGIN
    ALTER TABLE al_state_pages ALTER COLUMN page SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 not available; keeping pglz';
END $$;
