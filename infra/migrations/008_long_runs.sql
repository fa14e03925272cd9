-- Long runs (issue 15): a run's row no longer rewrites its whole state every batch.
--   head            what readers are given (SQL views, Redis): the state without the parts that
--                   grow with the run (those are history rows), written every batch
--   state           a checkpoint: the whole fold state as of checkpoint_seq
--   al_tail         the entries applied since the checkpoint (their original Avro bytes), each
--                   written once; the current whole state is the checkpoint with the tail folded
--                   on. A new checkpoint (when the tail outgrows the last one, reaches its count
--                   limit, or the run ends) replaces the tail.
ALTER TABLE al_run_state ADD COLUMN IF NOT EXISTS head jsonb;
ALTER TABLE al_run_state ADD COLUMN IF NOT EXISTS checkpoint_seq bigint;  -- NULL: applied_seq
ALTER TABLE al_run_state ADD COLUMN IF NOT EXISTS checkpoint_bytes bigint NOT NULL DEFAULT 0;
ALTER TABLE al_run_state ADD COLUMN IF NOT EXISTS tail_count integer NOT NULL DEFAULT 0;
ALTER TABLE al_run_state ADD COLUMN IF NOT EXISTS tail_bytes bigint NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS al_tail (
    projection  text    NOT NULL,
    build       text    NOT NULL,
    run_id      text    NOT NULL,
    sequence_no bigint  NOT NULL,
    payload     bytea   NOT NULL,  -- the entry's original Avro bytes
    PRIMARY KEY (projection, build, run_id, sequence_no)
);

DO $$
BEGIN
    ALTER TABLE al_run_state ALTER COLUMN head SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 not available; keeping pglz';
END $$;

-- The analysts' views read the head (the state of rows written before this migration).

-- One row per counted model call: a response reported twice is one row.
CREATE OR REPLACE VIEW al_cost_calls AS
SELECT
    h.doc ->> 'fleet_id'                             AS fleet_id,
    h.run_id                                         AS run_id,
    h.key                                            AS call_key,
    h.doc ->> 'response_id'                          AS response_id,
    h.doc ->> 'entry_id'                             AS entry_id,
    h.seq                                            AS seq,
    (h.doc ->> 'occurred_at')::timestamptz           AS occurred_at,
    (h.doc ->> 'day')::date                          AS day,
    h.doc ->> 'provider'                             AS provider,
    h.doc ->> 'model'                                AS model,
    h.doc ->> 'purpose'                              AS purpose,
    h.doc ->> 'status'                               AS status,
    (h.doc ->> 'input_tokens')::bigint               AS input_tokens,
    (h.doc ->> 'cached_input_tokens')::bigint        AS cached_input_tokens,
    (h.doc ->> 'output_tokens')::bigint              AS output_tokens,
    (h.doc ->> 'reasoning_tokens')::bigint           AS reasoning_tokens,
    (h.doc ->> 'latency_ms')::bigint                 AS latency_ms,
    (h.doc ->> 'cost_usd')::numeric                  AS cost_usd,
    (h.doc ->> 'provider_reported_cost_usd')::numeric AS provider_reported_cost_usd,
    (h.doc ->> 'cost_disagreement')::boolean         AS cost_disagreement,
    (h.doc ->> 'unpriced')::boolean                  AS unpriced,
    h.doc ->> 'price_version'                        AS price_version,
    (h.doc ->> 'price_effective_from')::date         AS price_effective_from,
    h.doc ->> 'normalizer'                           AS normalizer,
    (h.doc ->> 'normalizer_version')::integer        AS normalizer_version,
    (h.doc ->> 'usage_mismatch')::boolean            AS usage_mismatch,
    h.build                                          AS build
FROM al_history h
JOIN al_live l ON l.projection = h.projection AND l.build = h.build
WHERE h.projection = 'cost-metrics' AND h.kind = 'model_call';

