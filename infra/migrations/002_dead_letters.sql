-- Dead letters sent back to their source topic by `agentledger dlq redrive`, so none goes twice.
CREATE TABLE IF NOT EXISTS al_dlq_redriven (
    source_topic     text        NOT NULL,
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL,
    redriven_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_topic, source_partition, source_offset)
);
