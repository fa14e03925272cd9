-- Which deployment a database holds: the topic prefix of the first worker, `infra up` or
-- private deployment that used it (infra.migrate.claim). A second deployment (another topic
-- prefix) pointed at the same database would mix its runs into the first's live builds, and a
-- rebuild of either, reading only its own topics, would swap in builds without the other's
-- runs; so anything that writes projections is refused there, with what to do.
CREATE TABLE IF NOT EXISTS al_deployment (
    only_row      boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    topic_prefix  text        NOT NULL,
    claimed_at    timestamptz NOT NULL DEFAULT now()
);
