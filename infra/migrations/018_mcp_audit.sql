-- Reads through the MCP server (`agentledger mcp`, issue 30), counted per token, tool (or
-- resource) and run: who read which run, how often, and at which applied sequence number the
-- last and the highest answer stood. `run_id` is '' for reads of no one run (the run list).
-- `refused` counts the reads that found nothing the token may see (an unknown run, or a run of
-- another fleet: the same answer).
CREATE TABLE IF NOT EXISTS al_mcp_reads (
    token_id    text        NOT NULL,
    tool        text        NOT NULL,
    run_id      text        NOT NULL DEFAULT '',
    reads       bigint      NOT NULL DEFAULT 0,
    refused     bigint      NOT NULL DEFAULT 0,
    last_seq    bigint,
    max_seq     bigint,
    first_at    timestamptz NOT NULL DEFAULT now(),
    last_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (token_id, tool, run_id)
);
