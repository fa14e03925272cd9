-- Schema v3 and cost-metrics v2 (issue 17): cache writes, calls of unknown usage or latency
-- (NULL, never 0: sums and averages skip them), and the totals an agent reported for the whole
-- run beside the per-call sums. Columns are added at the end (CREATE OR REPLACE VIEW keeps the
-- existing ones as they are).

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
    h.build                                          AS build,
    (h.doc ->> 'cache_write_input_tokens')::bigint   AS cache_write_input_tokens
FROM al_history h
JOIN al_live l ON l.projection = h.projection AND l.build = h.build
WHERE h.projection = 'cost-metrics' AND h.kind = 'model_call';

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
    s.build                                                   AS build,
    (coalesce(s.head, s.state) -> 'totals' ->> 'cache_write_input_tokens')::bigint AS cache_write_input_tokens,
    (coalesce(s.head, s.state) -> 'totals' ->> 'latency_calls')::integer        AS latency_calls,
    (coalesce(s.head, s.state) -> 'totals' ->> 'usage_unknown_calls')::integer  AS usage_unknown_calls,
    (coalesce(s.head, s.state) -> 'reported_totals' ->> 'cost_usd')::numeric    AS reported_cost_usd,
    (coalesce(s.head, s.state) -> 'reported_totals' ->> 'input_tokens')::bigint AS reported_input_tokens,
    (coalesce(s.head, s.state) -> 'reported_totals' ->> 'output_tokens')::bigint AS reported_output_tokens,
    (coalesce(s.head, s.state) -> 'reported_totals' ->> 'calls')::integer       AS reported_run_calls,
    (coalesce(s.head, s.state) ->> 'reported_disagrees')::boolean               AS reported_disagrees
FROM al_run_state s
JOIN al_live l ON l.projection = s.projection AND l.build = s.build
WHERE s.projection = 'cost-metrics';
