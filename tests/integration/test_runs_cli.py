"""Finding runs: ``agentledger runs`` and run id prefixes, on a private database of real
projections (every projection folded by the engine into PostgreSQL, made live there)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from typer.testing import CliRunner

from consumers.analytics import run_timeline
from consumers.views import find_runs, resolve_run
from infra.main import app
from infra.settings import Settings
from projectors.base import fold_all
from projectors.cost_metrics import CostMetricsProjection
from projectors.failure_classifications import FailureClassifications
from projectors.stores import postgres_ops as ops
from projectors.working_memory import WorkingMemoryProjection
from schemas.codec import LedgerCodec
from schemas.errors import AmbiguousRunError, NotFoundError
from schemas.models import LedgerEntry
from schemas.topics import ledger_topic
from streams.builds import live_targets
from streams.deployment import PrivateDeployment
from streams.engine import Engine, SourceRecord
from streams.simulate import simulate

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class _Refuse:
    async def send(self, poison: Any) -> None:
        raise AssertionError(f"nothing should be dead-lettered: {poison}")


@pytest.fixture(scope="module")
def deployment(services: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    d = PrivateDeployment(services, "runs", ["fleet-01", "fleet-02"], tmp_path_factory.mktemp("r"))
    asyncio.run(d.create())
    entries = simulate(2, 7, seed=33)
    codec = LedgerCodec()

    async def fill() -> None:
        engine = Engine(live_targets(d.settings.pg_address), d.settings.pg_address, None, _Refuse())
        await engine.start(live=True)
        records = [
            SourceRecord(
                ledger_topic(d.settings.topic_prefix, e.fleet_id),
                0,
                n,
                e.run_id.encode(),
                codec.encode(e),
            )
            for n, e in enumerate(entries)
        ]
        for start in range(0, len(records), 200):
            await engine.process(records[start : start + 200])
        await engine.close()

    asyncio.run(fill())
    yield d, entries
    d.drop()


def _runs(entries: list[LedgerEntry]) -> dict[str, list[LedgerEntry]]:
    out: dict[str, list[LedgerEntry]] = {}
    for e in entries:
        out.setdefault(e.run_id, []).append(e)
    return out


def test_runs_lists_filters_and_sorts(deployment: Any) -> None:
    d, entries = deployment
    runs = _runs(entries)
    found = find_runs(d.settings, limit=1000)
    assert {r["run_id"] for r in found} == set(runs)
    by_id = {r["run_id"]: r for r in found}
    cost = CostMetricsProjection()
    failures = FailureClassifications()
    memory = WorkingMemoryProjection()
    for run_id, run in runs.items():
        row = by_id[run_id]
        assert row["entries"] == len(run) and row["fleet_id"] == run[0].fleet_id
        assert row["status"] == (run[-1].run_status.value if run[-1].run_status else None)
        diagnosis = fold_all(failures, run)
        assert diagnosis is not None
        assert row["failure_class"] == diagnosis.classification.failure_class
        metrics = fold_all(cost, run)
        assert metrics is not None
        assert row["cost_usd"] == metrics.totals.cost_usd
        wm = fold_all(memory, run)
        assert wm is not None and row["task"] == wm.task_goal

    fleet = find_runs(d.settings, fleet="fleet-02", limit=1000)
    assert {r["run_id"] for r in fleet} == {
        r for r, run in runs.items() if run[0].fleet_id == "fleet-02"
    }
    failed = find_runs(d.settings, status="FAILED", limit=1000)
    assert failed and all(r["status"] == "FAILED" for r in failed)
    assert len(failed) == sum(1 for r in found if r["status"] == "FAILED")
    one_class = found[0]["failure_class"]
    in_class = find_runs(d.settings, failure_class=one_class, limit=1000)
    assert {r["run_id"] for r in in_class} == {
        r["run_id"] for r in found if r["failure_class"] == one_class
    }
    costs = sorted((r["cost_usd"] for r in found if r["cost_usd"] is not None), reverse=True)
    threshold = costs[len(costs) // 2]
    above = find_runs(d.settings, cost_above=threshold, limit=1000)
    assert {r["run_id"] for r in above} == {
        r["run_id"] for r in found if r["cost_usd"] is not None and r["cost_usd"] > threshold
    }
    by_cost = find_runs(d.settings, sort="cost", limit=1000)
    known = [r["cost_usd"] for r in by_cost if r["cost_usd"] is not None]
    assert known == sorted(known, reverse=True) and known[0] == costs[0]
    some = next(r for r in found if r["task"])
    word = max(some["task"].split(), key=len)
    matched = find_runs(d.settings, text=word.upper(), limit=1000)
    assert some["run_id"] in {r["run_id"] for r in matched}
    assert all(
        word.lower() in json.dumps(r, default=str).lower() or r["explanation"] for r in matched
    )
    assert find_runs(d.settings, text="%no such text, with a wildcard_%", limit=1000) == []
    assert find_runs(d.settings, cost_above=Decimal("1e9"), limit=1000) == []


def _shortest_unique(run_id: str, others: list[str]) -> str:
    for n in range(1, len(run_id) + 1):
        prefix = run_id[:n]
        if sum(1 for o in others if o.startswith(prefix)) == 1:
            return prefix
    return run_id


def test_a_unique_prefix_names_its_run_and_an_ambiguous_one_says_so(deployment: Any) -> None:
    d, entries = deployment
    ids = sorted(_runs(entries))
    target = ids[3]
    prefix = _shortest_unique(target, ids)
    assert resolve_run(d.settings, prefix) == target
    assert resolve_run(d.settings, target) == target
    common = max(  # the longest start two run ids share (14 random ids share one)
        (os.path.commonprefix([a, b]) for a in ids for b in ids if a < b),  # noqa: RUF071
        key=len,
    )
    assert common, ids
    with pytest.raises(AmbiguousRunError, match="give more of it"):
        resolve_run(d.settings, common)
    with pytest.raises(NotFoundError):
        resolve_run(d.settings, "zz-no-such-run")
    for pattern in ("%", "_", target[:2] + "%", "\\", "\U0010ffff"):  # no LIKE wildcards
        with pytest.raises(NotFoundError):
            resolve_run(d.settings, pattern)

    runner = CliRunner()
    env = {"AGENTLEDGER_PG_DSN": d.settings.pg_address}
    result = runner.invoke(app, ["memory", prefix, "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["state"]["run_id"] == target
    listed = runner.invoke(app, ["runs", "--json", "--sort", "id"], env=env)
    assert listed.exit_code == 0, listed.output
    assert [r["run_id"] for r in json.loads(listed.stdout)] == ids
    running = [r for r, run in _runs(entries).items() if run[-1].run_status is None]
    table = runner.invoke(app, ["runs", "--status", "running", "--json"], env=env)
    assert table.exit_code == 0, table.output
    assert sorted(r["run_id"] for r in json.loads(table.stdout)) == sorted(running)


def _code_blocks(path: Path, language: str) -> list[str]:
    """The fenced ``language`` blocks of a Markdown file."""
    text = path.read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def test_the_analytics_docs_queries_run(deployment: Any) -> None:
    """Every SQL example of docs/ANALYTICS.md runs against the views as they are."""
    d, _ = deployment
    blocks = _code_blocks(ROOT / "docs" / "ANALYTICS.md", "sql")
    assert len(blocks) >= 4
    with psycopg.connect(d.settings.pg_address) as conn:
        for sql in blocks:
            rows = conn.execute(sql.encode()).fetchall()
            assert isinstance(rows, list)
        failures = conn.execute(blocks[2].encode()).fetchall()
        assert failures, "the failure counts of the simulated runs"


def test_the_runs_lists_table_follows_every_run_stats_build(deployment: Any) -> None:
    """al_run_list (migration 019) holds a row per run of every run-stats build, written and
    dropped with the run-stats rows by triggers: a new build's rows (a rebuild's) appear in it,
    saying what the live build's say, and go with them."""
    d, entries = deployment
    runs = len(_runs(entries))
    cols = "run_id, fleet_id, status, entries, first_at, last_at, conflicts"
    with psycopg.connect(d.settings.pg_address) as conn:
        found = conn.execute("SELECT build FROM al_live WHERE projection = 'run-stats'").fetchone()
        assert found is not None
        live = found[0]
        listed = conn.execute(
            f"SELECT {cols} FROM al_run_list WHERE build = %s ORDER BY run_id", (live,)
        ).fetchall()
        assert len(listed) == runs
        conn.execute(
            "INSERT INTO al_run_state (projection, build, run_id, fleet_id, applied_seq, state, "
            "head, conflicts) SELECT projection, 'other', run_id, fleet_id, applied_seq, state, "
            "head, conflicts FROM al_run_state WHERE projection = 'run-stats' AND build = %s",
            (live,),
        )
        copied = conn.execute(
            f"SELECT {cols} FROM al_run_list WHERE build = 'other' ORDER BY run_id"
        ).fetchall()
        assert copied == listed
        conn.execute("DELETE FROM al_run_state WHERE projection = 'run-stats' AND build = 'other'")
        gone = conn.execute("SELECT count(*) FROM al_run_list WHERE build = 'other'").fetchone()
        assert gone == (0,)
        conn.rollback()


