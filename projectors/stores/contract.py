"""The store contract: what the engine needs from wherever projections are kept.

Four things are stored, each keyed by (projection, build, ...):

- **positions**: the last applied offset of every source partition. They never move back.
- **keyed state**: per (projection, build, key) a row (applied sequence number, entries held
  behind a gap, a bounded *head*, a whole-state *checkpoint*) and the rows that only grow with
  the key — its *tail* of entries folded since the checkpoint and its *history* rows. A row of
  either is written once and never rewritten. A run is one kind of key (its id);
  :func:`scoped_key` makes keys of other kinds (a repository's, a user's memory) that can never
  equal a run id.
- **builds and the live pointer**: which builds of a projection exist, and which one readers
  follow.
- **views** (:class:`ViewStore`): what agents read back, written compare-and-set so that an
  older write never replaces a newer one.

A :class:`Store` does the first three in transactions: a batch's rows and its positions commit
together or not at all. Implementations: :mod:`projectors.stores.memory` (tests, no services),
:mod:`projectors.stores.postgres` (PostgreSQL); views: ``MemoryViewStore`` and
``RedisViewStore``. ``tests/contract`` runs one test class against each.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from projectors.base import HistoryRow

TopicPartition = tuple[str, int]
BuildKey = tuple[str, str]  # (projection, build)
OffsetKey = tuple[str, str, str, int]  # (projection, build, topic, partition)

# Run ids match schemas.models.ID_PATTERN, which has no "!": a key that starts with one is of
# another kind and never collides with a run.
_SCOPE = "!"


def scoped_key(kind: str, key_id: str) -> str:
    """The state key of something that is not a run (e.g. ``scoped_key("repo", "acme/api")``)."""
    if not kind or ":" in kind or kind == "run":
        raise ValueError(f"a key kind is a non-empty word other than 'run', not {kind!r}")
    return f"{_SCOPE}{kind}:{key_id}"


def key_kind(key: str) -> tuple[str, str]:
    """(kind, id) of a state key: ``("run", run_id)`` for a run."""
    if key.startswith(_SCOPE):
        kind, _, key_id = key[1:].partition(":")
        return kind, key_id
    return "run", key


@dataclass
class RunRow:
    """One key's stored position and state for one projection build (a run's, usually)."""

    run_id: str
    fleet_id: str
    applied_seq: int
    held: tuple[int, ...]
    state: dict[str, Any] | None
    held_payloads: dict[int, bytes] = field(default_factory=dict)
    # The caller's cached state is current (stored applied_seq equals the cached one): the
    # document was not fetched and ``state`` is None.
    cached: bool = False
    source: TopicPartition | None = None  # where the run's entries come from
    # ``state`` is a checkpoint as of checkpoint_seq; the entries applied since (the tail) are
    # in ``tail_payloads`` (fetched with the state only, so empty when ``cached``)
    checkpoint_seq: int = 0
    checkpoint_bytes: int = 0
    tail_count: int = 0
    tail_bytes: int = 0
    tail_payloads: dict[int, bytes] = field(default_factory=dict)
    conflicts: int = 0  # conflicting duplicates found so far


@dataclass
class RunWrite:
    """A key's new row, plus the held entries to add and to drop.

    With ``state`` (a new checkpoint, as of ``applied_seq``) the key's tail is cleared;
    without, the checkpoint stays and ``tail`` (the entries applied now) is added to its tail.
    """

    run_id: str
    fleet_id: str
    applied_seq: int
    held: tuple[int, ...]
    gaps: list[tuple[int, int]]
    state: bytes | None  # the projection's whole JSON document, when checkpointed now
    # members of ``state`` that grow with the run (the projection's ``paged``): a store may
    # keep them in pages outside the row, and gives the whole document back when it loads it
    head: bytes | None = None  # what readers are given (None: the state)
    hold: dict[int, bytes] = field(default_factory=dict)
    release: list[int] = field(default_factory=list)
    history: list[HistoryRow] = field(default_factory=list)
    source: TopicPartition | None = None
    tail: dict[int, bytes] = field(default_factory=dict)
    tail_count: int = 0  # the tail's size after this write
    tail_bytes: int = 0
    # sequence_no -> entry id of the entries applied now (projections that keep entry ids);
    # written once, never rewritten
    entry_ids: dict[int, str] = field(default_factory=dict)
    conflicts: int = 0  # conflicting duplicates found now (added to the run's count)
    # The key changed and its projection has a change stream: a live build's new head goes to
    # the change outbox in this same transaction (PostgreSQL: al_changes), with the W3C
    # traceparent of the last entry applied.
    publish: bool = False
    traceparent: str | None = None
    paged: tuple[str, ...] = ()
    # ``state`` already split into pages as projectors.paging.split would (the projection made
    # it from its pieces), or None: a store that pages splits ``state`` itself
    split: tuple[bytes, dict[str, bytes]] | None = None


@dataclass(frozen=True)
class StoredHead:
    """A key's head as readers (and a view refill) get it."""

    run_id: str
    applied_seq: int
    held: tuple[int, ...]
    gaps: list[list[int]]
    head: bytes | None  # JSON; None when the key has no state


def view_version(applied_seq: int, held: int) -> int:
    """Monotonic per key: the applied sequence first, then how many entries wait behind a gap.

    Held entries only grow while ``applied_seq`` stands still and are released only when it
    moves, so a newer view always has a greater version.
    """
    return applied_seq * (1 << 20) + min(held, (1 << 20) - 1)


