"""The PostgreSQL server itself, not AgentLedger's tables: create and drop a database
(provisioning, before the migrations run), the readiness probe and the smoke round trip on a
TEMP table. AgentLedger's own tables are read and written in ``projectors/stores/`` and made by
``infra/migrate.py``."""

from __future__ import annotations

import psycopg


def probe(dsn: str, connect_timeout: int = 3) -> None:
    """Connect and run a trivial query; raises :class:`psycopg.Error` if the server cannot."""
    with psycopg.connect(dsn, connect_timeout=connect_timeout) as conn:
        conn.execute("SELECT 1")


def ensure_database(admin_dsn: str, name: str) -> None:
    """Create database ``name`` unless it exists (``admin_dsn``: any other database)."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists is None:
            conn.execute(f'CREATE DATABASE "{name}"')


def create_database(admin_dsn: str, name: str) -> None:
    """Create database ``name``; fails if it exists."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database ``name`` if it exists, ending the sessions still connected to it."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def roundtrip(dsn: str, token: str) -> tuple[str, str] | None:
    """Write ``token`` to a TEMP table and read it back: (the token read, the server's
    ``version()``), or None if nothing came back."""
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TEMP TABLE roundtrip (token text)")
        conn.execute("INSERT INTO roundtrip VALUES (%s)", (token,))
        row = conn.execute("SELECT token, version() FROM roundtrip").fetchone()
    return None if row is None else (str(row[0]), str(row[1]))
