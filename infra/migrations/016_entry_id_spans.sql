-- Entry ids in spans (issue 25: PostgreSQL bytes per entry). run-stats keeps each applied
-- sequence number's entry id so a conflicting duplicate can be told from a repeat (011). One
-- row per entry cost ~290 bytes an entry in heap and index; a batch applies a run's entries in
-- one consecutive span, so one row per span holds them: ids[n] is sequence first_seq + n - 1.
CREATE TABLE IF NOT EXISTS al_entry_id_spans (
    projection  text   NOT NULL,
    build       text   NOT NULL,
    run_id      text   NOT NULL,
    first_seq   bigint NOT NULL,
    ids         text[] NOT NULL,
    PRIMARY KEY (projection, build, run_id, first_seq)
);
INSERT INTO al_entry_id_spans (projection, build, run_id, first_seq, ids)
SELECT projection, build, run_id, sequence_no, ARRAY[entry_id] FROM al_entry_ids
ON CONFLICT DO NOTHING;
DROP TABLE IF EXISTS al_entry_ids;