def test_keyset_pages_add_up_to_the_whole_sorted_list(deployment: Any) -> None:
    """find_runs' pages (``after`` the previous page's last run) add up to the whole list in
    every sort, across the runs of known cost and those of unknown cost (NULL, never 0: last),
    filtered too. One run's cost is made unknown in an uncommitted transaction."""
    d, _ = deployment
    with ops.connect(d.settings.pg_address) as conn:
        conn.execute(
            "UPDATE al_run_state s SET head = jsonb_set(coalesce(s.head, s.state), "
            "'{totals,calls}', '0') FROM al_live l WHERE l.projection = s.projection "
            "AND l.build = s.build AND s.projection = 'cost-metrics' AND s.run_id = "
            "(SELECT min(run_id) FROM al_run_state WHERE projection = 'cost-metrics')"
        )
        sets: list[tuple[str, dict[str, Any]]] = [(s, {}) for s in ops.RUN_SORTS]
        for sort, kwargs in [*sets, ("cost", {"status": "FAILED"})]:
            whole = ops.find_runs(conn, sort=sort, limit=1000, **kwargs)
            paged: list[dict[str, Any]] = []
            while True:
                after = ops.run_key(sort, paged[-1]) if paged else None
                page = ops.find_runs(conn, sort=sort, limit=2, after=after, **kwargs)
                paged += page
                if len(page) < 2:
                    break
            assert paged == whole and whole, (sort, kwargs)
        costs = [r["cost_usd"] for r in ops.find_runs(conn, sort="cost", limit=1000)]
        unknown = costs.index(None)
        assert unknown > 0 and costs[unknown:] == [None] * (len(costs) - unknown)
        assert costs[:unknown] == sorted(costs[:unknown], reverse=True)
        conn.rollback()


