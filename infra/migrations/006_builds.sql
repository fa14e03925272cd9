-- What a build is, for `rebuild list` and for the worker that resumes it: where it started, and
-- whether it skips runs that began before that start (a partial rebuild).
ALTER TABLE al_builds ADD COLUMN IF NOT EXISTS origin text NOT NULL DEFAULT 'live';
ALTER TABLE al_builds ADD COLUMN IF NOT EXISTS start_spec text;
ALTER TABLE al_builds ADD COLUMN IF NOT EXISTS whole_runs_only boolean NOT NULL DEFAULT false;
ALTER TABLE al_builds ADD COLUMN IF NOT EXISTS inputs jsonb NOT NULL DEFAULT '{}';
