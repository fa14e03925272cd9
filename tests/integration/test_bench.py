"""The bench code runs end to end at small N (it asserts what was measured, not how fast)."""

from __future__ import annotations

import json
import math

import pytest

from infra.settings import Settings
from streams.bench import run_bench

pytestmark = pytest.mark.integration


async def test_quick_bench_measures_every_figure_beside_its_baseline(services: Settings) -> None:
    report = await run_bench(services, quick=True)
    figures = {f.name: f for f in report.figures}
    for name in (
        "hot path p50 (publish -> Redis views)",
        "hot path p99 (publish -> Redis views)",
        "replay into all projections",
    ):
        figure = figures[name]
        assert math.isfinite(figure.value) and figure.value > 0
        assert figure.baseline is not None and figure.baseline > 0
    assert figures["hot path entries measured"].value >= 1000
    assert json.loads(report.as_json())["machine"]["cpus"] >= 1
