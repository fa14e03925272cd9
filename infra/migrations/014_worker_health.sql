-- Worker health (issue 25): each running worker process upserts its row every few seconds
-- (streams/health.py): the partitions it holds with their lag, when it last applied a batch,
-- and, from its supervisor, how often it was restarted and why it last exited. `infra status`
-- reads them (from any host) and exits non-zero when a worker has applied nothing for longer
-- than AGENTLEDGER_WORKER_STALL_S while its partitions have lag. A clean exit deletes the row.
CREATE TABLE IF NOT EXISTS al_worker_health (
    worker_id       text        PRIMARY KEY,   -- host:pid
    host            text        NOT NULL,
    pid             integer     NOT NULL,
    grp             text        NOT NULL,      -- the consumer group
    projections     text        NOT NULL,
    started_at      timestamptz NOT NULL,
    reported_at     timestamptz NOT NULL,
    last_applied_at timestamptz,               -- NULL: nothing applied yet
    batches         bigint      NOT NULL DEFAULT 0,
    records         bigint      NOT NULL DEFAULT 0,
    lag             jsonb       NOT NULL DEFAULT '{}'::jsonb,  -- {"topic:partition": entries}
    topics          integer     NOT NULL DEFAULT 0,
    restarts        integer     NOT NULL DEFAULT 0,
    last_exit       text
);
