"""Rebuild by replay on the real services: the five change drills of issue 7.

Each test runs a private deployment (own database, topics, Redis prefix) with a real worker.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
import redis.asyncio as aioredis

from consumers.views import live_state
from infra.settings import Settings
from projectors.base import fold_all
from projectors.cost_metrics import CostMetricsProjection, shown_state
from projectors.failure_classifications import FailureClassifications, Taxonomy
from projectors.pricing import GenaiPrices, LayeredPrices, PriceTable
from projectors.registry import NAMES, projection
from projectors.run_stats import RunStats, RunStatsProjection
from projectors.stores.redis import RedisViewStore
from schemas.catalog import CATALOG
from schemas.codec import LedgerCodec
from schemas.models import LedgerEntry
from streams.builds import BuildVersionError, live_targets
from streams.deployment import PrivateDeployment
from streams.publisher import AsyncPublisher
from streams.rebuild import Start, create_build, list_builds, run_build, swap, verify
from streams.simulate import simulate_runs
from tests.integration.engine_support import current_states

pytestmark = pytest.mark.integration

FLEETS = ["fleet-01"]
HOT = ("run-stats", "working-memory", "context-manifests")
Runs = list[list[LedgerEntry]]


class Deployment(PrivateDeployment):
    def live(self, name: str) -> str:
        with psycopg.connect(self.settings.pg_address) as conn:
            row = conn.execute(
                "SELECT build FROM al_live WHERE projection = %s", (name,)
            ).fetchone()
        assert row is not None
        return str(row[0])

    def states(self, name: str, build: str | None = None) -> dict[str, tuple[int, Any]]:
        """run_id -> (applied_seq, state) of a build (the live one by default)."""
        return current_states(self.settings.pg_address, name, build)

    def wait_applied(
        self, runs: Runs, names: tuple[str, ...] = NAMES, timeout_s: float = 120
    ) -> None:
        want = {run[0].run_id: len(run) for run in runs}
        deadline = time.monotonic() + timeout_s
        while True:
            behind = [
                n
                for n in names
                if any(self.states(n).get(r, (0, None))[0] < seq for r, seq in want.items())
            ]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"projections {behind} did not apply every run in time")
            time.sleep(0.3)


@pytest.fixture
def deployment(services: Settings, tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(services, "rebuild", FLEETS, tmp_path, {"AGENTLEDGER_WORKER_BATCH_SIZE": "500"})
    asyncio.run(d.create())
    yield d
    d.drop()


def _runs(count: int, seed: int) -> Runs:
    # real agents' run lengths (median ~150 entries, some in the thousands)
    return list(simulate_runs(len(FLEETS), count, seed, length_profile="real"))


async def _publish(settings: Settings, runs: Runs, pause_s: float = 0.0) -> None:
    async with AsyncPublisher(settings) as publisher:
        for run in runs:
            await publisher.publish_batch(run)
            await asyncio.sleep(pause_s)


def _applied_by_a_worker(d: Deployment, runs: Runs) -> None:
    """Publish the runs, let a worker apply them to the live builds, stop it."""
    asyncio.run(_publish(d.settings, runs))
    worker = d.start_worker("w")
    try:
        d.wait_applied(runs)
    finally:
        d.stop_worker(worker)


def _serving(d: Deployment, name: str, run_id: str) -> int:
    """What a reader gets from PostgreSQL for the run right now (its applied sequence)."""
    return int(live_state(d.settings, name, run_id)["applied_seq"])


# -- drill 4: a rebuild while live traffic continues; after the swap, verify says equal ----


def test_drill_4_rebuild_under_live_traffic_then_swap_and_verify(deployment: Deployment) -> None:
    d = deployment
    drawn = _runs(40, seed=41)
    first, more = drawn[:12], drawn[12:]
    asyncio.run(_publish(d.settings, first))
    worker = d.start_worker("w")
    published: Runs = []
    runs: Runs = first
    try:
        d.wait_applied(first)
        old = {n: d.live(n) for n in ("working-memory", "cost-metrics")}

        async def traffic(stop: asyncio.Event) -> None:
            # a run every 0.5 s until the rebuilds are swapped in (however long the replay
            # processes take to start on a loaded machine), from a stock that outlasts them
            async with AsyncPublisher(d.settings) as publisher:
                for run in more[:-1]:
                    if stop.is_set():
                        return
                    await publisher.publish_batch(run)
                    published.append(run)
                    await asyncio.sleep(0.5)

        async def rebuild_while_publishing() -> dict[str, str]:
            stop = asyncio.Event()
            flowing = asyncio.create_task(traffic(stop))
            new = {}
            for name in old:
                p = projection(name)
                build = await create_build(d.settings, p, Start())
                # cost-metrics replays in two processes, each with half the partitions
                processes = 2 if name == "cost-metrics" else 1
                await run_build(d.settings, p, build, processes=processes)
                # Until the swap, readers are served by the old build, complete for every run.
                assert d.live(name) == old[name]
                assert _serving(d, name, first[0][0].run_id) == len(first[0])
                await swap(d.settings, p, build)
                new[name] = build
            assert not flowing.done(), "the traffic ran out before the rebuilds were swapped in"
            stop.set()
            await flowing
            await _publish(d.settings, more[-1:])  # and one run after both swaps
            published.extend(more[-1:])
            return new

        new = asyncio.run(rebuild_while_publishing())
        assert len(published) >= 2
        runs = first + published
        d.wait_applied(runs)  # the worker followed the pointer into the new builds
    finally:
        d.stop_worker(worker)
    for name, build in new.items():
        assert d.live(name) == build != old[name]
        assert set(d.states(name, build)) == {run[0].run_id for run in runs}
        assert len(d.states(name, old[name])) < len(runs), "the old build stopped at the swap"
        verdict = asyncio.run(verify(d.settings, projection(name)))
        assert verdict.equal, verdict.differences
        assert verdict.runs == len(runs) and verdict.live_build == build
    builds = {(i.projection, i.build): i for i in list_builds(d.settings)}
    assert builds[("working-memory", old["working-memory"])].live is False  # kept until dropped
    view = asyncio.run(_redis_view(d.settings, "working-memory", runs[-1][0].run_id))
    assert view is not None and view[0] == len(runs[-1])


async def _redis_view(settings: Settings, name: str, run_id: str) -> tuple[int, Any] | None:
    client = aioredis.Redis.from_url(settings.redis_address)
    try:
        return await RedisViewStore(client, settings.redis_prefix).read_live(name, run_id)
    finally:
        await client.aclose()


# -- drill 5: Redis lost entirely; the worker's refill (or a rebuild) restores every view ---


def test_drill_5_redis_lost_entirely_every_hot_view_comes_back(deployment: Deployment) -> None:
    d = deployment
    runs = _runs(10, seed=42)
    asyncio.run(_publish(d.settings, runs[:9]))
    worker = d.start_worker("w")
    try:
        d.wait_applied(runs[:9])
        client = redis.Redis.from_url(d.settings.redis_address)
        try:
            keys = list(client.scan_iter(match=f"{d.settings.redis_prefix}:*"))
            assert keys
            client.delete(*keys)
        finally:
            client.close()
        assert asyncio.run(_redis_view(d.settings, "working-memory", runs[0][0].run_id)) is None
        asyncio.run(_publish(d.settings, runs[9:]))  # the next batch finds the views gone
        d.wait_applied(runs)
        deadline = time.monotonic() + 30
        while True:
            missing = [
                (name, run[0].run_id)
                for name in HOT
                for run in runs
                if (v := asyncio.run(_redis_view(d.settings, name, run[0].run_id))) is None
                or v[0] != len(run)
            ]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert missing == []
    finally:
        d.stop_worker(worker)
    # A rebuild writes its own complete namespace too, and serves once swapped.
    p = projection("context-manifests")
    build = asyncio.run(create_build(d.settings, p, Start()))
    asyncio.run(swap(d.settings, p, build))
    view = asyncio.run(_redis_view(d.settings, "context-manifests", runs[3][0].run_id))
    assert view is not None and view[0] == len(runs[3])
    assert view[1]["state"]["next_turn"] is not None


# -- drill 2: a price change; "as billed" and "as repriced" both queryable -------------------


def _costs(d: Deployment, build: str) -> dict[str, Decimal]:
    with psycopg.connect(d.settings.pg_address) as conn:
        rows = conn.execute(
            "SELECT run_id, sum((doc->>'cost_usd')::numeric) FROM al_history "
            "WHERE projection = 'cost-metrics' AND build = %s AND kind = 'model_call' "
            "GROUP BY run_id",
            (build,),
        ).fetchall()
    return {r: Decimal(c) for r, c in rows}


def _total(state: Any) -> Decimal:
    assert state is not None
    return Decimal(state.totals.cost_usd)


def test_drill_2_price_change_rebuild_keeps_as_billed_and_as_repriced(
    deployment: Deployment, tmp_path: Path
) -> None:
    d = deployment
    runs = _runs(8, seed=43)
    _applied_by_a_worker(d, runs)
    shipped = json.loads(
        (Path(__file__).parents[2] / "projectors" / "data" / "prices.v1.json").read_text()
    )
    doubled = copy.deepcopy(shipped)
    doubled["version"] = "2026-12-01"
    for periods in doubled["models"].values():
        for period in periods:
            for key in ("input", "cached_input", "output", "reasoning"):
                if key in period:
                    period[key] = period[key] * 2
    table = tmp_path / "prices.json"
    table.write_text(json.dumps(doubled))
    # billed by the default source (genai-prices); repriced with our table over it (it names
    # every model the simulator uses, at twice the shipped table's rates)
    repriced_projection = CostMetricsProjection(LayeredPrices(PriceTable.load(table)))
    billed_build = d.live("cost-metrics")
    repriced_build = asyncio.run(create_build(d.settings, repriced_projection, Start()))
    asyncio.run(run_build(d.settings, repriced_projection, repriced_build))
    billed, repriced = _costs(d, billed_build), _costs(d, repriced_build)
    assert set(billed) == set(repriced) == {run[0].run_id for run in runs}
    at_shipped = CostMetricsProjection(PriceTable.shipped())
    as_shipped = {run[0].run_id: _total(fold_all(at_shipped, run)) for run in runs}
    assert all(repriced[r] == 2 * as_shipped[r] for r in billed)
    assert billed != repriced
    genai = GenaiPrices().version
    docs = d.states("cost-metrics", repriced_build)
    assert {st["price_version"] for _, st in docs.values()} == {f"{genai} + table 2026-12-01"}
    assert {st["price_version"] for _, st in d.states("cost-metrics").values()} == {genai}
    builds = {i.build: i for i in list_builds(d.settings, "cost-metrics")}
    assert builds[repriced_build].inputs["price_table"] == f"{genai} + table 2026-12-01"
    asyncio.run(swap(d.settings, repriced_projection, repriced_build))
    assert d.live("cost-metrics") == repriced_build  # readers now see the repriced figures
    assert _costs(d, billed_build) == billed  # and "as billed" stays queryable


# -- drill 3: a taxonomy change reclassifies history; before and after both visible ---------


def _classes(d: Deployment, build: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, state in d.states("failure-classifications", build).values():
        cls = state["classification"]["failure_class"]
        counts[cls] = counts.get(cls, 0) + 1
    return counts


def test_drill_3_taxonomy_change_reclassifies_history(
    deployment: Deployment, tmp_path: Path
) -> None:
    d = deployment
    runs = _runs(14, seed=44)  # one run per outcome
    _applied_by_a_worker(d, runs)
    shipped = json.loads(
        (Path(__file__).parents[2] / "projectors" / "data" / "failure_taxonomy.v2.json").read_text()
    )
    changed = copy.deepcopy(shipped)
    changed["version"] = "failure-taxonomy.v2-test"
    changed["classes"]["patch-conflict"] = "a patch did not apply to the working tree"
    at = next(i for i, r in enumerate(changed["rules"]) if r["id"] == "tool-error")
    changed["rules"].insert(
        at,
        {
            "id": "patch-conflict",
            "class": "patch-conflict",
            "explain": "apply_patch kept failing",
            "when": {"tool": {"names": ["apply_patch"], "status": ["FAILED"], "min_count": 2}},
        },
    )
    path = tmp_path / "taxonomy.json"
    path.write_text(json.dumps(changed))
    new_projection = FailureClassifications(Taxonomy.load(path))
    before_build = d.live("failure-classifications")
    build = asyncio.run(create_build(d.settings, new_projection, Start()))
    asyncio.run(swap(d.settings, new_projection, build))
    before, after = _classes(d, before_build), _classes(d, build)
    assert before.get("tool", 0) >= 1 and "patch-conflict" not in before
    assert after.get("patch-conflict", 0) == before["tool"] and "tool" not in after
    assert sum(before.values()) == sum(after.values()) == len(runs)
    versions = {
        st["classification"]["taxonomy_version"]
        for _, st in d.states("failure-classifications").values()
    }
    assert versions == {"failure-taxonomy.v2-test"}


# -- drill 1: a schema change; the rebuilt projection shows v2 behaviour for v1 entries ------


class EntryV2(LedgerEntry):
    """The code's model after the v2 reader schema: one new field with a default."""

    cost_center: str = "unassigned"


