"""Worker health (issue 25): is a worker applying, how far behind is it, and is it stalled?

A worker process keeps a :class:`Health` record in memory (fed by its batch loop and its
rebalances), decides from it whether it is *stalled* (partitions with lag, nothing applied for
``stall_s``; or one batch running for longer than that) and then exits non-zero rather than
staying alive and idle, and reports it to PostgreSQL every few seconds (``al_worker_health``),
where ``infra status`` reads it from any host. The decisions are pure functions of the record
and a clock, tested without services; the reporting is at the end of the module, its SQL in
``projectors/stores/worker_health.py``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from infra.settings import Settings
from projectors.stores import worker_health as store
from schemas.topics import fleet_in_ledger_topic

TP = tuple[str, int]


def tp_key(tp: TP) -> str:
    return f"{tp[0]}:{tp[1]}"


@dataclass
class Health:
    """What one worker process knows of its own progress (monotonic seconds)."""

    started: float = field(default_factory=time.monotonic)
    last_applied: float | None = None  # a batch completed
    last_assigned: float | None = None  # partitions assigned (a rebalance completed)
    busy_since: float | None = None  # a batch is being applied since
    batches: int = 0
    records: int = 0
    # per assigned ledger partition: the next offset to apply (stored position, then batches)
    next_offset: dict[TP, int] = field(default_factory=dict)
    # the services a worker needs: when each last answered (monotonic)
    answered_at: dict[str, float] = field(default_factory=dict)

    def answered(self, *services: str, now: float | None = None) -> None:
        """These services (KAFKA, POSTGRESQL) just answered a request."""
        at = time.monotonic() if now is None else now
        for service in services:
            self.answered_at[service] = at

    def assigned(self, positions: Mapping[TP, int], now: float | None = None) -> None:
        """A rebalance gave these partitions, positioned at these next offsets."""
        self.next_offset = dict(positions)
        self.last_assigned = time.monotonic() if now is None else now

    def begin(self, now: float | None = None) -> None:
        self.busy_since = time.monotonic() if now is None else now

    def applied(self, last: Mapping[TP, int], records: int, now: float | None = None) -> None:
        """A batch is committed; ``last`` is its highest offset per partition."""
        self.busy_since = None
        self.last_applied = time.monotonic() if now is None else now
        self.batches += 1
        self.records += records
        for tp, offset in last.items():
            if tp in self.next_offset:
                self.next_offset[tp] = max(self.next_offset[tp], offset + 1)

    def lag(self, highwater: Mapping[TP, int | None]) -> dict[TP, int]:
        """Entries behind the high-water mark, per assigned partition whose mark is known."""
        out = {}
        for tp, next_offset in self.next_offset.items():
            mark = highwater.get(tp)
            if mark is not None:
                out[tp] = max(0, int(mark) - next_offset)
        return out

    def behind(self, highwater: Mapping[TP, int | None], taken: Mapping[TP, int]) -> int:
        """Entries behind the high-water marks over every assigned partition, counting the
        ``taken`` ones (highest offset per partition, taken but not yet applied) as done: what
        is still to come after them. Partitions whose mark is unknown count nothing."""
        total = 0
        for tp, next_offset in self.next_offset.items():
            mark = highwater.get(tp)
            if mark is not None:
                done = max(next_offset, taken.get(tp, -1) + 1)
                total += max(0, int(mark) - done)
        return total

    def idle_s(self, now: float) -> float:
        """Seconds since the worker last made progress or was (re)assigned partitions."""
        marks = [m for m in (self.started, self.last_applied, self.last_assigned) if m is not None]
        return now - max(marks)


def stall(health: Health, lag: Mapping[TP, int], stall_s: float, now: float) -> str | None:
    """Why the worker is stalled, or None. Stalled: a batch running for longer than ``stall_s``
    (its store retries have not got through), or partitions with lag and nothing applied or
    assigned for longer than ``stall_s``."""
    if health.busy_since is not None:
        busy = now - health.busy_since
        return (
            f"one batch has been applying for {busy:.0f}s (over {stall_s:g}s)"
            if (busy > stall_s)
            else None
        )
    behind = {tp: n for tp, n in lag.items() if n > 0}
    idle = health.idle_s(now)
    if behind and idle > stall_s:
        return (
            f"nothing applied for {idle:.0f}s (over {stall_s:g}s) while {sum(behind.values())} "
            f"entries wait on {len(behind)} partitions"
        )
    return None


KAFKA, POSTGRESQL = "Kafka", "PostgreSQL"


def out_of_touch(health: Health, stall_s: float, now: float) -> str | None:
    """Why the worker cannot apply though its own loop is not stuck, or None: a service it
    needs has not answered for longer than ``stall_s`` (since its last answer, or since the
    process began). Found trying the product: with Kafka and PostgreSQL gone, a worker with no
    known lag logged errors for minutes, alive and applying nothing."""
    for service in (KAFKA, POSTGRESQL):
        since = max(health.answered_at.get(service, health.started), health.started)
        if now - since > stall_s:
            return f"no answer from {service} for {now - since:.0f}s (over {stall_s:g}s)"
    return None


# -- the rows in PostgreSQL --------------------------------------------------------------------


def worker_id(pid: int | None = None) -> str:
    """A worker's row key: its supervisor's pid when supervised, so the row (with its restart
    count and last exit) lasts across the faust processes the supervisor starts."""
    if pid is None:
        pid = _supervisor_pid() or os.getpid()
    return f"{socket.gethostname()}:{pid}"


def _supervisor_pid() -> int | None:
    try:
        return int(os.environ.get("AGENTLEDGER_WORKER_SUPERVISOR", "")) or None
    except ValueError:
        return None


@dataclass(frozen=True)
class Supervision:
    """What a worker's supervisor tells it: how often it was restarted and why it last ended."""

    restarts: int = 0
    last_exit: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Supervision:
        env = os.environ if env is None else env
        try:
            restarts = int(env.get("AGENTLEDGER_WORKER_RESTARTS", "0"))
        except ValueError:
            restarts = 0
        return cls(restarts, env.get("AGENTLEDGER_WORKER_LAST_EXIT") or None)


