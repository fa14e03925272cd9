"""PostgreSQL side of the engine: offsets, run state and held entries, written in one transaction.

Every function takes an open async connection inside a transaction the caller owns, so a batch's
projection rows and its offsets commit together or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from projectors.base import HistoryRow

TopicPartition = tuple[str, int]


@dataclass
class RunRow:
    """One run's stored position and state for one projection build."""

    run_id: str
    fleet_id: str
    applied_seq: int
    held: tuple[int, ...]
    state: dict[str, Any] | None
    held_payloads: dict[int, bytes] = field(default_factory=dict)


async def lock_offsets(
    conn: AsyncConnection[Any], projection: str, build: str, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, int]:
    """Lock the offset rows of these partitions (creating them at -1) and return them.

    The row lock serializes two workers that both think they own a partition during a rebalance:
    the second sees the first's offsets once it commits, and skips what was applied.
    """
    ordered = sorted(set(partitions))
    async with conn.cursor() as cur:
        await cur.executemany(
            'INSERT INTO al_offsets (projection, build, topic, partition, "offset") '
            "VALUES (%s, %s, %s, %s, -1) ON CONFLICT DO NOTHING",
            [(projection, build, t, p) for t, p in ordered],
        )
        await cur.execute(
            'SELECT topic, partition, "offset" FROM al_offsets '
            "WHERE projection = %s AND build = %s AND (topic, partition) IN "
            "(SELECT * FROM unnest(%s::text[], %s::int[])) "
            "ORDER BY topic, partition FOR UPDATE",
            (projection, build, [t for t, _ in ordered], [p for _, p in ordered]),
        )
        return {(t, p): o for t, p, o in await cur.fetchall()}


async def read_offsets(
    conn: AsyncConnection[Any], projection: str, build: str, topics: Iterable[str]
) -> dict[TopicPartition, int]:
    """Stored offsets (last applied, inclusive) of every partition of these topics."""
    async with conn.cursor() as cur:
        await cur.execute(
            'SELECT topic, partition, "offset" FROM al_offsets '
            "WHERE projection = %s AND build = %s AND topic = ANY(%s)",
            (projection, build, list(topics)),
        )
        return {(t, p): o for t, p, o in await cur.fetchall()}


async def save_offsets(
    conn: AsyncConnection[Any], projection: str, build: str, offsets: dict[TopicPartition, int]
) -> None:
    async with conn.cursor() as cur:
        await cur.executemany(
            'UPDATE al_offsets SET "offset" = %s, updated_at = now() '
            "WHERE projection = %s AND build = %s AND topic = %s AND partition = %s",
            [(o, projection, build, t, p) for (t, p), o in sorted(offsets.items())],
        )


async def load_runs(
    conn: AsyncConnection[Any], projection: str, build: str, run_ids: Sequence[str]
) -> dict[str, RunRow]:
    """Stored rows of these runs, with the payloads of their held entries."""
    async with conn.cursor() as cur:
        await cur.execute(
            "SELECT run_id, fleet_id, applied_seq, held, state FROM al_run_state "
            "WHERE projection = %s AND build = %s AND run_id = ANY(%s)",
            (projection, build, list(run_ids)),
        )
        rows = {
            run_id: RunRow(run_id, fleet_id, seq, tuple(held), state)
            for run_id, fleet_id, seq, held, state in await cur.fetchall()
        }
        waiting = [r.run_id for r in rows.values() if r.held]
        if waiting:
            await cur.execute(
                "SELECT run_id, sequence_no, payload FROM al_held "
                "WHERE projection = %s AND build = %s AND run_id = ANY(%s)",
                (projection, build, waiting),
            )
            for run_id, seq, payload in await cur.fetchall():
                rows[run_id].held_payloads[seq] = bytes(payload)
    return rows


@dataclass
class RunWrite:
    """A run's new row, plus the held entries to add and to drop."""

    run_id: str
    fleet_id: str
    applied_seq: int
    held: tuple[int, ...]
    gaps: list[tuple[int, int]]
    state: dict[str, Any] | None
    hold: dict[int, bytes] = field(default_factory=dict)
    release: list[int] = field(default_factory=list)
    history: list[HistoryRow] = field(default_factory=list)


async def write_runs(
    conn: AsyncConnection[Any], projection: str, build: str, writes: Sequence[RunWrite]
) -> None:
    """Upsert every touched run and move held entries, in as few round trips as possible."""
    if not writes:
        return
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO al_run_state "
            "(projection, build, run_id, fleet_id, applied_seq, held, gaps, state, updated_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, now()) "
            "ON CONFLICT (projection, build, run_id) DO UPDATE SET "
            "applied_seq = EXCLUDED.applied_seq, held = EXCLUDED.held, gaps = EXCLUDED.gaps, "
            "state = EXCLUDED.state, updated_at = now()",
            [
                (
                    projection,
                    build,
                    w.run_id,
                    w.fleet_id,
                    w.applied_seq,
                    list(w.held),
                    Jsonb([list(g) for g in w.gaps]),
                    Jsonb(w.state or {}),
                )
                for w in writes
            ],
        )
        holds = [
            (projection, build, w.run_id, seq, payload)
            for w in writes
            for seq, payload in w.hold.items()
        ]
        if holds:
            await cur.executemany(
                "INSERT INTO al_held (projection, build, run_id, sequence_no, payload) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                holds,
            )
        history = [
            (projection, build, w.run_id, h.kind, h.key, h.seq, Jsonb(h.doc))
            for w in writes
            for h in w.history
        ]
        if history:
            await cur.executemany(
                "INSERT INTO al_history (projection, build, run_id, kind, key, seq, doc) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                history,
            )
        releases = [(projection, build, w.run_id, seq) for w in writes for seq in w.release]
        if releases:
            await cur.executemany(
                "DELETE FROM al_held WHERE projection = %s AND build = %s AND run_id = %s "
                "AND sequence_no = %s",
                releases,
            )


async def ensure_build(
    conn: AsyncConnection[Any], projection: str, build: str, version: int, live: bool
) -> None:
    """Record the build; with ``live``, make it the live one when none is yet."""
    await conn.execute(
        "INSERT INTO al_builds (projection, build, version) VALUES (%s, %s, %s) "
        "ON CONFLICT DO NOTHING",
        (projection, build, version),
    )
    if live:
        await conn.execute(
            "INSERT INTO al_live (projection, build) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (projection, build),
        )


async def live_build(conn: AsyncConnection[Any], projection: str) -> str | None:
    cur = await conn.execute("SELECT build FROM al_live WHERE projection = %s", (projection,))
    row = await cur.fetchone()
    return None if row is None else str(row[0])


async def iter_states(
    conn: AsyncConnection[Any], projection: str, build: str
) -> list[tuple[str, int, tuple[int, ...], list[list[int]], dict[str, Any]]]:
    """Every run's (run_id, applied_seq, held, gaps, state) of a build, for refilling Redis."""
    cur = await conn.execute(
        "SELECT run_id, applied_seq, held, gaps, state FROM al_run_state "
        "WHERE projection = %s AND build = %s ORDER BY run_id",
        (projection, build),
    )
    return [(r, s, tuple(h), g, st) for r, s, h, g, st in await cur.fetchall()]