class RunStatsV2(RunStats):
    cost_center: str | None = None


class RunStatsProjectionV2(RunStatsProjection):
    """The next version of run-stats: it also reports the run's cost center, a v2 field."""

    version = RunStatsProjection.version + 1
    state_type = RunStatsV2

    def initial(self, entry: LedgerEntry) -> RunStatsV2:
        return RunStatsV2(run_id=entry.run_id, fleet_id=entry.fleet_id)

    def fold(self, state: RunStats, entry: LedgerEntry) -> RunStats:
        folded = super().fold(state, entry)
        return folded.model_copy(update={"cost_center": getattr(entry, "cost_center", None)})


def test_drill_1_schema_change_rebuild_shows_v2_behaviour_for_v1_entries(
    deployment: Deployment,
) -> None:
    d = deployment
    runs = _runs(6, seed=45)
    asyncio.run(_publish(d.settings, runs))  # written with v1
    v2 = copy.deepcopy(CATALOG.current.schema)
    v2["fields"].append({"name": "cost_center", "type": "string", "default": "unassigned"})
    codec_v2 = LedgerCodec(
        CATALOG.with_version(v2, CATALOG.current.version + 1), entry_type=EntryV2
    )
    worker = d.start_worker("w")
    try:
        d.wait_applied(runs)
        live = d.live("run-stats")
        p = RunStatsProjectionV2()
        build = asyncio.run(create_build(d.settings, p, Start()))
        asyncio.run(run_build(d.settings, p, build, codec=codec_v2))
        # The live build served throughout, still v1-shaped.
        assert d.live("run-stats") == live
        assert _serving(d, "run-stats", runs[0][0].run_id) == len(runs[0])
        assert all("cost_center" not in st for _, st in d.states("run-stats").values())
    finally:
        d.stop_worker(worker)  # its code is v1: stop it before v2 goes live
    rebuilt = d.states("run-stats", build)
    assert {st["cost_center"] for _, st in rebuilt.values()} == {"unassigned"}
    assert {r: s for r, (s, _) in rebuilt.items()} == {run[0].run_id: len(run) for run in runs}
    asyncio.run(swap(d.settings, p, build, codec=codec_v2))
    assert live_state(d.settings, "run-stats", runs[0][0].run_id)["state"]["cost_center"] == (
        "unassigned"
    )
    assert build.startswith(f"v{RunStatsProjectionV2.version}-")
    # A worker still running v1 of run-stats refuses to write the v2 build.
    with pytest.raises(BuildVersionError, match="rebuild run-stats --swap"):
        live_targets(d.settings.pg_address)


