-- What a projection keeps besides each run's current state: working-memory snapshot versions,
-- recorded context manifests. Append-only per build; (kind, key) identifies a row in a run.
CREATE TABLE IF NOT EXISTS al_history (
    projection  text    NOT NULL,
    build       text    NOT NULL,
    run_id      text    NOT NULL,
    kind        text    NOT NULL,  -- e.g. 'snapshot', 'manifest'
    key         text    NOT NULL,  -- e.g. the snapshot version, the model call's entry id
    seq         bigint  NOT NULL,  -- the run's sequence number the row reflects
    doc         jsonb   NOT NULL,
    PRIMARY KEY (projection, build, run_id, kind, key)
);

CREATE INDEX IF NOT EXISTS al_history_by_seq ON al_history (projection, build, run_id, kind, seq);