def test_the_text_search_finds_the_same_runs_either_way(
    deployment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Few matches: hashed subplans; many (at least TEXT_MANY): each run the walk reaches is
    matched by primary key. Both find the same runs in the same order."""
    d, _ = deployment
    with ops.connect(d.settings.pg_address) as conn:
        some = next(r for r in ops.find_runs(conn, limit=1000) if r["task"])
        words = [max(some["task"].split(), key=len).upper(), "no such text"]
        few = [ops.find_runs(conn, text=w, sort="cost", limit=1000) for w in words]
        monkeypatch.setattr(ops, "TEXT_MANY", 1)
        many = [ops.find_runs(conn, text=w, sort="cost", limit=1000) for w in words]
    assert few == many and few[0] and few[1] == []


def test_the_runs_facts_follow_the_documents_of_every_build(deployment: Any) -> None:
    """al_run_facts (migration 021) holds what the list sorts, searches and filters on of each
    run of every cost-metrics, working-memory, failure-classifications and diff-timelines build,
    as the documents say it (the known cost, unknown as NULL, never 0; the repository the
    header shows), written and dropped with them by triggers."""
    d, _ = deployment
    shown = {r["run_id"]: r for r in find_runs(d.settings, limit=1000)}
    facts = (
        "SELECT f.run_id, f.projection, f.cost_usd, f.task, f.explanation, f.repository "
        "FROM al_run_facts f JOIN al_live l USING (projection, build) ORDER BY 1, 2"
    )
    names = ("cost-metrics", "diff-timelines", "failure-classifications", "working-memory")
    with psycopg.connect(d.settings.pg_address) as conn:
        rows = conn.execute(facts).fetchall()
        assert {(r, p) for r, p, *_ in rows} == {(r, p) for r in shown for p in names}
        for run_id, projection, cost, task, explanation, repository in rows:
            run = shown[run_id]
            if projection == "cost-metrics":
                assert cost == run["cost_usd"]
            elif projection == "working-memory":
                assert task == run["task"]
            elif projection == "diff-timelines":  # as the run's header says it
                assert repository == run_timeline(d.settings, run_id)["repository"] is not None
            else:
                assert explanation == run["explanation"]
        conn.execute(
            "INSERT INTO al_run_state (projection, build, run_id, fleet_id, applied_seq, state, "
            "head, conflicts) SELECT s.projection, 'other', s.run_id, s.fleet_id, s.applied_seq, "
            "s.state, s.head, s.conflicts FROM al_run_state s JOIN al_live l "
            "USING (projection, build) WHERE s.projection = 'cost-metrics'"
        )
        copied = conn.execute(
            "SELECT run_id, cost_usd FROM al_run_facts WHERE build = 'other' ORDER BY 1"
        ).fetchall()
        assert copied == [(r, c) for r, p, c, *_ in rows if p == "cost-metrics"]
        conn.execute("DELETE FROM al_run_state WHERE build = 'other'")
        gone = conn.execute("SELECT count(*) FROM al_run_facts WHERE build = 'other'").fetchone()
        assert gone == (0,)
        conn.rollback()
