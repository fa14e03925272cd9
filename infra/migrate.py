"""Apply ``infra/migrations/*.sql`` in order, each once, under an advisory lock (idempotent)."""

from __future__ import annotations

from importlib import resources

import psycopg
from psycopg.conninfo import conninfo_to_dict

from infra.errors import DeploymentMismatchError
from schemas.topics import prefix_of_ledger_topic

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


def claim(dsn: str, topic_prefix: str) -> None:
    """Record that this database holds the deployment of ``topic_prefix`` (the first to ask
    claims it), or raise DeploymentMismatchError when it holds another's: one deployment per
    database, so no worker or rebuild mixes two deployments' runs (migration 024)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT topic_prefix FROM al_deployment").fetchone()
        if row is None:
            # a database used before claims existed: held by the deployment whose positions
            # its live builds keep (not by whatever starts first after the upgrade; found by a
            # review)
            topics = conn.execute(
                "SELECT DISTINCT o.topic FROM al_offsets o JOIN al_live l USING (projection, build)"
            ).fetchall()
            used = sorted({p for (t,) in topics if (p := prefix_of_ledger_topic(str(t)))})
            if used and topic_prefix not in used:
                raise _mismatch(dsn, " or ".join(repr(p) for p in used), topic_prefix)
            conn.execute(
                "INSERT INTO al_deployment (topic_prefix) VALUES (%s) ON CONFLICT DO NOTHING",
                (topic_prefix,),
            )
            row = conn.execute("SELECT topic_prefix FROM al_deployment").fetchone()
    holder = str(row[0]) if row else topic_prefix
    if holder != topic_prefix:
        raise _mismatch(dsn, repr(holder), topic_prefix)


def _mismatch(dsn: str, holder: str, topic_prefix: str) -> DeploymentMismatchError:
    database = conninfo_to_dict(dsn).get("dbname") or "(the default)"
    settable = holder.split(" or ")[0].strip("'")
    return DeploymentMismatchError(
        f"database {database} holds the deployment with topic prefix {holder}, not "
        f"{topic_prefix!r}: one database per deployment (a second one in it would mix its "
        "runs into the first's and a rebuild of either would drop the other's). Give this "
        f"deployment a database of its own (AGENTLEDGER_PG_DSN), or set "
        f"AGENTLEDGER_TOPIC_PREFIX={settable} to work on that one"
    )


def migrate_and_claim(dsn: str, topic_prefix: str) -> list[str]:
    """:func:`migrate`, then :func:`claim`: what anything that writes projections runs first."""
    applied = migrate(dsn)
    claim(dsn, topic_prefix)
    return applied
