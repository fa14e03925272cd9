"""The store contract in memory: the engine's unit tests run on it without any service.

It keeps what PostgreSQL keeps, with the same rules (positions never move back, tail and history
rows are written once, a transaction commits all its writes or none). Transactions run one at a
time (a lock stands in for PostgreSQL's row locks); documents go through JSON as they would in
jsonb, so a state reloaded here is what it would be after a real round trip.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from projectors.base import HistoryRow
from projectors.stores.contract import (
    BuildKey,
    OffsetKey,
    RunRow,
    RunView,
    RunWrite,
    StoredHead,
    TopicPartition,
    view_doc,
    view_version,
)

Key = tuple[str, str, str]  # (projection, build, key)


@dataclass(frozen=True)
class _Row:
    fleet_id: str
    applied_seq: int
    held: tuple[int, ...]
    gaps: list[list[int]]
    state: bytes
    head: bytes
    source: TopicPartition | None
    checkpoint_seq: int
    checkpoint_bytes: int
    tail_count: int
    tail_bytes: int
    conflicts: int = 0


@dataclass
class _Data:
    offsets: dict[OffsetKey, int] = field(default_factory=dict)
    rows: dict[Key, _Row] = field(default_factory=dict)
    tails: dict[Key, dict[int, bytes]] = field(default_factory=dict)
    held: dict[Key, dict[int, bytes]] = field(default_factory=dict)
    history: dict[Key, dict[tuple[str, str], HistoryRow]] = field(default_factory=dict)
    builds: dict[BuildKey, int] = field(default_factory=dict)
    live: dict[str, str] = field(default_factory=dict)
    ids: dict[Key, dict[int, str]] = field(default_factory=dict)

    def copy(self) -> _Data:
        return _Data(
            dict(self.offsets),
            dict(self.rows),
            {k: dict(v) for k, v in self.tails.items()},
            {k: dict(v) for k, v in self.held.items()},
            {k: dict(v) for k, v in self.history.items()},
            dict(self.builds),
            dict(self.live),
            {k: dict(v) for k, v in self.ids.items()},
        )


def _json(doc: bytes | None) -> bytes:
    """A document as jsonb gives it back (keys reordered, whitespace gone)."""
    return orjson.dumps(orjson.loads(doc or b"{}"), option=orjson.OPT_SORT_KEYS)


class MemoryTransaction:
    def __init__(self, data: _Data) -> None:
        self.data = data

    async def lock_positions(
        self,
        builds: Sequence[BuildKey],
        partitions: Sequence[TopicPartition],
        known: Collection[OffsetKey] = frozenset(),
    ) -> dict[BuildKey, dict[TopicPartition, int]]:
        out: dict[BuildKey, dict[TopicPartition, int]] = {b: {} for b in builds}
        for proj, build in builds:
            for t, p in partitions:
                out[(proj, build)][(t, p)] = self.data.offsets.setdefault((proj, build, t, p), -1)
        return out

    async def live_builds(self, projections: Sequence[str]) -> dict[str, str]:
        return {p: self.data.live[p] for p in projections if p in self.data.live}

    async def load_states(
        self,
        wanted: Mapping[BuildKey, Sequence[str]],
        cached: Mapping[BuildKey, Mapping[str, int]] | None = None,
    ) -> dict[BuildKey, dict[str, RunRow]]:
        cached = cached or {}
        out: dict[BuildKey, dict[str, RunRow]] = {b: {} for b in wanted}
        for (proj, build), keys in wanted.items():
            for key in keys:
                stored = self.data.rows.get((proj, build, key))
                if stored is None:
                    continue
                hit = cached.get((proj, build), {}).get(key, -1) == stored.applied_seq
                row = RunRow(
                    key,
                    stored.fleet_id,
                    stored.applied_seq,
                    stored.held,
                    None if hit else orjson.loads(stored.state),
                    {},
                    hit,
                    stored.source,
                    stored.checkpoint_seq,
                    stored.checkpoint_bytes,
                    stored.tail_count,
                    stored.tail_bytes,
                    conflicts=stored.conflicts,
                )
                if stored.tail_count and not hit:
                    row.tail_payloads = dict(self.data.tails.get((proj, build, key), {}))
                if stored.held:
                    row.held_payloads = dict(self.data.held.get((proj, build, key), {}))
                out[(proj, build)][key] = row
        return out

    async def entry_ids(
        self, wanted: Mapping[BuildKey, Mapping[str, Sequence[int]]]
    ) -> dict[BuildKey, dict[str, dict[int, str]]]:
        out: dict[BuildKey, dict[str, dict[int, str]]] = {}
        for (proj, build), keys in wanted.items():
            for key, seqs in keys.items():
                stored = self.data.ids.get((proj, build, key), {})
                found = {seq: stored[seq] for seq in seqs if seq in stored}
                if found:
                    out.setdefault((proj, build), {})[key] = found
        return out

    async def write(
        self,
        writes: Mapping[BuildKey, Sequence[RunWrite]],
        positions: Mapping[BuildKey, Mapping[TopicPartition, int]],
    ) -> None:
        data = self.data
        for (proj, build), ws in writes.items():
            for w in ws:
                key = (proj, build, w.run_id)
                old = data.rows.get(key)
                gaps = [list(g) for g in w.gaps]
                if w.state is not None:  # a checkpoint: the tail starts again
                    head = w.head if w.head is not None else w.state
                    data.rows[key] = _Row(
                        w.fleet_id,
                        w.applied_seq,
                        tuple(w.held),
                        gaps,
                        _json(w.state),
                        _json(head),
                        old.source if old and old.source else w.source,
                        w.applied_seq,
                        len(w.state),
                        0,
                        0,
                        (old.conflicts if old else 0) + w.conflicts,
                    )
                    data.tails.pop(key, None)
                else:
                    if old is None:
                        raise LookupError(f"{key}: a key's first write must be a checkpoint")
                    data.rows[key] = replace(
                        old,
                        applied_seq=w.applied_seq,
                        held=tuple(w.held),
                        gaps=gaps,
                        head=_json(w.head),
                        tail_count=w.tail_count,
                        tail_bytes=w.tail_bytes,
                        conflicts=old.conflicts + w.conflicts,
                    )
                    tail = data.tails.setdefault(key, {})
                    for seq, payload in w.tail.items():
                        tail.setdefault(seq, payload)
                ids = data.ids.setdefault(key, {})
                for seq, entry_id in w.entry_ids.items():
                    ids.setdefault(seq, entry_id)
                held = data.held.setdefault(key, {})
                for seq, payload in w.hold.items():
                    held.setdefault(seq, payload)
                for seq in w.release:
                    held.pop(seq, None)
                history = data.history.setdefault(key, {})
                for h in w.history:
                    # as jsonb would keep it; a row once written stays
                    doc = orjson.loads(h.json)
                    history.setdefault((h.kind, h.key), HistoryRow(h.kind, h.key, h.seq, doc))
        for (proj, build), by_tp in positions.items():
            for (t, p), offset in by_tp.items():
                k = (proj, build, t, p)
                if k in data.offsets:  # only locked rows move, as in PostgreSQL
                    data.offsets[k] = max(data.offsets[k], offset)


class MemoryStore:
    """:class:`~projectors.stores.contract.Store` in this process's memory."""

    def __init__(self) -> None:
        self._data = _Data()
        self._lock = asyncio.Lock()
        self.fail_next: BaseException | None = None  # raised by the next transaction (tests)

    @asynccontextmanager
    async def transaction(self, lane: str = "hot") -> AsyncIterator[MemoryTransaction]:
        async with self._lock:
            if self.fail_next is not None:
                exc, self.fail_next = self.fail_next, None
                raise exc
            work = self._data.copy()
            yield MemoryTransaction(work)
            self._data = work  # committed: only when the block did not raise

    async def read_positions(
        self, projection: str, build: str, topics: Iterable[str], lane: str = "positions"
    ) -> dict[TopicPartition, int]:
        wanted = set(topics)
        return {
            (t, p): o
            for (proj, b, t, p), o in self._data.offsets.items()
            if proj == projection and b == build and t in wanted
        }

    async def ensure_build(
        self,
        projection: str,
        build: str,
        version: int,
        live: bool,
        lane: str = "hot",
        inputs: dict[str, Any] | None = None,
    ) -> None:
        self._data.builds.setdefault((projection, build), version)
        if live:
            self._data.live.setdefault(projection, build)

    async def live_build(self, projection: str, lane: str = "hot") -> str | None:
        return self._data.live.get(projection)

    async def set_live(self, projection: str, build: str, lane: str = "hot") -> None:
        if (projection, build) not in self._data.builds:
            raise LookupError(f"{projection}: no build {build}")
        self._data.live[projection] = build

    async def heads(self, projection: str, build: str, lane: str = "hot") -> list[StoredHead]:
        return [
            StoredHead(
                key,
                row.applied_seq,
                row.held,
                copy.deepcopy(row.gaps),
                row.head if row.head != b"{}" else None,
            )
            for (proj, b, key), row in sorted(self._data.rows.items())
            if proj == projection and b == build
        ]

    async def history(
        self, projection: str, build: str, key: str, lane: str = "hot"
    ) -> list[HistoryRow]:
        rows = self._data.history.get((projection, build, key), {})
        return sorted(rows.values(), key=lambda h: (h.seq, h.kind, h.key))

    async def tail(self, projection: str, build: str, key: str, lane: str = "hot") -> list[bytes]:
        return [p for _, p in sorted(self._data.tails.get((projection, build, key), {}).items())]

    async def reset(self, lane: str) -> None:
        return None

    async def close(self) -> None:
        return None