# -- the commands, as ops run them ----------------------------------------------------------


def _cli(d: Deployment, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.main", *args],
        env=d.env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_rebuild_list_swap_drop_verify_and_replay_package_commands(
    deployment: Deployment, tmp_path: Path
) -> None:
    d = deployment
    runs = _runs(6, seed=46)
    _applied_by_a_worker(d, runs)
    old = d.live("diff-timelines")
    built = _cli(d, "rebuild", "diff-timelines", "--from-beginning", "--processes", "2")
    assert built.returncode == 0, built.stderr
    new = next(b.build for b in list_builds(d.settings, "diff-timelines") if b.build != old)
    assert f"rebuild swap diff-timelines/{new}" in built.stdout
    listed = json.loads(_cli(d, "rebuild", "list", "--json").stdout)
    mine = {(b["projection"], b["build"]): b for b in listed}
    assert mine[("diff-timelines", old)]["live"] and not mine[("diff-timelines", new)]["live"]
    assert mine[("diff-timelines", new)]["runs"] == len(runs)
    assert mine[("diff-timelines", new)]["behind_live"] == 0  # caught up: the traffic stopped
    assert mine[("diff-timelines", old)]["behind_live"] is None  # the live one
    # The workers' first (live) builds record their inputs as rebuilds do.
    assert mine[("cost-metrics", d.live("cost-metrics"))]["inputs"]["price_table"]
    assert (
        mine[("diff-timelines", old)]["inputs"]["version"]
        == mine[("diff-timelines", new)]["inputs"]["version"]
    )
    lives = [d.live(name) for name in NAMES]  # builds are named v<version>-<n>: two share one
    shared = next(b for b in lives if lives.count(b) > 1)
    ambiguous = _cli(d, "rebuild", "drop", shared)
    assert ambiguous.returncode == 2 and "PROJECTION/BUILD" in ambiguous.stderr
    refused = _cli(d, "rebuild", "drop", f"diff-timelines/{old}")
    assert refused.returncode == 2 and "is live" in refused.stderr
    swapped = _cli(d, "rebuild", "swap", f"diff-timelines/{new}")
    assert swapped.returncode == 0 and d.live("diff-timelines") == new, swapped.stderr
    assert _cli(d, "rebuild", "drop", f"diff-timelines/{old}").returncode == 0
    assert {b.build for b in list_builds(d.settings, "diff-timelines")} == {new}

    verified = _cli(d, "verify", "--all", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    verdicts = json.loads(verified.stdout)
    assert {v["projection"] for v in verdicts} == set(NAMES)
    assert all(v["equal"] and v["runs"] == len(runs) for v in verdicts)

    # A tampered live row: verify names it and exits 1.
    run_id = runs[2][0].run_id
    with psycopg.connect(d.settings.pg_address) as conn:
        conn.execute(
            "UPDATE al_run_state SET state = jsonb_set(state, '{entries}', '0') "
            "WHERE projection = 'run-stats' AND run_id = %s",
            (run_id,),
        )
    tampered = _cli(d, "verify", "run-stats")
    assert tampered.returncode == 1 and f"run {run_id}: state differs" in tampered.stdout
    # the builds page's verify state: each live build's newest verdict
    listed = json.loads(_cli(d, "rebuild", "list", "--json").stdout)
    newest = {b["projection"]: b["verified"] for b in listed if b["live"]}
    assert not newest["run-stats"]["equal"]
    assert f"run {run_id}: state differs" in newest["run-stats"]["differences"]
    assert all(v["equal"] and v["runs"] == len(runs) for p, v in newest.items() if p != "run-stats")

    out = tmp_path / "pkg"
    packed = _cli(d, "replay-package", runs[1][0].run_id, "--out", str(out))
    assert packed.returncode == 0, packed.stderr
    manifest = json.loads((out / "package.json").read_text())
    assert [e["sequence_no"] for e in manifest["entries"]] == list(range(1, len(runs[1]) + 1))
    assert len({(e["partition"], e["offset"]) for e in manifest["entries"]}) == len(runs[1])
    assert set(manifest["projections"]) == set(NAMES)
    assert manifest["schemas"] == {str(CATALOG.current.version): CATALOG.current.fingerprint_hex}
    assert (out / "schemas" / f"ledger_entry.v{CATALOG.current.version}.avsc").exists()
    loaded = _cli(d, "replay-package", "load", str(out))
    assert loaded.returncode == 0, loaded.stderr
    views = json.loads(loaded.stdout)["views"]
    for name in NAMES:  # offline, the same views as the live builds (costs as shown)
        live = d.states(name)[runs[1][0].run_id][1]
        assert views[name] == (shown_state(live) if name == "cost-metrics" else live), name


def test_verify_of_a_live_build_made_by_another_version_says_rebuild_not_differ(
    deployment: Deployment,
) -> None:
    """Found trying the product: on a deployment upgraded across run-stats 1 -> 2, `verify`
    replayed with version 2 and called every run of the version 1 live build different (exit
    1); the worker refuses such a build and says to rebuild. verify says so too (exit 2), and
    makes no scratch build."""
    d = deployment
    now = projection("run-stats").version
    old = f"v{now - 1}-1"  # a build of the version before this code's
    with psycopg.connect(d.settings.pg_address, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO al_builds (projection, build, version) VALUES ('run-stats', %s, %s)",
            (old, now - 1),
        )
        conn.execute("INSERT INTO al_live (projection, build) VALUES ('run-stats', %s)", (old,))
    done = _cli(d, "verify", "run-stats")
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"made by version {now - 1} of its code, this is version {now}" in said, said
    assert "agentledger rebuild run-stats --from-beginning --swap" in said, said
    assert [b.build for b in list_builds(d.settings, "run-stats")] == [old]
