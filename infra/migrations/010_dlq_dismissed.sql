-- Dead letters marked handled by `agentledger dlq dismiss` (with who-knows-why kept for audit):
-- the letter stays on its topic; lists show it as dismissed, and redrive leaves it alone.
CREATE TABLE IF NOT EXISTS al_dlq_dismissed (
    source_topic     text        NOT NULL,
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL,
    reason           text        NOT NULL,
    dismissed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_topic, source_partition, source_offset)
);
