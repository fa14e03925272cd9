"""Rebuild by replay: new builds beside the live one, swap, drop, list, verify.

A build is a projection's rows under their own name (``al_run_state``, ``al_history``, its own
``al_offsets`` rows and Redis namespace). ``al_live`` names the build every reader follows.

- ``create_build`` records a build and where it starts reading (every partition at the beginning,
  at given offsets, or at the first offset at or after a time).
- ``run_build`` replays the topics into it with a direct consumer (no group), in large batches.
- ``swap`` catches the build up with the live one and moves the pointer in one transaction that
  locks the live build's offset rows: the live worker (which locks them per batch and checks the
  pointer after locking) either committed before and is covered, or sees the new pointer and
  writes the new build from then on. Nothing lands in the old build after the swap.
- ``verify`` replays into a scratch build up to the live build's offsets and compares canonical
  digests of every run's state and history, listing what differs.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer

from infra.admin import existing_ledger_topics
from infra.clients import redis_client
from infra.settings import Settings
from projectors.base import Projection, projection_inputs
from projectors.stores import postgres_ops as ops
from projectors.stores.postgres import current_documents
from projectors.stores.redis import RedisViewStore
from schemas.codec import LedgerCodec
from schemas.errors import AgentLedgerError
from schemas.times import parse_moment
from streams.changes import stream_projections
from streams.dlq import KafkaDeadLetterSink
from streams.engine import BatchStats, Engine, Target
from streams.parallel import drain_parallel, parallel_ok, shares_of
from streams.source import Progress, drain, topic_partitions

logger = logging.getLogger(__name__)

TP = tuple[str, int]


class RebuildError(AgentLedgerError):
    """A rebuild command cannot do what was asked (unknown build, live build, bad spec...)."""


@dataclass(frozen=True)
class Start:
    """Where a build starts reading: ``beginning``, ``offsets`` (a spec) or ``time`` (ISO)."""

    mode: str = "beginning"
    spec: str | None = None

    @property
    def partial(self) -> bool:
        return self.mode != "beginning"

    def describe(self) -> str:
        return self.mode if self.spec is None else f"{self.mode} {self.spec}"


@dataclass
class BuildInfo:
    projection: str
    build: str
    version: int
    created_at: datetime
    origin: str
    start: str | None
    live: bool
    runs: int
    offsets: dict[TP, int] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)

    def behind(self, other: Mapping[TP, int]) -> int:
        """How many records this build still lacks to reach ``other``'s positions."""
        return sum(max(0, o - self.offsets.get(tp, -1)) for tp, o in other.items())


async def topics_of(settings: Settings) -> list[str]:
    """The ledger topics a build replays: every fleet's that exists (those made after the
    workers started, or by ``import --fleet``, included), as the workers project them."""
    return await existing_ledger_topics(settings)


# -- creating --------------------------------------------------------------------------------


async def create_build(
    settings: Settings, projection: Projection[Any], start: Start, origin: str = "rebuild"
) -> str:
    """Record a new build of ``projection`` and its starting offsets; returns its name."""
    offsets = await _start_offsets(settings, start)
    with ops.connect(settings.pg_address) as conn:
        build = _next_name(conn, projection, origin)
        ops.insert_build(
            conn,
            projection.name,
            build,
            projection.version,
            origin,
            start.describe(),
            start.partial,
            projection_inputs(projection),
            offsets,
        )
    return build


def _next_name(conn: psycopg.Connection[Any], projection: Projection[Any], origin: str) -> str:
    if origin != "rebuild":
        return f"{origin}-{uuid.uuid4().hex[:8]}"
    prefix = f"v{projection.version}-"
    names = ops.build_names(conn, projection.name, prefix)
    numbers = [int(n[len(prefix) :]) for n in names if n[len(prefix) :].isdigit()]
    return f"{prefix}{max(numbers, default=1) + 1}"