class MemoryViewStore:
    """:class:`~projectors.stores.contract.ViewStore` in memory, compare-and-set as in Redis."""

    def __init__(self) -> None:
        self.views: dict[Key, tuple[int, int, bytes]] = {}  # (version, applied_seq, doc)
        self.ready: set[BuildKey] = set()
        self.live: dict[str, str] = {}

    async def write(self, projection: str, build: str, views: Iterable[RunView]) -> int:
        moved = 0
        for v in views:
            key = (projection, build, v.run_id)
            version = view_version(v.applied_seq, v.held)
            current = self.views.get(key)
            if current is None or current[0] < version:
                self.views[key] = (version, v.applied_seq, view_doc(v))
                moved += 1
        return moved

    async def write_builds(
        self, batches: Iterable[tuple[str, str, Iterable[RunView]]]
    ) -> set[BuildKey]:
        ready = set()
        for projection, build, views in batches:
            if (projection, build) in self.ready:
                ready.add((projection, build))
            await self.write(projection, build, views)
        return ready

    async def ready_builds(self, builds: Iterable[BuildKey]) -> set[BuildKey]:
        return {b for b in builds if b in self.ready}

    async def is_ready(self, projection: str, build: str) -> bool:
        return (projection, build) in self.ready

    async def mark_ready(self, projection: str, build: str) -> None:
        self.ready.add((projection, build))

    async def set_live(self, projection: str, build: str) -> None:
        self.live[projection] = build

    async def read(self, projection: str, build: str, run_id: str) -> tuple[int, Any] | None:
        found = self.views.get((projection, build, run_id))
        return None if found is None else (found[1], orjson.loads(found[2]))

    async def read_live(self, projection: str, run_id: str) -> tuple[int, Any] | None:
        build = self.live.get(projection)
        return None if build is None else await self.read(projection, build, run_id)

    async def drop_build(self, projection: str, build: str) -> int:
        gone = [k for k in self.views if k[:2] == (projection, build)]
        for key in gone:
            del self.views[key]
        self.ready.discard((projection, build))
        return len(gone)

    async def close(self) -> None:
        return None

    def flush(self) -> None:
        """Lose everything, as a Redis FLUSHALL or a restart without persistence would."""
        self.views.clear()
        self.ready.clear()
        self.live.clear()