-- One row per run: its cost totals and task budget.
CREATE OR REPLACE VIEW al_cost_runs AS
SELECT
    s.fleet_id                                                AS fleet_id,
    s.run_id                                                  AS run_id,
    (coalesce(s.head, s.state) -> 'totals' ->> 'calls')::integer                AS calls,
    (coalesce(s.head, s.state) -> 'totals' ->> 'failed_calls')::integer         AS failed_calls,
    (coalesce(s.head, s.state) -> 'totals' ->> 'input_tokens')::bigint          AS input_tokens,
    (coalesce(s.head, s.state) -> 'totals' ->> 'cached_input_tokens')::bigint   AS cached_input_tokens,
    (coalesce(s.head, s.state) -> 'totals' ->> 'output_tokens')::bigint         AS output_tokens,
    (coalesce(s.head, s.state) -> 'totals' ->> 'reasoning_tokens')::bigint      AS reasoning_tokens,
    (coalesce(s.head, s.state) -> 'totals' ->> 'latency_ms_sum')::bigint        AS latency_ms_sum,
    (coalesce(s.head, s.state) -> 'totals' ->> 'cost_usd')::numeric             AS cost_usd,
    (coalesce(s.head, s.state) -> 'totals' ->> 'unpriced_calls')::integer       AS unpriced_calls,
    (coalesce(s.head, s.state) -> 'totals' ->> 'reported_calls')::integer       AS reported_calls,
    (coalesce(s.head, s.state) -> 'totals' ->> 'provider_reported_cost_usd')::numeric AS provider_reported_cost_usd,
    (coalesce(s.head, s.state) -> 'totals' ->> 'cost_disagreements')::integer   AS cost_disagreements,
    (coalesce(s.head, s.state) ->> 'duplicate_reports')::integer                AS duplicate_reports,
    (coalesce(s.head, s.state) ->> 'task_budget_usd')::numeric                  AS task_budget_usd,
    (coalesce(s.head, s.state) ->> 'over_budget')::boolean                      AS over_budget,
    coalesce(s.head, s.state) ->> 'price_version'                               AS price_version,
    (coalesce(s.head, s.state) ->> 'normalizer_version')::integer               AS normalizer_version,
    (coalesce(s.head, s.state) ->> 'first_at')::timestamptz                     AS first_at,
    (coalesce(s.head, s.state) ->> 'last_at')::timestamptz                      AS last_at,
    s.applied_seq                                             AS applied_seq,
    s.updated_at                                              AS updated_at,
    s.build                                                   AS build
FROM al_run_state s
JOIN al_live l ON l.projection = s.projection AND l.build = s.build
WHERE s.projection = 'cost-metrics';

-- One row per diff snapshot, in each run's sequence order.
CREATE OR REPLACE VIEW al_diff_snapshots AS
SELECT
    s.fleet_id                                                       AS fleet_id,
    h.run_id                                                         AS run_id,
    h.seq                                                            AS seq,
    row_number() OVER (PARTITION BY h.run_id ORDER BY h.seq)         AS snapshot_no,
    h.key                                                            AS entry_id,
    (h.doc ->> 'occurred_at')::timestamptz                           AS occurred_at,
    jsonb_array_length(h.doc -> 'files')                             AS file_count,
    (h.doc ->> 'lines_added')::bigint                                AS lines_added,
    (h.doc ->> 'lines_deleted')::bigint                              AS lines_deleted,
    ARRAY(SELECT f ->> 'path' FROM jsonb_array_elements(h.doc -> 'files') f) AS paths,
    ARRAY(SELECT jsonb_array_elements_text(h.doc -> 'flags'))        AS flags,
    h.doc -> 'diff_artifact' ->> 'artifact_id'                       AS diff_artifact_id,
    h.doc ->> 'base_sha'                                             AS base_sha,
    h.doc ->> 'workspace_tree_hash'                                  AS workspace_tree_hash,
    h.doc -> 'files'                                                 AS files,
    h.build                                                          AS build
FROM al_history h
JOIN al_live l ON l.projection = h.projection AND l.build = h.build
JOIN al_run_state s ON s.projection = h.projection AND s.build = h.build AND s.run_id = h.run_id
WHERE h.projection = 'diff-timelines' AND h.kind = 'diff';

