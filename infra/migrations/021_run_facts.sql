-- The runs list's second index (issue 29: sorting by cost and the text search over 100,000 runs
-- answer from indexes, not by reading every run's documents). One narrow row per run of each
-- build of four other projections the list reads, with what the list sorts, searches and
-- filters on typed: cost-metrics' known cost (NULL when no call has a cost of ours: unknown,
-- never 0; the rule of projectors.cost_metrics.known_sum that the list's cost column shows),
-- working-memory's task and open problems, failure-classifications' explanation,
-- diff-timelines' repository (its state's, version 5 on). Kept by
-- triggers on al_run_state, in the same transaction as the row it mirrors (as al_run_list,
-- migration 019); a rebuild's new build gets its own rows. The documents stay the truth.
CREATE TABLE IF NOT EXISTS al_run_facts (
    projection  text NOT NULL,
    build       text NOT NULL,
    run_id      text NOT NULL,
    cost_usd    numeric,  -- cost-metrics: the known cost (NULL: unknown)
    task        text,     -- working-memory: task_goal
    problems    text,     -- working-memory: open_problems as JSON text
    explanation text,     -- failure-classifications: the classification's explanation
    repository  text,     -- diff-timelines: the repository the run-started entry names
    PRIMARY KEY (projection, build, run_id)
);

-- sort by cost, most first; the unknown ones (NULL) are read from al_run_list after these
CREATE INDEX IF NOT EXISTS al_run_facts_cost ON al_run_facts (projection, build, cost_usd DESC, run_id)
    WHERE cost_usd IS NOT NULL;
-- the repository filter
CREATE INDEX IF NOT EXISTS al_run_facts_repository ON al_run_facts (projection, build, repository)
    WHERE repository IS NOT NULL;

CREATE OR REPLACE FUNCTION al_run_facts_put() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d jsonb := coalesce(NEW.head, NEW.state);
    cost numeric;
    task text;
    problems text;
    explanation text;
    repository text;
BEGIN
    IF NEW.projection = 'cost-metrics' THEN
        IF (d -> 'totals' ->> 'calls')::integer > (d -> 'totals' ->> 'unpriced_calls')::integer
                + (d -> 'totals' ->> 'usage_unknown_calls')::integer THEN
            cost := (d -> 'totals' ->> 'cost_usd')::numeric;
        END IF;
    ELSIF NEW.projection = 'working-memory' THEN
        task := d ->> 'task_goal';
        problems := coalesce(d -> 'open_problems', '[]'::jsonb)::text;
    ELSIF NEW.projection = 'diff-timelines' THEN
        repository := d ->> 'repository';
    ELSE
        explanation := d -> 'classification' ->> 'explanation';
    END IF;
    INSERT INTO al_run_facts AS l (projection, build, run_id, cost_usd, task, problems, explanation,
                                   repository)
    VALUES (NEW.projection, NEW.build, NEW.run_id, cost, task, problems, explanation, repository)
    ON CONFLICT (projection, build, run_id) DO UPDATE SET
        cost_usd = EXCLUDED.cost_usd, task = EXCLUDED.task, problems = EXCLUDED.problems,
        explanation = EXCLUDED.explanation, repository = EXCLUDED.repository
    WHERE (l.cost_usd, l.task, l.problems, l.explanation, l.repository) IS DISTINCT FROM
          (EXCLUDED.cost_usd, EXCLUDED.task, EXCLUDED.problems, EXCLUDED.explanation,
           EXCLUDED.repository);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION al_run_facts_drop() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM al_run_facts
    WHERE projection = OLD.projection AND build = OLD.build AND run_id = OLD.run_id;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS al_run_facts_put ON al_run_state;
CREATE TRIGGER al_run_facts_put AFTER INSERT OR UPDATE ON al_run_state
    FOR EACH ROW
    WHEN (NEW.projection IN ('cost-metrics', 'working-memory', 'failure-classifications',
                         'diff-timelines'))
    EXECUTE FUNCTION al_run_facts_put();
DROP TRIGGER IF EXISTS al_run_facts_drop ON al_run_state;
CREATE TRIGGER al_run_facts_drop AFTER DELETE ON al_run_state
    FOR EACH ROW
    WHEN (OLD.projection IN ('cost-metrics', 'working-memory', 'failure-classifications',
                         'diff-timelines'))
    EXECUTE FUNCTION al_run_facts_drop();

-- Every run's facts from the documents already stored (as the trigger writes them).
INSERT INTO al_run_facts (projection, build, run_id, cost_usd, task, problems, explanation,
                          repository)
SELECT projection, build, run_id,
       CASE WHEN projection = 'cost-metrics'
                 AND (d -> 'totals' ->> 'calls')::integer
                     > (d -> 'totals' ->> 'unpriced_calls')::integer
                       + (d -> 'totals' ->> 'usage_unknown_calls')::integer
            THEN (d -> 'totals' ->> 'cost_usd')::numeric END,
       CASE WHEN projection = 'working-memory' THEN d ->> 'task_goal' END,
       CASE WHEN projection = 'working-memory'
            THEN coalesce(d -> 'open_problems', '[]'::jsonb)::text END,
       CASE WHEN projection = 'failure-classifications'
            THEN d -> 'classification' ->> 'explanation' END,
       CASE WHEN projection = 'diff-timelines' THEN d ->> 'repository' END
FROM (SELECT projection, build, run_id, coalesce(head, state) AS d FROM al_run_state
      WHERE projection IN ('cost-metrics', 'working-memory', 'failure-classifications',
                         'diff-timelines')) s
ON CONFLICT (projection, build, run_id) DO NOTHING;

-- The text search: trigram indexes serve ILIKE '%...%' (pg_trgm, in PostgreSQL's contrib,
-- which Debian's postgresql-15 ships). Where the extension cannot be made (no contrib, no right
-- to create it) the search stays correct and reads every run's facts instead.
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS pg_trgm;
    CREATE INDEX IF NOT EXISTS al_run_facts_task ON al_run_facts USING gin (task gin_trgm_ops);
    CREATE INDEX IF NOT EXISTS al_run_facts_problems ON al_run_facts
        USING gin (problems gin_trgm_ops);
    CREATE INDEX IF NOT EXISTS al_run_facts_explanation ON al_run_facts
        USING gin (explanation gin_trgm_ops);
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'pg_trgm not available (%): the runs list''s text search reads every run', SQLERRM;
END $$;

-- What `agentledger verify` last found for each live build it checked (the builds page's verify
-- state): one row per verify, the newest read. Verify wrote its verdicts nowhere before.
CREATE TABLE IF NOT EXISTS al_verify_verdicts (
    projection    text        NOT NULL,
    build         text        NOT NULL,  -- the live build verified
    verified_at   timestamptz NOT NULL DEFAULT now(),
    equal         boolean     NOT NULL,
    runs          integer     NOT NULL,
    differences   jsonb       NOT NULL,  -- the first differences named (verify's limit)
    PRIMARY KEY (projection, build, verified_at)
);