def _wall(monotonic_at: float | None) -> datetime | None:
    if monotonic_at is None:
        return None
    return datetime.now(UTC) - timedelta(seconds=time.monotonic() - monotonic_at)


async def report(
    conn: psycopg.AsyncConnection[Any],
    health: Health,
    lag: Mapping[TP, int],
    group: str,
    projections: str,
    topics: int,
    supervision: Supervision,
) -> None:
    """Upsert this process's row (autocommit connection)."""
    await store.save_report(
        conn,
        worker_id=worker_id(),
        host=socket.gethostname(),
        pid=os.getpid(),
        group=group,
        projections=projections,
        started_at=_wall(health.started),
        last_applied_at=_wall(health.last_applied),
        batches=health.batches,
        records=health.records,
        lag={tp_key(tp): n for tp, n in sorted(lag.items())},
        topics=topics,
        restarts=supervision.restarts,
        last_exit=supervision.last_exit,
    )


async def forget(conn: psycopg.AsyncConnection[Any]) -> None:
    """A clean exit of an unsupervised worker: its row goes (a supervisor's row is the
    supervisor's to update or delete)."""
    if _supervisor_pid() is None:
        await store.delete_row(conn, worker_id())


def restarting(dsn: str, supervisor_pid: int, restarts: int, last_exit: str) -> None:
    """The supervisor's note between two faust processes (best effort): the row stays, its lag
    is unknown until the next process reports, its restart count and last exit are current."""
    with (
        contextlib.suppress(Exception),
        psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn,
    ):
        store.note_restart(conn, worker_id(supervisor_pid), restarts, last_exit)


def forget_worker(dsn: str, pid: int) -> None:
    """Delete a worker's row (best effort): the supervisor stopped; it applies nothing any more."""
    with (
        contextlib.suppress(Exception),
        psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn,
    ):
        store.delete_row_sync(conn, worker_id(pid))


# A row not refreshed for this long belongs to a process that is gone (killed, host lost).
GONE_AFTER_S = 30.0
# ... and is deleted by the next `infra status` after this long.
FORGET_AFTER_S = 600.0


