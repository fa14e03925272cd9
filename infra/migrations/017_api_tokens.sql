-- API tokens of `agentledger serve` (issue 29): only each token's SHA-256 is kept, never the
-- token; a token sees the runs of its fleets only. `token_id` is the short public name that
-- `tokens list` shows and `tokens revoke` takes.
CREATE TABLE IF NOT EXISTS al_api_tokens (
    token_id    text PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE,
    fleets      text[] NOT NULL,
    admin       boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    revoked_at  timestamptz
);
