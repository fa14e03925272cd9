-- Projection documents are rewritten every batch; lz4 compresses them several times faster than
-- the default pglz. Servers built without lz4 keep pglz.
DO $$
BEGIN
    ALTER TABLE al_run_state ALTER COLUMN state SET COMPRESSION lz4;
    ALTER TABLE al_history ALTER COLUMN doc SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 not available; keeping pglz';
END $$;
