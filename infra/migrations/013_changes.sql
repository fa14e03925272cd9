-- Change streams (issue 18): a transactional outbox. Every committed change of a live build's
-- key (its new head) is written here in the transaction that commits it, and a swap writes a
-- build marker plus the new build's state of every key in the transaction that moves the
-- pointer. The relay (streams/changes.py) sends these rows to `<prefix>.changes.<projection>`
-- in id order inside Kafka transactions and deletes them; al_change_relay holds, per change
-- topic partition, the offset from which a restarted relay looks for rows it sent but had not
-- deleted yet (so none is sent twice).
CREATE TABLE IF NOT EXISTS al_changes (
    id          bigserial PRIMARY KEY,
    projection  text        NOT NULL,
    build       text        NOT NULL,
    kind        text        NOT NULL,  -- state | build
    run_id      text,
    fleet_id    text,
    applied_seq bigint,
    held        integer,
    gaps        jsonb,
    doc         jsonb,
    traceparent text,
    previous    text,                  -- build markers: the build replaced
    committed   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS al_change_relay (
    topic       text    NOT NULL,
    "partition" integer NOT NULL,
    checked     bigint  NOT NULL,
    PRIMARY KEY (topic, "partition")
);
