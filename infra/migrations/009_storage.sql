-- PostgreSQL bytes per entry on real agents' run lengths (issue 15).
--   al_tail      rows are deleted whenever their run checkpoints; al_run_state rows (and their
--                TOAST chunks) are rewritten every batch: vacuum them by dead-row count, not by
--                a fraction of the table, so the space is reused before the table grows.
--   head         compressed with lz4 as the state is (004), where the server has it.
ALTER TABLE al_tail SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 5000);
ALTER TABLE al_run_state SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 1000,
    toast.autovacuum_vacuum_scale_factor = 0.0,
    toast.autovacuum_vacuum_threshold = 1000
);
DO $$
BEGIN
    ALTER TABLE al_run_state ALTER COLUMN head SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 not available; keeping pglz';
END $$;
