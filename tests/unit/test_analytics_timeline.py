"""The timeline document joins three projections' states; ``--since`` parsing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from consumers.analytics import CallCostRef, assemble_timeline, parse_since
from consumers.render_analytics import timeline_headline
from projectors.base import fold_all
from projectors.cost_metrics import CostMetrics, CostMetricsProjection
from projectors.diff_timelines import DiffTimelinesProjection
from projectors.failure_classifications import FailureClassifications
from schemas.models import LedgerEntry
from streams.simulate import simulate_runs


def _budget_run() -> list[LedgerEntry]:
    runs = list(simulate_runs(1, 14, seed=5))
    return next(r for r in runs if r[-1].metadata["outcome"] == "budget")


def _calls(entries: list[LedgerEntry]) -> list[CallCostRef]:
    """What al_cost_calls holds for the run: each counted call once, with its cost."""
    cost = CostMetricsProjection()
    state: CostMetrics | None = None
    calls: list[CallCostRef] = []
    for entry in entries:
        before = state
        state = cost.initial(entry) if state is None else state
        if cost.accepts(entry):
            state = cost.fold(state, entry)
        for row in cost.history(before, state, entry):
            doc = row.doc
            cost_usd = Decimal(doc["cost_usd"]) if doc["cost_usd"] is not None else None
            calls.append(
                CallCostRef(row.key, doc["response_id"], doc["entry_id"], cost_usd, doc["unpriced"])
            )
    return calls


def test_model_call_rows_carry_their_cost_and_the_running_total() -> None:
    entries = _budget_run()
    timeline = fold_all(DiffTimelinesProjection(), entries)
    cost = fold_all(CostMetricsProjection(), entries)
    diagnosis = fold_all(FailureClassifications(), entries)
    assert timeline is not None and cost is not None and diagnosis is not None
    calls = _calls(entries)
    assert len(calls) == cost.totals.calls and cost.duplicate_reports == 1

    doc = assemble_timeline(timeline, calls, cost, diagnosis)

    model_rows = [r for r in doc["rows"] if r["kind"] == "model-call"]
    assert [r["cost_usd"] for r in model_rows] == [str(c.cost_usd) for c in calls]
    running, seen = Decimal(0), False
    for row in doc["rows"]:
        if row["kind"] == "model-call":
            running += Decimal(row["cost_usd"])
            seen = True
        # before the first call: no cost known (a log may keep no calls), never $0
        assert row["cost_so_far_usd"] == (str(running) if seen else None)
        assert Decimal(row["cost_so_far_usd"] or 0) == running
        assert row["cost_so_far_lower_bound"] is False
    assert running == cost.totals.cost_usd
    assert Decimal(doc["cost"]["cost_usd"]) == cost.totals.cost_usd
    last = doc["rows"][-1]
    assert last["kind"] == "failure-class" and last["status"] == "budget" and last["evidence"]
    assert doc["status"] == "BUDGET_EXCEEDED" and doc["failure"]["failure_class"] == "budget"
    assert doc["repository"] == "github.com/example/shop"
    tools = [r for r in doc["rows"] if r["kind"] == "tool"]
    assert all("result_entry" in r["refs"] for r in tools)
    assert all("context_entry" in r["refs"] for r in model_rows)
    headline = timeline_headline(doc)
    assert "class budget" in headline and "overreach" in headline


def test_without_cost_or_diagnosis_the_timeline_still_renders() -> None:
    entries = _budget_run()[:20]
    timeline = fold_all(DiffTimelinesProjection(), entries)
    assert timeline is not None
    doc = assemble_timeline(timeline, [], None, None)
    assert doc["status"] == "RUNNING" and doc["cost"] is None and doc["failure"] is None
    calls = [r for r in doc["rows"] if r["kind"] == "model-call"]
    assert calls and all(r["cost_usd"] is None for r in calls)
    # the calls' costs are unknown here: the cost so far is unknown, never $0
    assert all(r["cost_so_far_usd"] is None for r in doc["rows"])
    assert "RUNNING" in timeline_headline(doc)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC)),
        ("2026-11-01T08:30", datetime(2026, 11, 1, 8, 30, tzinfo=UTC)),
        ("2026-11-01T08:30:00Z", datetime(2026, 11, 1, 8, 30, tzinfo=UTC)),
        (
            "2026-11-01T10:30:00+02:00",
            datetime(2026, 11, 1, 10, 30, tzinfo=timezone(timedelta(hours=2))),
        ),
    ],
)
def test_since_accepts_iso_dates_and_date_times(text: str, expected: datetime) -> None:
    assert parse_since(text) == expected


def test_since_refuses_anything_else() -> None:
    with pytest.raises(ValueError, match="not an ISO date"):
        parse_since("yesterday")
