"""The analytics projections through the real pipeline (publisher, Kafka, engine, PostgreSQL), read
back through the SQL views and the CLI, against figures this test computes from the published
entries on its own.

One private deployment (its own database, topic and Redis prefixes) holds a simulated fleet of
2 x 14 runs, so every failure class of the taxonomy occurs and its builds can be made live
without touching anyone's live projections.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from typer.testing import CliRunner, Result

from consumers.analytics import run_timeline
from infra.main import app
from infra.settings import Settings
from projectors.pricing import PriceTable
from projectors.registry import selected
from schemas.models import EntryKind, LedgerEntry, ModelUsagePart
from schemas.topics import ledger_topic
from streams.builds import live_targets
from streams.deployment import PrivateDeployment
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine
from streams.publisher import AsyncPublisher
from streams.simulate import OUTCOMES, simulate
from streams.source import drain

pytestmark = pytest.mark.integration

FLEETS = ("fleet-01", "fleet-02")
SEED = 606
_MILLION = Decimal(1_000_000)


@dataclass
class Analytics:
    settings: Settings
    sent: list[LedgerEntry]

    @property
    def runs(self) -> dict[str, list[LedgerEntry]]:
        runs: dict[str, list[LedgerEntry]] = defaultdict(list)
        for e in self.sent:
            runs[e.run_id].append(e)
        return runs

    def query(self, text: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.settings.pg_address) as conn:
            return conn.execute(text.encode(), params).fetchall()

    def cli(self, *args: str) -> Result:
        env = {"AGENTLEDGER_PG_DSN": self.settings.pg_address, "COLUMNS": "220"}
        return CliRunner().invoke(app, list(args), env=env)


@pytest_asyncio.fixture(scope="module")
async def analytics(
    services: Settings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Analytics]:
    deployment = PrivateDeployment(services, "an", FLEETS, tmp_path_factory.mktemp("analytics"))
    await deployment.create()
    try:
        settings = deployment.settings
        async with AsyncPublisher(settings) as publisher:
            sent = await publisher.publish_batch(simulate(len(FLEETS), 14, SEED))
        # The first builds, made live in this private database: what the CLI and views read.
        # Priced by our shipped table alone (AGENTLEDGER_PRICE_SOURCE=table): the test sums
        # the costs itself from that table's rates.
        table = settings.model_copy(update={"price_source": "table"})
        targets = live_targets(settings.pg_address, selected("run-stats,analytics", table))
        sink = KafkaDeadLetterSink(settings)
        engine = Engine(targets, settings.pg_address, None, sink)
        await engine.start()
        try:
            topics = [ledger_topic(settings.topic_prefix, f) for f in FLEETS]
            stats = await drain(engine, settings.kafka_address, topics, batch_size=250)
        finally:
            await engine.close()
            await sink.close()
        assert stats.applied == len(sent) * len(targets)
        assert stats.dead_lettered == 0
        yield Analytics(settings, sent)
    finally:
        deployment.drop()


# -- what the test knows without the projections -------------------------------------------


def _normalized(provider: str, raw: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(input incl. cached, cached, output incl. reasoning, reasoning) from each provider's
    own usage shape."""
    if provider == "anthropic":
        read = raw.get("cache_read_input_tokens", 0)
        written = raw.get("cache_creation_input_tokens", 0)
        return raw["input_tokens"] + read + written, read, raw["output_tokens"], 0
    if provider == "openai":
        return (
            raw["prompt_tokens"],
            raw["prompt_tokens_details"]["cached_tokens"],
            raw["completion_tokens"],
            raw["completion_tokens_details"]["reasoning_tokens"],
        )
    assert provider == "google", provider
    thoughts = raw.get("thoughtsTokenCount", 0)
    return (
        raw["promptTokenCount"],
        raw.get("cachedContentTokenCount", 0),
        raw["candidatesTokenCount"] + thoughts,
        thoughts,
    )