-- One row per file of each diff snapshot: churn across runs is a GROUP BY path away.
CREATE OR REPLACE VIEW al_diff_files AS
SELECT
    s.fleet_id                              AS fleet_id,
    h.run_id                                AS run_id,
    h.seq                                   AS seq,
    h.key                                   AS entry_id,
    (h.doc ->> 'occurred_at')::timestamptz  AS occurred_at,
    f ->> 'path'                            AS path,
    f ->> 'old_path'                        AS old_path,
    f ->> 'status'                          AS status,
    f ->> 'classification'                  AS classification,
    (f ->> 'lines_added')::bigint           AS lines_added,
    (f ->> 'lines_deleted')::bigint         AS lines_deleted,
    h.build                                 AS build
FROM al_history h
JOIN al_live l ON l.projection = h.projection AND l.build = h.build
JOIN al_run_state s ON s.projection = h.projection AND s.build = h.build AND s.run_id = h.run_id
CROSS JOIN LATERAL jsonb_array_elements(h.doc -> 'files') f
WHERE h.projection = 'diff-timelines' AND h.kind = 'diff';

-- One row per diff flag of a run: overreach, churn, verifier-gaming, generated-edit, out-of-scope.
CREATE OR REPLACE VIEW al_diff_flags AS
SELECT
    s.fleet_id                                                          AS fleet_id,
    s.run_id                                                            AS run_id,
    f ->> 'kind'                                                        AS kind,
    f ->> 'path'                                                        AS path,
    f ->> 'reason'                                                      AS reason,
    (f ->> 'raised_at_seq')::bigint                                     AS raised_at_seq,
    ARRAY(SELECT e ->> 'entry_id' FROM jsonb_array_elements(f -> 'evidence') e) AS evidence_entry_ids,
    ARRAY(SELECT (e ->> 'seq')::bigint FROM jsonb_array_elements(f -> 'evidence') e) AS evidence_seqs,
    s.build                                                             AS build
FROM al_run_state s
JOIN al_live l ON l.projection = s.projection AND l.build = s.build
CROSS JOIN LATERAL jsonb_array_elements(coalesce(s.head, s.state) -> 'flags') f
WHERE s.projection = 'diff-timelines';

-- One row per run: its failure class (final once finished, provisional before).
CREATE OR REPLACE VIEW al_failures AS
SELECT
    s.fleet_id                                                   AS fleet_id,
    s.run_id                                                     AS run_id,
    coalesce(s.head, s.state) -> 'classification' ->> 'failure_class'              AS failure_class,
    coalesce(s.head, s.state) -> 'classification' ->> 'rule'                       AS rule,
    (coalesce(s.head, s.state) -> 'classification' ->> 'final')::boolean           AS final,
    (coalesce(s.head, s.state) ->> 'finished')::boolean                            AS finished,
    coalesce(s.head, s.state) ->> 'status'                                         AS status,
    (coalesce(s.head, s.state) -> 'classification' ->> 'repair_loop')::boolean     AS repair_loop,
    coalesce(s.head, s.state) -> 'classification' ->> 'repair_signature'           AS repair_signature,
    (coalesce(s.head, s.state) -> 'classification' ->> 'repair_count')::integer    AS repair_count,
    coalesce(s.head, s.state) -> 'classification' ->> 'explanation'                AS explanation,
    coalesce(s.head, s.state) -> 'classification' ->> 'taxonomy_version'           AS taxonomy_version,
    ARRAY(
        SELECT e ->> 'entry_id'
        FROM jsonb_array_elements(coalesce(s.head, s.state) -> 'classification' -> 'evidence') e
    )                                                            AS evidence_entry_ids,
    coalesce(s.head, s.state) -> 'classification' -> 'evidence'                    AS evidence,
    (coalesce(rs.head, rs.state) ->> 'first_at')::timestamptz                       AS started_at,
    (coalesce(rs.head, rs.state) ->> 'last_at')::timestamptz                        AS last_at,
    s.applied_seq                                                AS applied_seq,
    s.updated_at                                                 AS updated_at,
    s.build                                                      AS build
FROM al_run_state s
JOIN al_live l ON l.projection = s.projection AND l.build = s.build
LEFT JOIN (
    al_run_state rs
    JOIN al_live lr ON lr.projection = rs.projection AND lr.build = rs.build
) ON rs.projection = 'run-stats' AND rs.run_id = s.run_id
WHERE s.projection = 'failure-classifications';
