-- The partition a run's entries come from. A run lives on one partition (records are keyed by
-- run id); an entry of the run found on another one (a topic given more partitions, a producer
-- with its own partitioner) is dead-lettered instead of being applied by two workers at once.
ALTER TABLE al_run_state ADD COLUMN IF NOT EXISTS topic text;
ALTER TABLE al_run_state ADD COLUMN IF NOT EXISTS "partition" integer;
