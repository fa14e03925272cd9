-- The runs list's index (issue 29: the runs list over 100,000 runs answers from indexes, not
-- scans). One narrow row per run of each run-stats build, with the columns the list sorts and
-- filters on typed, kept by triggers on al_run_state: written in the same transaction as the
-- run-stats row it mirrors, so it is never behind it. The documents stay the truth; this holds
-- nothing they do not say. (Expression indexes on al_run_state itself would make every update
-- of every projection's rows a non-HOT update, since head and state change on each.)
CREATE TABLE IF NOT EXISTS al_run_list (
    build     text NOT NULL,  -- a run-stats build
    run_id    text NOT NULL,
    fleet_id  text NOT NULL,
    status    text,           -- NULL: not finished
    entries   bigint,
    first_at  timestamptz,
    last_at   timestamptz,
    conflicts integer NOT NULL DEFAULT 0,
    PRIMARY KEY (build, run_id)
);

CREATE INDEX IF NOT EXISTS al_run_list_last ON al_run_list (build, last_at DESC NULLS LAST, run_id);
CREATE INDEX IF NOT EXISTS al_run_list_first ON al_run_list (build, first_at DESC NULLS LAST, run_id);
CREATE INDEX IF NOT EXISTS al_run_list_entries ON al_run_list (build, entries DESC, run_id);

CREATE OR REPLACE FUNCTION al_run_list_put() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d jsonb := coalesce(NEW.head, NEW.state);
BEGIN
    INSERT INTO al_run_list AS l (build, run_id, fleet_id, status, entries, first_at, last_at,
                                  conflicts)
    VALUES (NEW.build, NEW.run_id, NEW.fleet_id, d ->> 'status', (d ->> 'entries')::bigint,
            (d ->> 'first_at')::timestamptz, (d ->> 'last_at')::timestamptz, NEW.conflicts)
    ON CONFLICT (build, run_id) DO UPDATE SET
        fleet_id = EXCLUDED.fleet_id, status = EXCLUDED.status, entries = EXCLUDED.entries,
        first_at = EXCLUDED.first_at, last_at = EXCLUDED.last_at, conflicts = EXCLUDED.conflicts;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION al_run_list_drop() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM al_run_list WHERE build = OLD.build AND run_id = OLD.run_id;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS al_run_list_put ON al_run_state;
CREATE TRIGGER al_run_list_put AFTER INSERT OR UPDATE ON al_run_state
    FOR EACH ROW WHEN (NEW.projection = 'run-stats') EXECUTE FUNCTION al_run_list_put();
DROP TRIGGER IF EXISTS al_run_list_drop ON al_run_state;
CREATE TRIGGER al_run_list_drop AFTER DELETE ON al_run_state
    FOR EACH ROW WHEN (OLD.projection = 'run-stats') EXECUTE FUNCTION al_run_list_drop();

INSERT INTO al_run_list (build, run_id, fleet_id, status, entries, first_at, last_at, conflicts)
SELECT build, run_id, fleet_id, coalesce(head, state) ->> 'status',
       (coalesce(head, state) ->> 'entries')::bigint,
       (coalesce(head, state) ->> 'first_at')::timestamptz,
       (coalesce(head, state) ->> 'last_at')::timestamptz, conflicts
FROM al_run_state WHERE projection = 'run-stats'
ON CONFLICT (build, run_id) DO NOTHING;
