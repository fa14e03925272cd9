"""PostgreSQL side of the change relay (``streams/changes.py``): the outbox ``al_changes``, the
relay's checked offsets ``al_change_relay`` and its advisory lock.

The batch transaction writes the outbox rows (``postgres.py``/``postgres_ops.py``); these
functions read and delete them. Each takes an open async connection; the caller owns its
transactions (the relay's connections are autocommit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from psycopg import AsyncConnection

RELAY_LOCK = 0x616C6368616E6765  # pg advisory lock key: one relay at a time


class OutboxRow(NamedTuple):
    """One ``al_changes`` row: a changed key's new head (or a build change)."""

    id: int
    projection: str
    build: str
    kind: str  # "state" | "removed" | "build"
    run_id: str | None
    fleet_id: str | None
    applied_seq: int | None
    held: int | None
    doc: Any
    traceparent: str | None
    previous: str | None
    committed: datetime


async def try_relay_lock(conn: AsyncConnection[Any]) -> bool:
    """Take the relay's session-level advisory lock if no other session holds it."""
    row = await (await conn.execute("SELECT pg_try_advisory_lock(%s)", (RELAY_LOCK,))).fetchone()
    return bool(row and row[0])


async def ping(conn: AsyncConnection[Any]) -> None:
    """A round trip on ``conn``: raises if its session (and so a lock it holds) is gone."""
    await conn.execute("SELECT 1")


async def listen(conn: AsyncConnection[Any]) -> None:
    """Be notified on ``conn`` when a batch transaction wrote outbox rows."""
    await conn.execute("LISTEN al_changes")


async def pending_changes(conn: AsyncConnection[Any], limit: int) -> list[OutboxRow]:
    """The oldest ``limit`` outbox rows, in id (commit) order."""
    rows = await (
        await conn.execute(
            "SELECT id, projection, build, kind, run_id, fleet_id, applied_seq, held, "
            "doc, traceparent, previous, committed FROM al_changes ORDER BY id LIMIT %s",
            (limit,),
        )
    ).fetchall()
    return [OutboxRow(*row) for row in rows]


async def delete_changes(conn: AsyncConnection[Any], ids: Sequence[int]) -> int:
    """Delete these outbox rows; how many there were."""
    cur = await conn.execute("DELETE FROM al_changes WHERE id = ANY(%s)", (list(ids),))
    return cur.rowcount


async def waiting_projections(conn: AsyncConnection[Any]) -> list[str]:
    """The projections that have rows in the outbox."""
    rows = await (await conn.execute("SELECT DISTINCT projection FROM al_changes")).fetchall()
    return [str(p) for (p,) in rows]


async def build_version(
    conn: AsyncConnection[Any], projection: str, build: str
) -> tuple[int, Any] | None:
    """A build's projection version and inputs (``al_builds``), or None if it is not there."""
    row = await (
        await conn.execute(
            "SELECT version, inputs FROM al_builds WHERE projection = %s AND build = %s",
            (projection, build),
        )
    ).fetchone()
    return (int(row[0]), row[1]) if row else None


async def relay_checked(conn: AsyncConnection[Any]) -> list[tuple[str, int, int]]:
    """Per change-topic partition, the offset up to which the relay's rows are deleted."""
    rows = await (
        await conn.execute('SELECT topic, "partition", checked FROM al_change_relay')
    ).fetchall()
    return [(str(t), int(p), int(o)) for t, p, o in rows]


async def save_checked(conn: AsyncConnection[Any], ends: Mapping[tuple[str, int], int]) -> None:
    """Note these offsets as checked (never moving one back)."""
    for (topic, partition), end in sorted(ends.items()):
        await conn.execute(
            'INSERT INTO al_change_relay (topic, "partition", checked) VALUES (%s, %s, %s) '
            'ON CONFLICT (topic, "partition") DO UPDATE SET '
            "checked = GREATEST(al_change_relay.checked, EXCLUDED.checked)",
            (topic, partition, end),
        )