async def _start_offsets(settings: Settings, start: Start) -> dict[TP, int]:
    """The stored "last applied" offset each partition starts after (-1: the beginning)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_address, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = await topic_partitions(consumer, await topics_of(settings))
        if not partitions:
            raise RebuildError(f"no ledger topics under the prefix {settings.topic_prefix!r}")
        if start.mode == "beginning":
            return {(tp.topic, tp.partition): -1 for tp in partitions}
        if start.mode == "offsets":
            return _parse_offsets(start.spec or "", [(tp.topic, tp.partition) for tp in partitions])
        if start.mode == "time":
            at = _parse_time(start.spec or "")
            found = await consumer.offsets_for_times(
                {tp: int(at.timestamp() * 1000) for tp in partitions}
            )
            ends = await consumer.end_offsets(partitions)
            return {
                (tp.topic, tp.partition): (hit.offset if hit is not None else ends[tp]) - 1
                for tp, hit in found.items()
            }
        raise RebuildError(f"unknown start {start.mode!r}")
    finally:
        await consumer.stop()


_OFFSET_ITEM = re.compile(r"^(?:(?P<topic>[^:=\s]+):)?(?P<partition>\d+)=(?P<offset>\d+)$")


def _parse_offsets(spec: str, partitions: Sequence[TP]) -> dict[TP, int]:
    """``N`` (every partition from offset N) or ``[topic:]partition=offset,...`` (others: 0)."""
    spec = spec.strip()
    if spec.isdigit():
        return {tp: int(spec) - 1 for tp in partitions}
    chosen: dict[TP, int] = {tp: -1 for tp in partitions}
    for item in filter(None, (i.strip() for i in spec.split(","))):
        m = _OFFSET_ITEM.match(item)
        if m is None:
            raise RebuildError(
                f"bad offset spec item {item!r}: use N, or [topic:]partition=offset,..."
            )
        matching = [
            tp
            for tp in partitions
            if tp[1] == int(m["partition"]) and (m["topic"] is None or tp[0] == m["topic"])
        ]
        if not matching:
            raise RebuildError(f"offset spec {item!r} names no partition of the ledger topics")
        for tp in matching:
            chosen[tp] = int(m["offset"]) - 1
    return chosen


def _parse_time(text: str) -> datetime:
    try:
        return parse_moment(text)
    except ValueError as exc:
        raise RebuildError(str(exc)) from None


# -- running ---------------------------------------------------------------------------------


async def run_build(
    settings: Settings,
    projection: Projection[Any],
    build: str,
    until: Mapping[TP, int] | None = None,
    progress: Callable[[Progress], None] | None = None,
    codec: LedgerCodec | None = None,
    batch_size: int = 5000,
    processes: int = 1,
) -> BatchStats:
    """Replay the topics into ``build`` from its stored offsets (to the end, or ``until``).

    With ``processes`` > 1 the partitions are split between that many processes (shipped
    projections and the default codec only; otherwise one process replays them all).
    """
    info = build_info(settings, projection.name, build)
    target = Target(projection, build, whole_runs_only=info.start not in (None, "beginning"))
    topics = await topics_of(settings)
    if processes > 1 and codec is None and parallel_ok([target], settings):
        shares = await shares_of(
            settings,
            ((projection.name, build),),
            target.whole_runs_only,
            topics,
            processes,
            batch_size,
            until,
            redis=False,  # views are written once, at the swap
        )
        return await drain_parallel(shares, progress)
    sink = KafkaDeadLetterSink(settings)
    engine = Engine(
        [target],
        settings.pg_address,
        None,  # a build nobody reads yet has no views: they are written once, at the swap
        sink,
        codec=codec,
        redis_prefix=settings.redis_prefix,
    )
    await engine.start()
    try:
        return await drain(
            engine,
            settings.kafka_address,
            topics,
            batch_size=batch_size,
            until=until,
            progress=progress,
        )
    finally:
        await engine.close()
        await sink.close()


# -- swapping, dropping, listing ------------------------------------------------------------


async def swap(
    settings: Settings,
    projection: Projection[Any],
    build: str,
    progress: Callable[[Progress], None] | None = None,
    codec: LedgerCodec | None = None,
    max_rounds: int = 50,
) -> str | None:
    """Catch ``build`` up with the live build, then make it live; returns the previous build."""
    info = build_info(settings, projection.name, build)
    if info.live:
        raise RebuildError(f"{projection.name} build {build} is already live")
    for _ in range(max_rounds):
        await run_build(settings, projection, build, progress=progress, codec=codec)
        swapped, previous = _swap_if_caught_up(settings, projection.name, build)
        if swapped:
            if projection.hot:  # readers follow Redis's pointer, moved once the views are there
                await _write_views(settings, projection, build)
            await _mirror_live(settings, projection.name, build)
            logger.info("%s: live build %s -> %s", projection.name, previous, build)
            return previous
    raise RebuildError(
        f"{projection.name} build {build} could not catch up with the live build in "
        f"{max_rounds} rounds; is a worker applying faster than the rebuild reads?"
    )


def _swap_if_caught_up(settings: Settings, projection: str, build: str) -> tuple[bool, str | None]:
    """In one transaction: lock the pointer and the live build's offsets; swap if caught up.

    Returns the previous live build (None if there was none), or False when not caught up.
    """
    with ops.connect(settings.pg_address) as conn:
        live = ops.lock_live(conn, projection)
        if live is not None:
            locked = ops.offsets(conn, projection, live, lock=True)
            mine = ops.offsets(conn, projection, build)
            if any(mine.get(tp, -1) < o for tp, o in locked.items()):
                conn.rollback()
                return False, live
        ops.point_live(conn, projection, build)
        if projection in stream_projections(settings):
            ops.outbox_swap(conn, projection, live, build)
    return True, live


async def _write_views(settings: Settings, projection: Projection[Any], build: str) -> None:
    """The build's Redis views from PostgreSQL (compare-and-set: a worker already writing the
    build, live since the swap, is never moved backwards)."""
    sink = KafkaDeadLetterSink(settings)  # (nothing is applied: never used)
    engine = Engine(
        [Target(projection, build)],
        settings.pg_address,
        settings.redis_address,
        sink,
        redis_prefix=settings.redis_prefix,
    )
    try:
        await engine.refill_views()
    finally:
        await engine.close()
        await sink.close()


async def _mirror_live(settings: Settings, projection: str, build: str) -> None:
    client = redis_client(settings)
    try:
        await RedisViewStore(client, settings.redis_prefix).set_live(projection, build)
    finally:
        await client.aclose()


async def drop(settings: Settings, projection: str, build: str) -> None:
    """Delete a build that is not live: rows, offsets, held entries, history, Redis views."""
    info = build_info(settings, projection, build)
    if info.live:
        raise RebuildError(f"{projection} build {build} is live; swap another build in first")
    with ops.connect(settings.pg_address) as conn:
        ops.delete_build(conn, projection, build)

    views = RedisViewStore.connect(settings.redis_address, settings.redis_prefix)
    try:
        await views.drop_build(projection, build)
    finally:
        await views.close()


def list_builds(settings: Settings, projection: str | None = None) -> list[BuildInfo]:
    with ops.connect(settings.pg_address) as conn:
        rows = ops.build_rows(conn, projection)
        return [
            BuildInfo(
                projection=p,
                build=b,
                version=v,
                created_at=c,
                origin=o,
                start=st,
                live=bool(live),
                runs=int(n),
                offsets=ops.offsets(conn, p, b),
                inputs=dict(inp or {}),
            )
            for p, b, v, c, o, st, live, inp, n in rows
        ]


def builds_json(settings: Settings) -> list[dict[str, Any]]:
    """Every build as ``rebuild list --json`` prints it (and ``/api/v1/builds`` answers), with
    ``behind_live`` (a build not live: how many records it still lacks to reach the live
    build's positions, 0 when it has caught up; None for the live build) and ``verified`` (the
    newest ``agentledger verify`` of this build while it was live, None if never)."""
    builds = list_builds(settings)
    live = {b.projection: b for b in builds if b.live}
    with ops.connect(settings.pg_address) as conn:
        verdicts = ops.last_verdicts(conn)
    out = []
    for b in builds:
        ref = live.get(b.projection)
        out.append(
            {
                **asdict(b),
                "offsets": {f"{t}:{p}": o for (t, p), o in b.offsets.items()},
                "behind_live": None if b.live or ref is None else b.behind(ref.offsets),
                "verified": verdicts.get((b.projection, b.build)),
            }
        )
    return out


def build_info(settings: Settings, projection: str, build: str) -> BuildInfo:
    for info in list_builds(settings, projection):
        if info.build == build:
            return info
    raise RebuildError(f"no {projection} build named {build!r} (see `agentledger rebuild list`)")


def find_build(settings: Settings, name: str) -> BuildInfo:
    """A build by ``PROJECTION/BUILD``, or by ``BUILD`` alone when only one projection has it."""
    projection, _, build = name.rpartition("/")
    found = [i for i in list_builds(settings, projection or None) if i.build == build]
    if len(found) != 1:
        where = ", ".join(f"{i.projection}/{i.build}" for i in found) or "none"
        raise RebuildError(f"{name!r} names {len(found)} builds ({where}); give PROJECTION/BUILD")
    return found[0]


def live_offsets(settings: Settings, projection: str) -> tuple[str, dict[TP, int]]:
    with ops.connect(settings.pg_address) as conn:
        live = ops.live_build(conn, projection)
        if live is None:
            raise RebuildError(f"{projection} has no live build yet (start a worker first)")
        return live, ops.offsets(conn, projection, live)


# -- verifying -------------------------------------------------------------------------------


@dataclass
class Verdict:
    projection: str
    live_build: str
    scratch_build: str
    runs: int
    live_digest: str
    scratch_digest: str
    differences: list[str]

    @property
    def equal(self) -> bool:
        return not self.differences and self.live_digest == self.scratch_digest


def _whole_state_differences(
    conn: psycopg.Connection[Any], folded: Projection[Any], live: str, scratch: str, limit: int
) -> list[str]:
    suspects = ops.whole_state_suspects(conn, folded.name, live, scratch)
    out = []
    for start in range(0, len(suspects), 500):
        ids = suspects[start : start + 500]
        mine = {r: d for r, _s, _g, d in current_documents(conn, folded, live, ids)}
        theirs = {r: d for r, _s, _g, d in current_documents(conn, folded, scratch, ids)}
        out += [f"run {r}: state differs" for r in ids if mine.get(r) != theirs.get(r)]
        if len(out) >= limit:
            break
    return out[:limit]


async def verify(
    settings: Settings,
    projection: Projection[Any],
    progress: Callable[[Progress], None] | None = None,
    max_rounds: int = 50,
    limit: int = 50,
) -> Verdict:
    """Replay into a scratch build up to the live build's offsets and compare digests."""
    live, _ = live_offsets(settings, projection.name)
    made_by = build_info(settings, projection.name, live).version
    if made_by != projection.version:
        # (a replay with this code cannot equal it: each run would be said to differ, as a
        # deployment upgraded across a version showed; found trying the product)
        raise RebuildError(
            f"the live build {live} of {projection.name} was made by version {made_by} of its "
            f"code, this is version {projection.version}: a replay cannot equal it. Rebuild it "
            f"with this code first: agentledger rebuild {projection.name} --from-beginning --swap"
        )
    scratch = await create_build(settings, projection, Start(), origin="verify")
    try:
        for _ in range(max_rounds):
            live, target = live_offsets(settings, projection.name)
            await run_build(settings, projection, scratch, until=target, progress=progress)
            verdict = _compare_if_level(settings, projection, live, scratch, limit)
            if verdict is not None:
                with ops.connect(settings.pg_address) as conn:  # the builds page shows it
                    ops.record_verdict(
                        conn,
                        verdict.projection,
                        verdict.live_build,
                        verdict.equal,
                        verdict.runs,
                        verdict.differences,
                    )
                return verdict
        raise RebuildError(
            f"verify of {projection.name} never caught the live build standing still "
            f"in {max_rounds} rounds"
        )
    finally:
        await drop(settings, projection.name, scratch)