@dataclass(frozen=True)
class WorkerHealth:
    """One worker's row as ``infra status`` shows it."""

    worker_id: str
    pid: int  # the faust process now reporting (the row's key is its supervisor's)
    group: str
    projections: str
    started_at: datetime
    reported_s_ago: float
    last_applied_s_ago: float | None  # None: nothing applied yet
    batches: int
    records: int
    lag: dict[str, int]
    topics: int
    restarts: int
    last_exit: str | None
    # its process is seen on this host not to run (dead, or stopped): gone before its row ages
    not_running: bool = False

    @property
    def gone(self) -> bool:
        return self.not_running or self.reported_s_ago > GONE_AFTER_S

    @property
    def fleets(self) -> list[str]:
        """The fleets of the ledger partitions it reports (``<prefix>.ledger.<fleet>:<n>``)."""
        keys = (fleet_in_ledger_topic(key.rpartition(":")[0]) for key in self.lag)
        return sorted({fleet for fleet in keys if fleet is not None})

    @property
    def behind(self) -> int:
        return sum(self.lag.values())

    def stalled(self, stall_s: float) -> bool:
        """Reporting, with lag, and nothing applied for longer than ``stall_s`` since it began."""
        if self.gone or self.behind == 0:
            return False
        started_s_ago = (datetime.now(UTC) - self.started_at).total_seconds()
        idle = self.last_applied_s_ago if self.last_applied_s_ago is not None else started_s_ago
        return idle > stall_s

    def as_dict(self, stall_s: float) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "pid": self.pid,
            "group": self.group,
            "projections": self.projections,
            "started_at": self.started_at.isoformat(),
            "reported_s_ago": round(self.reported_s_ago, 1),
            "last_applied_s_ago": (
                None if self.last_applied_s_ago is None else round(self.last_applied_s_ago, 1)
            ),
            "batches": self.batches,
            "records": self.records,
            "lag": None if self.gone else self.lag,  # a gone process's lag is unknown
            # the fleets whose ledger partitions it holds (a worker takes every fleet's topic)
            "fleets": None if self.gone else self.fleets,
            # no partitions reported, or a process gone (its last report is old): unknown
            "behind": self.behind if self.lag and not self.gone else None,
            "topics": self.topics,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "state": "gone" if self.gone else "stalled" if self.stalled(stall_s) else "ok",
        }


def read_health(dsn: str) -> list[WorkerHealth]:
    """Every worker's row (rows gone for long are deleted); empty before the first worker."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        found = store.read_rows(conn, FORGET_AFTER_S)
    return [
        WorkerHealth(
            str(r[0]),
            int(r[1]),
            str(r[2]),
            str(r[3]),
            r[4],
            float(r[5]),
            None if r[6] is None else float(r[6]),
            int(r[7]),
            int(r[8]),
            {str(k): int(v) for k, v in dict(r[9]).items()},
            int(r[10]),
            int(r[11]),
            None if r[12] is None else str(r[12]),
        )
        for r in found
    ]


def waiting(
    ends: Mapping[TP, int], live: Mapping[str, Mapping[TP, int]], begins: Mapping[TP, int]
) -> dict[str, int]:
    """Entries not yet applied by every live build, per ledger partition ("topic:partition")
    with any: the partition's end less the lowest position a live build stored there (its last
    applied offset + 1; a build with none there starts at the partition's beginning)."""
    out = {}
    for tp, end in ends.items():
        start = begins.get(tp, 0)
        done = min((b.get(tp, start - 1) + 1 for b in live.values()), default=start)
        if end > done:
            out[tp_key(tp)] = end - done
    return out


async def entries_waiting(settings: Settings) -> dict[str, int]:
    """:func:`waiting` on the cluster and PostgreSQL as they stand (independent of any worker:
    what ``infra status`` says when no worker reports)."""
    from aiokafka import AIOKafkaConsumer

    from infra.admin import existing_ledger_topics
    from projectors.stores import postgres_ops as ops
    from streams.source import topic_partitions

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_address, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = await topic_partitions(consumer, await existing_ledger_topics(settings))
        ends = await consumer.end_offsets(parts) if parts else {}
        begins = await consumer.beginning_offsets(parts) if parts else {}
    finally:
        await consumer.stop()
    with ops.connect(settings.pg_address) as conn:
        live = ops.live_offsets(conn)
    return waiting(
        {(tp.topic, tp.partition): o for tp, o in ends.items()},
        live,
        {(tp.topic, tp.partition): o for tp, o in begins.items()},
    )


def stalled_workers(rows: Iterable[WorkerHealth], stall_s: float) -> list[WorkerHealth]:
    return [w for w in rows if w.stalled(stall_s)]
