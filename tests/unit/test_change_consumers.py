"""The example consumers' and the CLI's pure parts: a change as a crossing, a row, a line."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

from consumers.examples.budget_guard import crossing
from consumers.examples.mirror import mirror_row
from consumers.subscribe import change_line
from schemas.changes import ProjectionChange

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _cost(state: dict[str, object], seq: int = 9) -> ProjectionChange:
    return ProjectionChange(
        7, "STATE", "cost-metrics", "b1", 2, AT, "fleet-01", "run-1", seq, 0, state
    )


OVER = {"totals": {"cost_usd": "0.61", "calls": 4}, "task_budget_usd": "0.50", "over_budget": True}


def test_a_run_over_its_budget_is_a_crossing_with_its_cost() -> None:
    found = crossing(_cost(OVER))
    assert found is not None
    assert (found.run_id, found.cost_usd, found.budget_usd, found.applied_seq) == (
        "run-1",
        Decimal("0.61"),
        Decimal("0.50"),
        9,
    )


def test_under_budget_without_a_budget_or_not_a_state_is_no_crossing() -> None:
    assert crossing(_cost({**OVER, "over_budget": False})) is None
    assert crossing(_cost({**OVER, "task_budget_usd": None})) is None
    marker = ProjectionChange(8, "BUILD_CHANGED", "cost-metrics", "b2", 2, AT, previous_build="b1")
    assert crossing(marker) is None


def test_the_mirror_row_of_a_change() -> None:
    row = mirror_row(_cost(OVER))
    assert row == ("run-1", "fleet-01", "b1", 9, Decimal("0.61"), 4, 0, 0, 0, Decimal("0.50"), True)


def test_change_lines() -> None:
    text = change_line(_cost(OVER))
    assert (
        "cost-metrics run-1 (fleet fleet-01) at seq 9: $0.61, 4 calls, budget $0.50 EXCEEDED"
        in text
    )
    marker = ProjectionChange(
        8, "BUILD_CHANGED", "cost-metrics", "b2", 2, AT, previous_build="b1", inputs={"taxonomy": 2}
    )
    assert "live build b1 -> b2 (version 2; taxonomy 2)" in change_line(marker)
    doc = json.loads(change_line(_cost(OVER), as_json=True))
    assert doc["committed_at"] == AT.isoformat()
    assert {k: v for k, v in doc["state"].items() if k != "totals"} == {
        k: v for k, v in OVER.items() if k != "totals"
    }
    assert (doc["state"]["totals"]["cost_usd"], doc["state"]["totals"]["calls"]) == ("0.61", 4)


def test_subscribe_json_shows_no_unknown_sum_as_zero() -> None:
    """Found trying the product: subscribe --json printed a cost-metrics state as stored
    (totals 0 beside usage_unknown_calls, calls 0 beside calls_unknown): a consumer summing
    them read unknowns as zeros. The sums are shown by the figure rule now."""
    stored = {
        "totals": {
            "calls": 9,
            "usage_unknown_calls": 9,
            "input_tokens": 0,
            "output_tokens": 0,
            "cost_usd": "0",
        },
        "by_model": {"openai/gpt-4.1": {"calls": 9, "usage_unknown_calls": 9, "input_tokens": 0}},
    }
    shown = json.loads(change_line(_cost(stored), as_json=True))["state"]
    assert shown["totals"]["calls"] == 9
    assert shown["totals"]["input_tokens"] is None and shown["totals"]["cost_usd"] is None
    assert shown["by_model"]["openai/gpt-4.1"]["input_tokens"] is None
    rollout = {"totals": {"calls": 0, "cost_usd": "0", "input_tokens": 0}, "calls_unknown": True}
    shown = json.loads(change_line(_cost(rollout), as_json=True))["state"]
    assert shown["totals"]["calls"] is None and shown["totals"]["input_tokens"] is None
    assert shown["totals"]["cost_usd"] is None


def test_the_mirror_never_stores_an_unknown_cost_or_token_sum_as_zero() -> None:
    unmetered: dict[str, object] = {
        "totals": {"cost_usd": "0", "calls": 3, "usage_unknown_calls": 3}
    }
    row = mirror_row(_cost(unmetered))
    assert row[4:8] == (None, 3, None, None)  # cost, calls, input, output tokens
    unpriced: dict[str, object] = {
        "totals": {"cost_usd": "0", "calls": 2, "unpriced_calls": 2, "input_tokens": 7}
    }
    assert mirror_row(_cost(unpriced))[4:8] == (None, 2, 7, 0)
    assert mirror_row(_cost({"totals": {}}))[4:8] == (None, 0, None, None)  # no call at all
    # a run whose log keeps no usage (a Codex rollout without token counts): calls unknown
    no_usage: dict[str, object] = {"totals": {"cost_usd": "0", "calls": 0}, "calls_unknown": True}
    row = mirror_row(_cost(no_usage))
    assert row[4:9] == (None, None, None, None, None)  # cost, calls, tokens, unpriced calls
