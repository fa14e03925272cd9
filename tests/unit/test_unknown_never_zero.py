"""Unknown is never shown as zero in a cost row's JSON (issue 26): calls whose log keeps no
usage, calls of unpriced models, runs whose provider reported no cost."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from consumers.analytics import CostRow

ROW = CostRow(
    key="run-1",
    calls=4,
    failed_calls=0,
    input_tokens=1000,
    cached_input_tokens=0,
    output_tokens=50,
    reasoning_tokens=0,
    avg_latency_ms=None,
    cost_usd=Decimal("0.01"),
    unpriced_calls=0,
    reported_calls=4,
    provider_reported_cost_usd=Decimal("0.012"),
    cost_disagreements=0,
)


def test_known_figures_are_shown() -> None:
    doc = ROW.as_json()
    assert (doc["cost_usd"], doc["input_tokens"], doc["provider_reported_cost_usd"]) == (
        "0.01",
        1000,
        "0.012",
    )


def test_calls_of_unknown_usage_have_no_token_sums_and_no_cost() -> None:
    unmetered = replace(
        ROW, input_tokens=0, output_tokens=0, cost_usd=Decimal(0), usage_unknown_calls=4
    )
    doc = unmetered.as_json()
    assert doc["calls"] == 4
    assert doc["cost_usd"] is None and doc["input_tokens"] is None and doc["output_tokens"] is None
    some = replace(ROW, usage_unknown_calls=1).as_json()  # a lower bound, tokens of the others
    assert some["cost_usd"] == "0.01" and some["input_tokens"] == 1000


def test_unpriced_calls_and_unreported_costs_are_unknown() -> None:
    doc = replace(ROW, unpriced_calls=4, cost_usd=Decimal(0)).as_json()
    assert doc["cost_usd"] is None
    doc = replace(ROW, reported_calls=0, provider_reported_cost_usd=Decimal(0)).as_json()
    assert doc["provider_reported_cost_usd"] is None
    assert replace(ROW, calls=0).as_json()["cost_usd"] is None