def _expected_costs(sent: list[LedgerEntry]) -> dict[str, Decimal]:
    """Each run's cost: every provider response once, priced at the table's rate that day."""
    prices = PriceTable.shipped()
    costs: dict[str, Decimal] = defaultdict(Decimal)
    counted: set[tuple[str, str]] = set()
    for entry in sent:
        if entry.kind is not EntryKind.MODEL_CALL:
            continue
        for u in entry.parts:
            if not isinstance(u, ModelUsagePart):
                continue
            key = (entry.run_id, u.provider_response_id or entry.entry_id)
            if key in counted:
                continue
            counted.add(key)
            tokens_in, cached, out, reasoning = _normalized(
                u.provider, json.loads(u.raw_usage_json)
            )
            # The entry's own fields are in the normalized convention: both readings agree.
            own = (u.input_tokens, u.cached_input_tokens, u.output_tokens, u.reasoning_tokens)
            assert (tokens_in, cached, out, reasoning) == own
            price = prices.price(u.provider, u.model, entry.occurred_at)
            assert price is not None, f"{u.provider}/{u.model} is priced"
            cached_rate = price.input if price.cached_input is None else price.cached_input
            reasoning_rate = price.output if price.reasoning is None else price.reasoning
            costs[entry.run_id] += (
                (tokens_in - cached) * price.input
                + cached * cached_rate
                + (out - reasoning) * price.output
                + reasoning * reasoning_rate
            ) / _MILLION
    return dict(costs)


def _repeated_responses(sent: list[LedgerEntry]) -> dict[tuple[str, str], int]:
    """(run, response id) reported by more than one MODEL_CALL entry, with the report count."""
    reports = Counter(
        (e.run_id, u.provider_response_id)
        for e in sent
        if e.kind is EntryKind.MODEL_CALL
        for u in e.parts
        if isinstance(u, ModelUsagePart) and u.provider_response_id is not None
    )
    return {key: n for key, n in reports.items() if n > 1}


def _outcomes(a: Analytics) -> dict[str, str]:
    """The simulator's own label of each run: the ground truth of its failure class."""
    return {e.run_id: e.metadata["outcome"] for e in a.sent if e.kind is EntryKind.RUN_FINISHED}


def _expected_class(outcome: str) -> str:
    return "none" if outcome == "success" else outcome


def _run_of(a: Analytics, outcome: str, fleet: str = "fleet-01") -> str:
    return next(
        run_id
        for run_id, label in _outcomes(a).items()
        if label == outcome and a.runs[run_id][0].fleet_id == fleet
    )


# -- the views -----------------------------------------------------------------------------


def test_cost_by_run_equals_the_independent_sum(analytics: Analytics) -> None:
    expected = _expected_costs(analytics.sent)
    assert set(expected) == set(analytics.runs)
    by_calls = dict(
        analytics.query("SELECT run_id, sum(cost_usd) FROM al_cost_calls GROUP BY run_id")
    )
    by_runs = dict(analytics.query("SELECT run_id, cost_usd FROM al_cost_runs"))
    assert by_calls == expected
    assert by_runs == expected
    typed = analytics.query(
        "SELECT pg_typeof(cost_usd)::text, pg_typeof(occurred_at)::text, pg_typeof(day)::text, "
        "pg_typeof(input_tokens)::text FROM al_cost_calls LIMIT 1"
    )
    assert typed == [("numeric", "timestamp with time zone", "date", "bigint")]


def test_a_response_reported_twice_is_one_call(analytics: Analytics) -> None:
    repeated = _repeated_responses(analytics.sent)
    assert repeated, "the simulator reports some responses twice"
    rows = analytics.query(
        "SELECT run_id, response_id, count(*) FROM al_cost_calls GROUP BY run_id, response_id"
    )
    counts = {(r, resp): n for r, resp, n in rows}
    assert all(n == 1 for n in counts.values())
    assert set(repeated) <= set(counts)
    distinct = {
        (e.run_id, u.provider_response_id)
        for e in analytics.sent
        if e.kind is EntryKind.MODEL_CALL
        for u in e.parts
        if isinstance(u, ModelUsagePart)
    }
    assert set(counts) == distinct
    duplicates = Counter[str]()
    for (run_id, _), n in repeated.items():
        duplicates[run_id] += n - 1
    reported = dict(analytics.query("SELECT run_id, duplicate_reports FROM al_cost_runs"))
    assert {r: n for r, n in reported.items() if n} == dict(duplicates)


