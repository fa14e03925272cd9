"""A mirror: an analyst's own PostgreSQL table of cost-metrics per run, kept up to date.

The table (``cost_mirror`` by default, in any database the analyst owns) has one row per run:
its fleet, the build and sequence number the row reflects, cost, calls, tokens (NULL when no
call has them known; calls NULL when the run's log keeps no usage: unknown is never 0),
unpriced calls, budget and whether it is over. Each batch of changes is applied in one
transaction together with the stream positions it reached (``<table>_positions``), so a mirror
that stops, crashes or restarts resumes exactly where its table stands: no change is applied
twice or missed. A swap (a repricing) arrives as the new build's state of every run: the mirror
ends equal to the new live build without being restarted. A first start reads the stream from
the beginning.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from consumers.subscribe import Subscriber
from infra.settings import Settings
from projectors.cost_metrics import calls_unknown, known_sum
from schemas.changes import ProjectionChange

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,50}$")
COLUMNS = (
    "run_id",
    "fleet_id",
    "build",
    "applied_seq",
    "cost_usd",
    "calls",
    "input_tokens",
    "output_tokens",
    "unpriced_calls",
    "budget_usd",
    "over_budget",
)


@dataclass(frozen=True)
class _Counts:
    """How many calls a run's sums cover (for :func:`known_sum`)."""

    calls: int
    unpriced_calls: int
    usage_unknown_calls: int
    reported_calls: int
    output_unknown_calls: int
    usage_partial_calls: int


def mirror_row(change: ProjectionChange) -> tuple[Any, ...]:
    """A cost-metrics change as the mirror's row. A cost or token sum that no call has known
    (all unpriced, of unknown usage, or no call at all) is NULL, never 0
    (:func:`projectors.cost_metrics.known_sum`, the rule every output follows)."""
    state = change.state or {}
    totals = state.get("totals") or {}
    budget = state.get("task_budget_usd")
    counts = _Counts(
        int(totals.get("calls", 0)),
        int(totals.get("unpriced_calls", 0)),
        int(totals.get("usage_unknown_calls", 0)),
        int(totals.get("reported_calls", 0)),
        int(totals.get("output_unknown_calls", 0)),
        int(totals.get("usage_partial_calls", 0)),
    )
    # a run whose log keeps no usage: how many calls it made is unknown (NULL), never 0
    unmetered = calls_unknown(state.get("calls_unknown"), counts.calls)
    return (
        change.run_id,
        change.fleet_id,
        change.build,
        change.applied_seq,
        known_sum(counts, "cost", Decimal(str(totals.get("cost_usd", "0")))),
        None if unmetered else counts.calls,
        known_sum(counts, "input_tokens", totals.get("input_tokens", 0)),
        known_sum(counts, "output_tokens", totals.get("output_tokens", 0)),
        None if unmetered else counts.unpriced_calls,
        None if budget is None else Decimal(str(budget)),
        bool(state.get("over_budget")),
    )


class CostMirror:
    def __init__(self, settings: Settings, dsn: str, table: str = "cost_mirror") -> None:
        if not _NAME.match(table):
            raise ValueError(f"table name {table!r}: lower-case letters, digits and _ only")
        self.settings = settings
        self.dsn = dsn
        self.table = sql.Identifier(table)
        self.positions_table = sql.Identifier(f"{table}_positions")
        self.applied = 0

    def create(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (run_id text PRIMARY KEY, fleet_id text, "
                "build text NOT NULL, applied_seq bigint NOT NULL, cost_usd numeric, "
                "calls bigint, input_tokens bigint, output_tokens bigint, "
                "unpriced_calls bigint, budget_usd numeric, over_budget boolean "
                "NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(self.table)
        )
        # a mirror made before unknown was NULL: its columns take NULL now
        for column in ("cost_usd", "input_tokens", "output_tokens", "calls", "unpriced_calls"):
            conn.execute(
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL").format(
                    self.table, sql.Identifier(column)
                )
            )
        conn.execute(
            sql.SQL(
                'CREATE TABLE IF NOT EXISTS {} ("partition" integer PRIMARY KEY, next bigint '
                "NOT NULL)"
            ).format(self.positions_table)
        )

    def stored_positions(self, conn: psycopg.Connection[Any]) -> dict[int, int]:
        rows = conn.execute(
            sql.SQL('SELECT "partition", next FROM {}').format(self.positions_table)
        ).fetchall()
        return {int(p): int(n) for p, n in rows}

    def apply(
        self,
        conn: psycopg.Connection[Any],
        batch: Sequence[ProjectionChange],
        positions: dict[int, int],
    ) -> None:
        """One transaction: the rows of these changes and the positions after them."""
        with conn.transaction():
            for change in batch:
                if change.kind == "STATE" and change.run_id is not None:
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (run_id) DO UPDATE SET "
                            "{}, updated_at = now()"
                        ).format(
                            self.table,
                            sql.SQL(", ").join(map(sql.Identifier, COLUMNS)),
                            sql.SQL(", ").join(sql.Placeholder() * len(COLUMNS)),
                            sql.SQL(", ").join(
                                sql.SQL("{} = EXCLUDED.{}").format(
                                    sql.Identifier(c), sql.Identifier(c)
                                )
                                for c in COLUMNS[1:]
                            ),
                        ),
                        mirror_row(change),
                    )
                elif change.kind == "REMOVED":
                    conn.execute(
                        sql.SQL("DELETE FROM {} WHERE run_id = %s").format(self.table),
                        (change.run_id,),
                    )
            for partition, nxt in positions.items():
                conn.execute(
                    sql.SQL(
                        'INSERT INTO {} ("partition", next) VALUES (%s, %s) ON CONFLICT '
                        '("partition") DO UPDATE SET next = EXCLUDED.next'
                    ).format(self.positions_table),
                    (partition, nxt),
                )
        self.applied += len(batch)

    async def run(self, idle_timeout_s: float | None = None, batch: int = 500) -> None:
        """Follow the stream until idle for ``idle_timeout_s`` (None: forever)."""
        with psycopg.connect(self.dsn) as conn:
            self.create(conn)
            conn.commit()
            stored = self.stored_positions(conn)
            subscriber = Subscriber(
                self.settings,
                "cost-metrics",
                start="beginning",
                positions=stored or None,
                idle_timeout_s=idle_timeout_s,
            )
            pending: list[ProjectionChange] = []
            async with subscriber as changes:
                async for change in changes:
                    pending.append(change)
                    if len(pending) >= batch or not _more_buffered(subscriber):
                        self.apply(conn, pending, subscriber.positions())
                        pending = []
            if pending:
                self.apply(conn, pending, subscriber.positions())


def _more_buffered(subscriber: Subscriber) -> bool:
    return subscriber.buffered > 0
