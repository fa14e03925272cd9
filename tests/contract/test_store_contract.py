"""The store contract (projectors/stores/contract.py), one test class run against every backend.

``StoreContract`` runs on the in-memory store and on PostgreSQL; ``ViewContract`` on the
in-memory views and on Redis. Each PostgreSQL and Redis test uses its own projection name and
key prefix, so they share the services with the rest of the suite.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import orjson
import pytest
import redis.asyncio as aioredis

from infra.migrate import migrate
from infra.settings import Settings
from projectors.base import HistoryRow
from projectors.stores.contract import (
    RunView,
    RunWrite,
    Store,
    ViewStore,
    key_kind,
    scoped_key,
)
from projectors.stores.memory import MemoryStore, MemoryViewStore
from projectors.stores.postgres import PostgresStore
from projectors.stores.redis import RedisViewStore

TP = ("agentledger.ledger.f", 0)


def _checkpoint(key: str, seq: int, state: dict[str, object], **extra: object) -> RunWrite:
    doc = orjson.dumps(state)
    return RunWrite(key, "f", seq, (), [], doc, **extra)  # type: ignore[arg-type]


class StoreContract:
    """What every Store must do. Subclasses give the ``store`` fixture."""

    @pytest.fixture
    def names(self) -> tuple[str, str]:
        tag = uuid.uuid4().hex[:8]
        return f"p{tag}", f"b{tag}"

    async def test_positions_start_unset_and_commit_with_the_batch(
        self, store: Store, names: tuple[str, str]
    ) -> None:
        build = names
        async with store.transaction() as tx:
            locked = await tx.lock_positions([build], [TP])
            assert locked == {build: {TP: -1}}
            await tx.write({build: [_checkpoint("r1", 1, {"n": 1})]}, {build: {TP: 7}})
        assert await store.read_positions(*build, [TP[0]]) == {TP: 7}
        async with store.transaction() as tx:
            rows = await tx.load_states({build: ["r1", "r2"]})
        assert set(rows[build]) == {"r1"}
        assert rows[build]["r1"].applied_seq == 1 and rows[build]["r1"].state == {"n": 1}

    async def test_offsets_never_move_back(self, store: Store, names: tuple[str, str]) -> None:
        build = names
        for offset in (10, 4):
            async with store.transaction() as tx:
                await tx.lock_positions([build], [TP])
                await tx.write({}, {build: {TP: offset}})
        assert await store.read_positions(*build, [TP[0]]) == {TP: 10}

    async def test_a_failed_transaction_writes_nothing(
        self, store: Store, names: tuple[str, str]
    ) -> None:
        build = names
        with pytest.raises(RuntimeError):
            async with store.transaction() as tx:
                await tx.lock_positions([build], [TP])
                await tx.write({build: [_checkpoint("r1", 1, {"n": 1})]}, {build: {TP: 3}})
                raise RuntimeError("the batch failed after writing")
        assert (await store.read_positions(*build, [TP[0]])).get(TP, -1) == -1
        async with store.transaction() as tx:
            assert await tx.load_states({build: ["r1"]}) == {build: {}}

    async def test_a_runs_rows_are_never_rewritten(
        self, store: Store, names: tuple[str, str]
    ) -> None:
        """Tail and history rows are written once: a second write of the same row (a retried
        batch, a redelivery) leaves the first as it was."""
        build = names
        first = HistoryRow("row", "1", 1, {"v": "first"})
        again = HistoryRow("row", "1", 1, {"v": "rewritten"})
        async with store.transaction() as tx:
            await tx.write({build: [_checkpoint("r1", 1, {"n": 1}, history=[first])]}, {})
        tail = RunWrite("r1", "f", 2, (), [], None, b"{}", history=[again], tail={2: b"e2"})
        tail.tail_count, tail.tail_bytes = 1, 2
        async with store.transaction() as tx:
            await tx.write({build: [tail]}, {})
        rewrite = RunWrite("r1", "f", 2, (), [], None, b"{}", tail={2: b"other"})
        rewrite.tail_count, rewrite.tail_bytes = 1, 2
        async with store.transaction() as tx:
            await tx.write({build: [rewrite]}, {})
        assert await store.history(*build, "r1") == [first]
        assert await store.tail(*build, "r1") == [b"e2"]

    async def test_checkpoint_tail_and_head(self, store: Store, names: tuple[str, str]) -> None:
        build = names
        async with store.transaction() as tx:
            await tx.write({build: [_checkpoint("r1", 1, {"n": 1}, head=b'{"h":1}')]}, {})
        step = RunWrite("r1", "f", 3, (), [], None, b'{"h":3}', tail={2: b"e2", 3: b"e3"})
        step.tail_count, step.tail_bytes = 2, 4
        async with store.transaction() as tx:
            await tx.write({build: [step]}, {})
        async with store.transaction() as tx:
            row = (await tx.load_states({build: ["r1"]}))[build]["r1"]
        assert (row.applied_seq, row.checkpoint_seq, row.state) == (3, 1, {"n": 1})
        assert (row.tail_count, row.tail_bytes) == (2, 4)
        assert row.tail_payloads == {2: b"e2", 3: b"e3"}
        [head] = await store.heads(*build)
        assert orjson.loads(head.head or b"") == {"h": 3} and head.applied_seq == 3
        async with store.transaction() as tx:  # a new checkpoint clears the tail
            await tx.write({build: [_checkpoint("r1", 4, {"n": 4})]}, {})
            row = (await tx.load_states({build: ["r1"]}))[build]["r1"]
        assert row.tail_payloads == {} and row.tail_count == 0 and row.checkpoint_seq == 4
        assert await store.tail(*build, "r1") == []

    async def test_a_cached_position_skips_the_document(
        self, store: Store, names: tuple[str, str]
    ) -> None:
        build = names
        async with store.transaction() as tx:
            await tx.write({build: [_checkpoint("r1", 5, {"n": 5})]}, {})
            hit = (await tx.load_states({build: ["r1"]}, {build: {"r1": 5}}))[build]["r1"]
            miss = (await tx.load_states({build: ["r1"]}, {build: {"r1": 4}}))[build]["r1"]
        assert hit.cached and hit.state is None
        assert not miss.cached and miss.state == {"n": 5}

    async def test_held_entries_wait_and_are_released(
        self, store: Store, names: tuple[str, str]
    ) -> None:
        build = names
        w = _checkpoint("r1", 1, {"n": 1}, hold={3: b"e3"})
        w.held = (3,)
        async with store.transaction() as tx:
            await tx.write({build: [w]}, {})
            row = (await tx.load_states({build: ["r1"]}))[build]["r1"]
        assert row.held == (3,) and row.held_payloads == {3: b"e3"}
        async with store.transaction() as tx:
            await tx.write({build: [_checkpoint("r1", 3, {"n": 3}, release=[3])]}, {})
            row = (await tx.load_states({build: ["r1"]}))[build]["r1"]
        assert row.held == () and row.held_payloads == {}

    async def test_documents_keep_nul_and_private_use_text(
        self, store: Store, names: tuple[str, str]
    ) -> None:
        build = names
        text = "bin\x00ary \ue000 end"
        async with store.transaction() as tx:
            await tx.write({build: [_checkpoint("r1", 1, {"out": text})]}, {})
            row = (await tx.load_states({build: ["r1"]}))[build]["r1"]
        assert row.state == {"out": text}

    async def test_a_key_of_another_kind_is_kept_like_a_run(
        self, store: Store, names: tuple[str, str]
    ) -> None:
        """Memory that lives across runs (a repository's facts) uses the same rows."""
        build = names
        repo = scoped_key("repo", "acme/api")
        assert key_kind(repo) == ("repo", "acme/api") and key_kind("r1") == ("run", "r1")
        async with store.transaction() as tx:
            await tx.write(
                {build: [_checkpoint(repo, 1, {"facts": 1}), _checkpoint("r1", 1, {"n": 1})]},
                {},
            )
            rows = (await tx.load_states({build: [repo, "r1"]}))[build]
        assert rows[repo].state == {"facts": 1} and rows["r1"].state == {"n": 1}

    async def test_entry_ids_are_written_once_and_conflicts_add_up(
        self, store: Store, names: tuple[str, str]
    ) -> None:
        build = names
        first = _checkpoint("r1", 2, {"n": 2}, entry_ids={1: "e1", 2: "e2"})
        async with store.transaction() as tx:
            await tx.write({build: [first]}, {})
        again = _checkpoint("r1", 2, {"n": 2}, entry_ids={2: "other"}, conflicts=1)
        async with store.transaction() as tx:
            await tx.write({build: [again]}, {})
        step = RunWrite("r1", "f", 3, (), [], None, b"{}", entry_ids={3: "e3"}, conflicts=2)
        async with store.transaction() as tx:
            await tx.write({build: [step]}, {})
            found = await tx.entry_ids({build: {"r1": [1, 2, 3, 4], "r2": [1]}})
            row = (await tx.load_states({build: ["r1"]}))[build]["r1"]
        assert found == {build: {"r1": {1: "e1", 2: "e2", 3: "e3"}}}
        assert row.conflicts == 3

    async def test_builds_and_the_live_pointer(self, store: Store, names: tuple[str, str]) -> None:
        projection, build = names
        assert await store.live_build(projection) is None
        await store.ensure_build(projection, build, 1, live=True)
        await store.ensure_build(projection, build + "x", 1, live=True)  # one is live already
        assert await store.live_build(projection) == build
        await store.set_live(projection, build + "x")
        assert await store.live_build(projection) == build + "x"
        async with store.transaction() as tx:
            assert await tx.live_builds([projection, "none"]) == {projection: build + "x"}


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        yield MemoryStore()


@pytest.mark.integration
class TestPostgresStore(StoreContract):
    @pytest.fixture
    async def store(self, services: Settings) -> AsyncIterator[Store]:
        migrate(services.pg_address)
        store = PostgresStore(services.pg_address)
        try:
            yield store
        finally:
            await store.close()


def _view(key: str, seq: int, held: int = 0, doc: bytes = b'{"n":1}') -> RunView:
    return RunView(key, seq, held, [], doc)


class ViewContract:
    """What every ViewStore must do. Subclasses give the ``views`` fixture."""

    @pytest.fixture
    def names(self) -> tuple[str, str]:
        tag = uuid.uuid4().hex[:8]
        return f"p{tag}", f"b{tag}"

    async def test_an_older_view_write_is_ignored(
        self, views: ViewStore, names: tuple[str, str]
    ) -> None:
        projection, build = names
        assert await views.write(projection, build, [_view("r1", 5, doc=b'{"n":5}')]) == 1
        assert await views.write(projection, build, [_view("r1", 4, doc=b'{"n":4}')]) == 0
        assert await views.write(projection, build, [_view("r1", 5, doc=b'{"n":6}')]) == 0
        found = await views.read(projection, build, "r1")
        assert found == (5, {"applied_seq": 5, "gaps": [], "state": {"n": 5}})

    async def test_more_held_entries_at_one_position_is_newer(
        self, views: ViewStore, names: tuple[str, str]
    ) -> None:
        projection, build = names
        await views.write(projection, build, [_view("r1", 5)])
        assert await views.write(projection, build, [_view("r1", 5, held=2, doc=b"{}")]) == 1
        assert await views.write(projection, build, [_view("r1", 5, held=1)]) == 0

    async def test_ready_and_live(self, views: ViewStore, names: tuple[str, str]) -> None:
        projection, build = names
        assert not await views.is_ready(projection, build)
        assert await views.write_builds([(projection, build, [_view("r1", 1)])]) == set()
        await views.mark_ready(projection, build)
        assert await views.write_builds([(projection, build, [_view("r1", 2)])]) == {
            (projection, build)
        }
        assert await views.ready_builds([(projection, build), (projection, "x")]) == {
            (projection, build)
        }
        assert await views.read_live(projection, "r1") is None
        await views.set_live(projection, build)
        live = await views.read_live(projection, "r1")
        assert live is not None and live[0] == 2

    async def test_drop_build_deletes_its_views_and_ready_mark_only(
        self, views: ViewStore, names: tuple[str, str]
    ) -> None:
        projection, build = names
        await views.write(projection, build, [_view("r1", 1), _view("r2", 3)])
        await views.write(projection, build + "k", [_view("r1", 2)])  # another build: kept
        await views.mark_ready(projection, build)
        await views.set_live(projection, build + "k")
        assert await views.drop_build(projection, build) == 2
        assert await views.read(projection, build, "r1") is None
        assert await views.read(projection, build, "r2") is None
        assert not await views.is_ready(projection, build)
        assert await views.read(projection, build + "k", "r1") is not None
        assert await views.read_live(projection, "r1") is not None
        assert await views.drop_build(projection, build) == 0


class TestMemoryViews(ViewContract):
    @pytest.fixture
    async def views(self) -> AsyncIterator[ViewStore]:
        yield MemoryViewStore()


@pytest.mark.integration
class TestRedisViews(ViewContract):
    @pytest.fixture
    async def views(self, services: Settings) -> AsyncIterator[ViewStore]:
        client = aioredis.Redis.from_url(services.redis_address)
        store = RedisViewStore(client, f"c{uuid.uuid4().hex[:8]}")
        try:
            yield store
        finally:
            await store.close()

    async def test_a_redis_that_lost_its_scripts_gets_the_write(
        self, views: ViewStore, names: tuple[str, str]
    ) -> None:
        """The CAS script runs by its SHA in the write's one round trip; after a restart (here
        SCRIPT FLUSH) it is loaded again and the same write lands, never backwards."""
        assert isinstance(views, RedisViewStore)
        projection, build = names
        assert await views.write(projection, build, [_view("r1", 3, doc=b'{"n":3}')]) == 1
        await views.client.script_flush()
        assert await views.write(projection, build, [_view("r1", 4, doc=b'{"n":4}')]) == 1
        await views.client.script_flush()
        assert await views.write(projection, build, [_view("r1", 2, doc=b'{"n":2}')]) == 0
        found = await views.read(projection, build, "r1")
        assert found == (4, {"applied_seq": 4, "gaps": [], "state": {"n": 4}})
