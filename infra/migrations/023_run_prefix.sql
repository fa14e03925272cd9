-- A run named by a prefix of its id (the CLI, the API, the pages, MCP) or by an id that is no
-- run (a 404): `runs_with_prefix` read every live run-stats row for it (40 ms at 100,000 runs,
-- measured). The database's collation (C.UTF-8) leaves the primary key unusable for a prefix,
-- so an index in byte order (text_pattern_ops), one row per run of each run-stats build:
-- 0.2 ms. The bounds are given as byte-order comparisons (~>=~, ~<~), whatever the plan.
CREATE INDEX IF NOT EXISTS al_run_state_run_prefix
    ON al_run_state (build, run_id text_pattern_ops) WHERE projection = 'run-stats';
