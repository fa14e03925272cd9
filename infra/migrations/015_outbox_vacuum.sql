-- The change outbox's rows are deleted as soon as the relay sent them (issue 25: PostgreSQL
-- bytes per entry): vacuum it by dead-row count, as al_tail and al_run_state are (009), so the
-- space of sent changes is reused before the table grows.
ALTER TABLE al_changes SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 1000,
    toast.autovacuum_vacuum_scale_factor = 0.0,
    toast.autovacuum_vacuum_threshold = 1000
);
DO $$
BEGIN
    ALTER TABLE al_changes ALTER COLUMN doc SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 not available; keeping pglz';
END $$;