def test_every_simulated_failure_class_is_recognised(analytics: Analytics) -> None:
    outcomes = _outcomes(analytics)
    assert set(outcomes.values()) == set(OUTCOMES), "every class occurs in the fleet"
    found = {
        run_id: (cls, final, status)
        for run_id, cls, final, status in analytics.query(
            "SELECT run_id, failure_class, final, status FROM al_failures"
        )
    }
    assert set(found) == set(outcomes)
    for run_id, outcome in outcomes.items():
        cls, final, status = found[run_id]
        assert (cls, final) == (_expected_class(outcome), True), (run_id, outcome)
        assert status == analytics.runs[run_id][-1].run_status


def test_diff_views_show_snapshots_files_and_flags(analytics: Analytics) -> None:
    snapshots = Counter(
        e.run_id for e in analytics.sent if e.kind is EntryKind.DIFF_SNAPSHOT and e.parts
    )
    rows = analytics.query("SELECT run_id, count(*) FROM al_diff_snapshots GROUP BY run_id")
    assert dict(rows) == dict(snapshots)
    flags = {kind for (kind,) in analytics.query("SELECT DISTINCT kind FROM al_diff_flags")}
    assert {"overreach", "verifier-gaming", "out-of-scope"} <= flags
    scratch = analytics.query(
        "SELECT status FROM al_diff_files WHERE path LIKE '%%scratch_debug.py' "
        "ORDER BY run_id, seq LIMIT 2"
    )
    assert scratch == [("ADDED",), ("DELETED",)]


def test_views_follow_the_live_build_only(analytics: Analytics) -> None:
    doc = json.dumps({"run_id": "shadow-run", "fleet_id": "fleet-01", "cost_usd": "99"})
    with psycopg.connect(analytics.settings.pg_address) as conn:
        conn.execute(
            "INSERT INTO al_history (projection, build, run_id, kind, key, seq, doc) "
            "VALUES ('cost-metrics', 'not-live', 'shadow-run', 'model_call', 'r', 1, %s)",
            (doc,),
        )
    assert analytics.query("SELECT count(*) FROM al_cost_calls WHERE run_id = 'shadow-run'") == [
        (0,)
    ]


# -- the CLI -------------------------------------------------------------------------------