def _compare_if_level(
    settings: Settings, folded: Projection[Any], live: str, scratch: str, limit: int
) -> Verdict | None:
    """Compare while holding the live build's offset rows (the worker waits a moment): the
    heads and history rows in SQL, then each run's whole current state (checkpoints are taken
    at different entries in the two builds, so their checkpoint with its tail folded on)."""
    projection = folded.name
    with ops.connect(settings.pg_address) as conn:
        now = ops.offsets(conn, projection, live, lock=True)
        mine = ops.offsets(conn, projection, scratch)
        if any(mine.get(tp, -1) != o for tp, o in now.items()):
            return None
        runs, live_digest = ops.build_digest(conn, projection, live)
        _, scratch_digest = ops.build_digest(conn, projection, scratch)
        differences = [
            f"run {run}: "
            + (
                "missing in live"
                if no_live
                else "missing in replay"
                if no_replay
                else "state differs"
            )
            for run, no_live, no_replay in ops.head_differences(
                conn, projection, live, scratch, limit
            )
        ]
        differences += [
            f"run {run}: history {kind} {key} differs"
            for run, kind, key in ops.history_differences(conn, projection, live, scratch, limit)
        ]
        if not differences:
            differences = _whole_state_differences(conn, folded, live, scratch, limit)
        return Verdict(
            projection,
            live,
            scratch,
            int(runs),
            str(live_digest),
            str(scratch_digest),
            differences,
        )
