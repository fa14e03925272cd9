"""PostgreSQL side of the workers' health (``streams/health.py``): the ``al_worker_health`` rows
that each worker reports every few seconds and that ``infra status`` reads from any host.

Each function takes an open connection in autocommit; connecting (and what a failure means) is
the caller's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, Connection


async def save_report(
    conn: AsyncConnection[Any],
    *,
    worker_id: str,
    host: str,
    pid: int,
    group: str,
    projections: str,
    started_at: datetime | None,
    last_applied_at: datetime | None,
    batches: int,
    records: int,
    lag: Mapping[str, int],
    topics: int,
    restarts: int,
    last_exit: str | None,
) -> None:
    """Upsert one worker's row, stamped ``reported_at = now()``."""
    await conn.execute(
        """
        INSERT INTO al_worker_health (worker_id, host, pid, grp, projections, started_at,
            reported_at, last_applied_at, batches, records, lag, topics, restarts, last_exit)
        VALUES (%s, %s, %s, %s, %s, %s, now(), %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (worker_id) DO UPDATE SET reported_at = now(), pid = EXCLUDED.pid,
            grp = EXCLUDED.grp, projections = EXCLUDED.projections,
            started_at = EXCLUDED.started_at, last_applied_at = EXCLUDED.last_applied_at,
            batches = EXCLUDED.batches, records = EXCLUDED.records, lag = EXCLUDED.lag,
            topics = EXCLUDED.topics, restarts = EXCLUDED.restarts, last_exit = EXCLUDED.last_exit
        """,
        (
            worker_id,
            host,
            pid,
            group,
            projections,
            started_at,
            last_applied_at,
            batches,
            records,
            json.dumps(dict(lag)),
            topics,
            restarts,
            last_exit,
        ),
    )


async def delete_row(conn: AsyncConnection[Any], worker_id: str) -> None:
    await conn.execute("DELETE FROM al_worker_health WHERE worker_id = %s", (worker_id,))


def delete_row_sync(conn: Connection[Any], worker_id: str) -> None:
    conn.execute("DELETE FROM al_worker_health WHERE worker_id = %s", (worker_id,))


def note_restart(conn: Connection[Any], worker_id: str, restarts: int, last_exit: str) -> None:
    """A supervisor restarts its worker: the row stays, its lag is unknown until the next
    process reports, its restart count and last exit are current."""
    conn.execute(
        """
        UPDATE al_worker_health SET reported_at = now(), started_at = now(),
            last_applied_at = NULL, lag = '{}'::jsonb, restarts = %s, last_exit = %s
        WHERE worker_id = %s
        """,
        (restarts, last_exit, worker_id),
    )


def read_rows(conn: Connection[Any], forget_after_s: float) -> list[tuple[Any, ...]]:
    """Every row (rows not refreshed for ``forget_after_s`` are deleted first): worker_id, pid,
    grp, projections, started_at, seconds since reported, seconds since last applied (None:
    never), batches, records, lag, topics, restarts, last_exit. Empty before the table exists."""
    exists = conn.execute("SELECT to_regclass('al_worker_health')").fetchone()
    if exists is None or exists[0] is None:
        return []
    conn.execute(
        "DELETE FROM al_worker_health WHERE reported_at < now() - make_interval(secs => %s)",
        (forget_after_s,),
    )
    return conn.execute(
        """
        SELECT worker_id, pid, grp, projections, started_at,
               extract(epoch FROM now() - reported_at)::float8,
               extract(epoch FROM now() - last_applied_at)::float8,
               batches, records, lag, topics, restarts, last_exit
        FROM al_worker_health ORDER BY grp, worker_id
        """
    ).fetchall()
