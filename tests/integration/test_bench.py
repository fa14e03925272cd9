"""The bench code runs end to end at small N (it asserts what was measured, not how fast)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from consumers.examples.budget_guard import BudgetGuard
from consumers.mcp_bench import mcp_reader
from infra.settings import Settings
from projectors.registry import all_projections
from streams.bench import IMPORT_FIGURE, MCP_READ, MCP_RYW, QUICK, REDACT_FIGURE, run_bench

pytestmark = pytest.mark.integration

BESIDE_A_BASELINE = (
    IMPORT_FIGURE,  # beside publish of the same entries as JSONL
    REDACT_FIGURE,  # beside the codec's encode of the same entries (keep engine CPU at [-2])
    "hot path p50 (publish -> Redis views)",
    "hot path p99 (publish -> Redis views)",
    MCP_RYW,  # beside the hot path in the same load (the worker's lag)
    MCP_READ,  # beside the Redis view read itself, same run and moment
    "ingest: publish -> all projections committed",
    "ingest vs the naive baseline",
    "rebuild: every projection from offset 0",
    "worker RSS, last third of the run",
    "one worker: a backlog applied (all six projections)",
    "engine CPU per realistic entry in batches of 20 (a worker keeping up)",
    "engine CPU per realistic entry (6 projections, PostgreSQL + Redis, batches of 200)",
    "pure folds per entry, all six projections (no stores)",
)


# Smaller than `bench --quick`: enough for every figure to be measured beside its baseline
# (what this test checks), not for the figures to mean much (the bench's own runs give those).
SMALL = replace(
    QUICK,
    hot_seconds=2.0,
    ingest_entries=2_000,
    naive_entries=150,
    rebuild_entries=3_000,
    in_flight_entries=200,
    engine_runs=3,
    one_worker_entries=1_000,
    import_files=5,
    redact_runs=3,
)


async def test_quick_bench_measures_every_figure_beside_its_baseline(services: Settings) -> None:
    report = await run_bench(
        services,
        quick=True,
        guard_factory=lambda s: BudgetGuard(s, idle_timeout_s=0.5),
        sizes=SMALL,
        mcp_reader=mcp_reader,
    )
    figures = {f.name: f for f in report.figures}
    for name in BESIDE_A_BASELINE:
        figure = figures[name]
        assert math.isfinite(figure.value) and figure.value > 0, name
        assert figure.baseline is not None and figure.baseline > 0, name
    # enough entries for a p99 (on a loaded machine the publisher may not reach 1,000/s: the
    # bench reports the rate it measured at; this test checks the figure is not vacuous)
    assert figures["hot path entries measured"].value >= 200
    # an agent read its own writes through a real MCP client and `agentledger mcp`: each read
    # with min_seq came back with the sequence number reached (or the figure says how many not)
    ryw = figures["MCP read-your-writes: answers that reached min_seq"]
    assert ryw.baseline is not None and ryw.baseline >= 1 and 0 <= ryw.value <= ryw.baseline
    assert figures["MCP phase: hot path entries measured"].value >= 200
    assert figures["one worker: entries of the backlog"].value >= SMALL.one_worker_entries
    ratio = figures["engine CPU / validated decode (goal: at most 5x)"]
    engine = figures[BESIDE_A_BASELINE[-2]]
    assert engine.baseline is not None
    assert abs(ratio.value - engine.value / engine.baseline) < 0.05
    assert figures["ingest: entries"].value >= SMALL.ingest_entries
    assert figures["publisher: entries timed for redaction"].value >= SMALL.redact_runs
    imported = figures["import: entries"]
    assert imported.value > 0 and imported.baseline_name == f"{SMALL.import_files} files"
    assert figures["import again (nothing new): seconds"].baseline == 0  # published nothing
    assert figures["rebuild: entries replayed"].value >= SMALL.rebuild_entries
    assert figures["worker RSS peak (largest worker)"].value > 0
    assert figures["PostgreSQL bytes per million entries"].value > 0
    in_flight = f"{SMALL.in_flight_entries:,}-entry run in flight"
    figure = figures[f"{in_flight}: hot path p99 for its views"]
    assert figure.value > 0 and figure.baseline is not None and figure.baseline > 0
    measured = figures[f"{in_flight}: entries of the run measured"]
    assert measured.value == measured.baseline and measured.value >= SMALL.in_flight_entries * 0.9
    assert figures[f"{in_flight}: worker RSS peak"].value > 0
    for p in all_projections():  # long runs: each figure beside its value at 30-entry runs
        for measure in ("CPU per entry", "bytes written per entry"):
            figure = figures[f"long runs: {p.name} {measure}, 300-entry runs"]
            assert figure.value > 0 and figure.baseline is not None and figure.baseline > 0
    document = json.loads(report.as_json())
    assert document["machine"]["cpus"] >= 1
    assert document["settings"]["rebuild_entries"] == SMALL.rebuild_entries
