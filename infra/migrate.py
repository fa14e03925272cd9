"""Apply ``infra/migrations/*.sql`` in order, each once, under an advisory lock (idempotent)."""

from __future__ import annotations

from importlib import resources

import psycopg

_LOCK = 0x41474C44  # "AGLD": one migrator at a time across workers


def migration_files() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every migration, in version order."""
    folder = resources.files("infra") / "migrations"
    found = []
    for item in folder.iterdir():
        if item.name.endswith(".sql"):
            version = int(item.name.split("_", 1)[0])
            found.append((version, item.name, item.read_text()))
    return sorted(found)


def migrate(dsn: str) -> list[str]:
    """Apply what is missing; return the names applied now."""
    applied_now = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS al_schema_migrations "
                "(version integer PRIMARY KEY, name text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {v for (v,) in conn.execute("SELECT version FROM al_schema_migrations")}
            for version, name, sql in migration_files():
                if version in done:
                    continue
                with conn.transaction():
                    conn.execute(sql.encode())
                    conn.execute(
                        "INSERT INTO al_schema_migrations (version, name) VALUES (%s, %s)",
                        (version, name),
                    )
                applied_now.append(name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK,))
    return applied_now