def test_costs_cli_totals_equal_the_independent_sum(analytics: Analytics) -> None:
    expected = _expected_costs(analytics.sent)
    result = analytics.cli("costs", "--by", "run", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {r["key"]: Decimal(r["cost_usd"]) for r in report["rows"]} == expected
    assert Decimal(report["total"]["cost_usd"]) == sum(expected.values())
    assert report["total"]["calls"] == sum(r["calls"] for r in report["rows"])

    fleet_runs = {r for r, entries in analytics.runs.items() if entries[0].fleet_id == "fleet-02"}
    result = analytics.cli("costs", "--by", "model", "--fleet", "fleet-02", "--json")
    fleet_total = Decimal(json.loads(result.stdout)["total"]["cost_usd"])
    assert fleet_total == sum(expected[r] for r in fleet_runs)

    result = analytics.cli("costs", "--since", "2030-01-01", "--json")
    assert json.loads(result.stdout)["total"]["calls"] == 0

    result = analytics.cli("costs", "--by", "purpose")
    assert result.exit_code == 0, result.output
    assert "total" in result.stdout and "planning" in result.stdout
    assert f"${sum(expected.values()):,.4f}" in result.stdout


def test_failures_cli_counts_and_explains(analytics: Analytics) -> None:
    result = analytics.cli("failures", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    runs = len(analytics.runs)
    assert report["by_class"] == {_expected_class(o): len(FLEETS) for o in OUTCOMES}
    assert report["total"] == {
        "fleet_id": "total",
        "failure_class": "total",
        "final": runs,
        "provisional": 0,
        "stalled": 0,
        "repair_loops": report["total"]["repair_loops"],
        "runs": runs,
    }
    one_fleet = json.loads(analytics.cli("failures", "--fleet", "fleet-01", "--json").stdout)
    assert one_fleet["total"]["runs"] == runs // len(FLEETS)

    flaky = _run_of(analytics, "verifier-flaky")
    result = analytics.cli("failures", flaky)
    assert result.exit_code == 0, result.output
    assert "class: verifier-flaky" in result.stdout
    assert "pass/fail flips on the same code" in result.stdout
    explained = json.loads(analytics.cli("failures", flaky, "--json").stdout)
    assert explained["classification"]["failure_class"] == "verifier-flaky"
    assert explained["stalled"] is False

    missing = analytics.cli("failures", "no-such-run")  # (ids and unique prefixes resolve)
    assert missing.exit_code == 1
    assert "no run id is or starts with 'no-such-run'" in missing.stderr


def test_timeline_cli_shows_steps_costs_and_class(analytics: Analytics) -> None:
    expected = _expected_costs(analytics.sent)
    run_id = _run_of(analytics, "budget")
    result = analytics.cli("timeline", run_id, "--json")
    assert result.exit_code == 0, result.output
    t = json.loads(result.stdout)
    kinds = {row["kind"] for row in t["rows"]}
    assert {"lifecycle", "task", "plan", "tool", "model-call", "diff", "verifier"} <= kinds
    assert {"approval", "compaction", "summary", "failure-class"} <= kinds
    assert all(row["refs"]["entry"] and row["occurred_at"] for row in t["rows"])
    diffs = [row for row in t["rows"] if row["kind"] == "diff"]
    assert all(row["refs"]["artifact"].startswith("art-") for row in diffs)
    calls = [row for row in t["rows"] if row["kind"] == "model-call"]
    responses = {
        u.provider_response_id
        for e in analytics.runs[run_id]
        for u in e.parts
        if isinstance(u, ModelUsagePart)
    }
    assert len(calls) == len(responses), "the repeated report is not a second step"
    assert sum(Decimal(row["cost_usd"]) for row in calls) == expected[run_id]
    assert Decimal(t["rows"][-1]["cost_so_far_usd"]) == expected[run_id]
    assert Decimal(t["cost"]["cost_usd"]) == expected[run_id]
    assert t["status"] == "BUDGET_EXCEEDED"
    assert t["failure"]["failure_class"] == "budget" and t["failure"]["final"] is True
    assert {f["kind"] for f in t["diff"]["flags"]} >= {"overreach", "verifier-gaming"}
    evidence = [row for row in t["rows"] if row["evidence"]]
    assert evidence and evidence[-1]["kind"] == "failure-class"

    text = analytics.cli("timeline", run_id)
    assert text.exit_code == 0, text.output
    assert f"run {run_id}" in text.stdout
    assert "failure class budget (final" in text.stdout
    assert f"${expected[run_id]:,.4f}" in text.stdout
    assert "overreach" in text.stdout

    missing = analytics.cli("timeline", "no-such-run")
    assert missing.exit_code == 1
    assert "no run id is or starts with 'no-such-run'" in missing.stderr
    prefix = analytics.cli("timeline", run_id[:12], "--json")  # a unique prefix of the id
    assert prefix.exit_code == 0 and json.loads(prefix.stdout)["run_id"] == run_id


def test_timeline_of_every_run_costs_what_its_calls_cost(analytics: Analytics) -> None:
    expected = _expected_costs(analytics.sent)
    for run_id in analytics.runs:
        t = run_timeline(analytics.settings, run_id)
        assert Decimal(t["rows"][-1]["cost_so_far_usd"]) == expected[run_id], run_id
        assert t["failure"]["failure_class"] == _expected_class(_outcomes(analytics)[run_id])
