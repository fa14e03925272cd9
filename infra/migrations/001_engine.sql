-- The projection engine's own tables. Every projection row is keyed by (projection, build) so a
-- rebuild writes a new build beside the live one.

CREATE TABLE IF NOT EXISTS al_offsets (
    projection  text        NOT NULL,
    build       text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,  -- last applied offset (inclusive)
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, build, topic, partition)
);

CREATE TABLE IF NOT EXISTS al_run_state (
    projection  text        NOT NULL,
    build       text        NOT NULL,
    run_id      text        NOT NULL,
    fleet_id    text        NOT NULL,
    applied_seq bigint      NOT NULL,  -- highest sequence applied with no gap below
    held        bigint[]    NOT NULL DEFAULT '{}',  -- sequence numbers waiting for a gap
    gaps        jsonb       NOT NULL DEFAULT '[]',  -- missing inclusive ranges [[lo, hi], ...]
    state       jsonb       NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, build, run_id)
);

CREATE INDEX IF NOT EXISTS al_run_state_incomplete
    ON al_run_state (projection, build) WHERE cardinality(held) > 0;

CREATE TABLE IF NOT EXISTS al_held (
    projection  text    NOT NULL,
    build       text    NOT NULL,
    run_id      text    NOT NULL,
    sequence_no bigint  NOT NULL,
    payload     bytea   NOT NULL,  -- the entry's original Avro bytes
    PRIMARY KEY (projection, build, run_id, sequence_no)
);

CREATE TABLE IF NOT EXISTS al_builds (
    projection  text        NOT NULL,
    build       text        NOT NULL,
    version     integer     NOT NULL,  -- the projection code's version that built it
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, build)
);

-- The build every reader follows, one row per projection.
CREATE TABLE IF NOT EXISTS al_live (
    projection  text PRIMARY KEY,
    build       text NOT NULL,
    swapped_at  timestamptz NOT NULL DEFAULT now()
);