@dataclass(frozen=True)
class RunView:
    """What a view store serves for one key: its head and how complete it is."""

    run_id: str
    applied_seq: int
    held: int
    gaps: list[list[int]]
    state: bytes | None  # the projection's JSON head


def view_doc(view: RunView) -> bytes:
    """``{"applied_seq", "gaps", "state"}`` as JSON, the state spliced in without re-encoding."""
    head = orjson.dumps({"applied_seq": view.applied_seq, "gaps": view.gaps})
    return b"".join((head[:-1], b',"state":', view.state or b"null", b"}"))  # (one copy)


class StoreTransaction(Protocol):
    """One transaction: what a batch reads and writes, committed together."""

    async def lock_positions(
        self,
        builds: Sequence[BuildKey],
        partitions: Sequence[TopicPartition],
        known: Collection[OffsetKey] = frozenset(),
    ) -> dict[BuildKey, dict[TopicPartition, int]]:
        """The positions of these builds' partitions (-1: none yet), locked until the end of
        the transaction so that two writers of one partition serialize."""

    async def live_builds(self, projections: Sequence[str]) -> dict[str, str]:
        """The live build of each of these projections that has one, the pointers held until
        the end of the transaction (a swap waits for it)."""

    async def load_states(
        self,
        wanted: Mapping[BuildKey, Sequence[str]],
        cached: Mapping[BuildKey, Mapping[str, int]] | None = None,
    ) -> dict[BuildKey, dict[str, RunRow]]:
        """The stored rows of these keys, with their held entries and (unless ``cached`` names
        the stored position, then ``RunRow.cached``) their checkpoint and tail."""

    async def entry_ids(
        self, wanted: Mapping[BuildKey, Mapping[str, Sequence[int]]]
    ) -> dict[BuildKey, dict[str, dict[int, str]]]:
        """The entry ids stored for these sequence numbers of these keys (those that have one)."""

    async def write(
        self,
        writes: Mapping[BuildKey, Sequence[RunWrite]],
        positions: Mapping[BuildKey, Mapping[TopicPartition, int]],
    ) -> None:
        """Write the keys' rows and move the positions forward (never back). Tail, history and
        entry-id rows already stored stay as they are; conflicts add to the key's count."""


class Store(Protocol):
    """Positions, keyed state, builds and the live pointer (see the module's docstring)."""

    def transaction(self, lane: str = "hot") -> AbstractAsyncContextManager[StoreTransaction]:
        """A transaction on ``lane``'s connection (lanes run concurrently, each in turn)."""

    async def read_positions(
        self, projection: str, build: str, topics: Iterable[str], lane: str = "positions"
    ) -> dict[TopicPartition, int]:
        """The stored positions of every partition of these topics."""

    async def ensure_build(
        self,
        projection: str,
        build: str,
        version: int,
        live: bool,
        lane: str = "hot",
        inputs: dict[str, Any] | None = None,
    ) -> None:
        """Record the build and the data versions it uses (``inputs``: price table, taxonomy,
        ...; kept from the first record that has them); with ``live``, make it the live one
        when none is yet."""

    async def live_build(self, projection: str, lane: str = "hot") -> str | None:
        """The build readers follow, if any."""

    async def set_live(self, projection: str, build: str, lane: str = "hot") -> None:
        """Point readers at this build."""

    async def heads(self, projection: str, build: str, lane: str = "hot") -> list[StoredHead]:
        """Every key's head of a build, by key (to refill views)."""

    async def history(
        self, projection: str, build: str, key: str, lane: str = "hot"
    ) -> list[HistoryRow]:
        """A key's history rows, by sequence number."""

    async def tail(self, projection: str, build: str, key: str, lane: str = "hot") -> list[bytes]:
        """The entries folded onto a key's checkpoint since it was written, by sequence."""

    async def reset(self, lane: str) -> None:
        """Drop ``lane``'s connection after a failure (the next use makes a new one)."""

    async def close(self) -> None: ...


class ViewStore(Protocol):
    """Per-key views of hot builds, written compare-and-set on (applied_seq, held)."""

    async def write(self, projection: str, build: str, views: Iterable[RunView]) -> int:
        """Write views that are newer than the stored ones; how many moved forward."""

    async def write_builds(
        self, batches: Iterable[tuple[str, str, Iterable[RunView]]]
    ) -> set[tuple[str, str]]:
        """Write several builds' views; the builds that were complete (ready) when written."""

    async def ready_builds(self, builds: Iterable[tuple[str, str]]) -> set[tuple[str, str]]: ...

    async def is_ready(self, projection: str, build: str) -> bool: ...

    async def mark_ready(self, projection: str, build: str) -> None: ...

    async def set_live(self, projection: str, build: str) -> None: ...

    async def read(self, projection: str, build: str, run_id: str) -> tuple[int, Any] | None:
        """(applied_seq, {"applied_seq", "gaps", "state"}) of a key's view."""

    async def read_live(self, projection: str, run_id: str) -> tuple[int, Any] | None: ...

    async def drop_build(self, projection: str, build: str) -> int:
        """Delete a build's views and its ready mark (not a live pointer); how many views."""

    async def close(self) -> None: ...
