-- The change outbox keeps each changed head as the JSON text the batch wrote (issue 25): the
-- relay only passes it on to the change topic, so parsing it into jsonb at every commit (and
-- printing it back at every relay read) was PostgreSQL work for nothing: ~2 ms of server CPU for
-- a 150 KB context-manifests head, against ~0.5 ms as text (both lz4), measured side by side.
ALTER TABLE al_changes ALTER COLUMN doc TYPE text USING doc::text;
DO $$
BEGIN
    ALTER TABLE al_changes ALTER COLUMN doc SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 not available; keeping pglz';
END $$;
