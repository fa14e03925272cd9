"""Cost metrics: raw usage normalized per provider, priced at the call's time, counted once."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from projectors.base import HistoryRow
from projectors.cost_metrics import (
    HISTORY_KIND,
    CostMetrics,
    CostMetricsProjection,
    rollup,
)
from projectors.pricing import (
    ENTRY_FIELDS,
    NORMALIZER_VERSION,
    PriceTable,
    PriceTableError,
    Usage,
    normalize_raw,
    normalize_usage,
)
from schemas.factory import EntryBuilder, model_usage
from schemas.models import EntryKind, LedgerEntry, ModelCallStatus, ModelUsagePart, RunStatus
from streams.simulate import MODELS, simulate_runs

SHIPPED_FILE = Path(__file__).parents[2] / "projectors" / "data" / "prices.v1.json"
DOC_KEYS = {
    "cache_write_input_tokens",
    "run_id",
    "fleet_id",
    "entry_id",
    "seq",
    "response_id",
    "occurred_at",
    "day",
    "provider",
    "model",
    "purpose",
    "status",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "latency_ms",
    "cost_usd",
    "provider_reported_cost_usd",
    "cost_disagreement",
    "unpriced",
    "price_version",
    "price_effective_from",
    "normalizer",
    "normalizer_version",
    "usage_mismatch",
}
ANTHROPIC_RAW = {
    "input_tokens": 1000,
    "cache_read_input_tokens": 3000,
    "cache_creation_input_tokens": 500,
    "output_tokens": 700,
}
OPENAI_CHAT_RAW = {
    "prompt_tokens": 5000,
    "completion_tokens": 900,
    "total_tokens": 5900,
    "prompt_tokens_details": {"cached_tokens": 2000},
    "completion_tokens_details": {"reasoning_tokens": 400},
}
GOOGLE_RAW = {
    "promptTokenCount": 8000,
    "cachedContentTokenCount": 6000,
    "candidatesTokenCount": 300,
    "thoughtsTokenCount": 200,
    "totalTokenCount": 8500,
}


def usage(
    provider: str = "anthropic",
    model: str = "claude-sonnet-4-5",
    raw: dict[str, Any] | None = None,
    **fields: Any,
) -> ModelUsagePart:
    """A validated usage part; the entry's own fields default to naive (uncached) counts."""
    base = model_usage(fields.pop("response_id", "resp-1")).model_dump()
    base.update(
        provider=provider,
        model=model,
        raw_usage_json=json.dumps(raw if raw is not None else ANTHROPIC_RAW),
        input_tokens=1000,
        cached_input_tokens=0,
        output_tokens=700,
        reasoning_tokens=0,
        latency_ms=1200,
        provider_reported_cost_usd=None,
    )
    base.update(fields)
    return ModelUsagePart.model_validate(base)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


class Run:
    """A hand-written run: a start with an optional budget, then model calls."""

    def __init__(self, budget: str | None = None, run_id: str = "run-1", fleet: str = "fleet-a"):
        self.b = EntryBuilder(run_id, fleet_id=fleet)
        metadata = {"task_budget_usd": budget} if budget is not None else {}
        self.b.add(EntryKind.RUN_STARTED, metadata=metadata)

    def call(self, *parts: ModelUsagePart, when: datetime | None = None) -> LedgerEntry:
        extra = {"occurred_at": when} if when is not None else {}
        return self.b.add(EntryKind.MODEL_CALL, parts, **extra)

    @property
    def entries(self) -> list[LedgerEntry]:
        return self.b.entries


def fold(
    entries: list[LedgerEntry], projection: CostMetricsProjection | None = None
) -> tuple[CostMetrics, list[HistoryRow]]:
    """Fold like the engine does: history after every accepted entry."""
    p = projection or CostMetricsProjection(PriceTable.shipped())
    state: CostMetrics | None = None
    rows: list[HistoryRow] = []
    for entry in entries:
        before = state
        state = state or p.initial(entry)
        if p.accepts(entry):
            state = p.fold(state, entry)
            rows.extend(p.history(before, state, entry))
    assert state is not None
    return state, rows


def table(tmp_path: Path, models: dict[str, Any], version: str = "user-1") -> PriceTable:
    file = tmp_path / "prices.json"
    file.write_text(json.dumps({"version": version, "currency": "USD", "models": models}))
    return PriceTable.load(file)


# -- normalization -------------------------------------------------------------------------


def test_anthropic_input_excludes_cache_reads_and_writes() -> None:
    got = normalize_usage(usage("anthropic", raw=ANTHROPIC_RAW))
    assert got == Usage(4500, 3000, 700, 0, "anthropic", cache_write=500)


def test_openai_chat_and_responses_include_cached_and_reasoning() -> None:
    chat = normalize_usage(usage("openai", "gpt-4.1", OPENAI_CHAT_RAW))
    assert chat == Usage(5000, 2000, 900, 400, "openai")
    responses = {
        "input_tokens": 5000,
        "output_tokens": 900,
        "input_tokens_details": {"cached_tokens": 2000},
        "output_tokens_details": {"reasoning_tokens": 400},
    }
    assert normalize_usage(usage("openai", "o4-mini", responses)) == chat


def test_google_candidates_exclude_thoughts() -> None:
    got = normalize_usage(usage("google", "gemini-2.5-pro", GOOGLE_RAW))
    assert got == Usage(8000, 6000, 500, 200, "google")
    snake = {
        "prompt_token_count": 8000,
        "cached_content_token_count": 6000,
        "candidates_token_count": 300,
        "thoughts_token_count": 200,
    }
    assert normalize_usage(usage("google", "gemini-2.5-pro", {"usage_metadata": snake})) == got


@pytest.mark.parametrize(
    ("provider", "raw"),
    [
        ("mistral", {"prompt_tokens": 10, "completion_tokens": 5}),
        ("anthropic", {"input_tokens": "1000", "output_tokens": 700}),
        ("anthropic", {"output_tokens": 700}),
        ("openai", {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": 3}),
        (
            "openai",
            {
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "completion_tokens_details": {"reasoning_tokens": 6},
            },
        ),
        ("google", {"promptTokenCount": -1}),
        ("google", [1, 2]),
    ],
)
def test_unknown_provider_or_shape_falls_back_to_entry_fields(provider: str, raw: Any) -> None:
    part = usage(provider, raw=raw, input_tokens=900, cached_input_tokens=100)
    assert normalize_usage(part) == Usage(900, 100, 700, 0, ENTRY_FIELDS)


def test_the_fold_reads_raw_usage_not_the_entry_fields() -> None:
    run = Run()
    run.call(usage("anthropic", raw=ANTHROPIC_RAW, response_id="a"))
    run.call(usage("mistral", "mistral-large", raw={"x": 1}, response_id="b"))
    state, rows = fold(run.entries)
    first, second = (r.doc for r in rows)
    assert (first["input_tokens"], first["cached_input_tokens"]) == (4500, 3000)
    assert first["normalizer"] == "anthropic" and first["usage_mismatch"] is True
    assert second["normalizer"] == ENTRY_FIELDS and second["usage_mismatch"] is False
    assert state.totals.input_tokens == 4500 + 1000
    assert state.normalizer_version == NORMALIZER_VERSION == first["normalizer_version"]


# -- idempotency ---------------------------------------------------------------------------


def test_the_same_response_reported_twice_counts_once() -> None:
    run = Run()
    part = usage(response_id="resp-x")
    run.call(part)
    run.call(part)  # a runtime reporting one response per content block
    run.call(usage(response_id="resp-y"))
    state, rows = fold(run.entries)
    assert state.totals.calls == 2 and state.duplicate_reports == 1
    assert [r.key for r in rows] == ["resp-x", "resp-y"]
    assert [r.seq for r in rows] == [2, 4]
    assert state.seen_keys == {"resp-x", "resp-y"}
    assert state.totals.cost_usd == sum(Decimal(r.doc["cost_usd"]) for r in rows)


def test_calls_without_response_id_count_by_entry_id() -> None:
    run = Run()
    run.call(usage(response_id=None))
    entry = run.call(usage(response_id=None), usage(response_id=None))
    p = CostMetricsProjection(PriceTable.shipped())
    state, rows = fold(run.entries, p)
    assert [r.key for r in rows] == ["run-1-e2", "run-1-e3", "run-1-e3#1"]
    assert all(r.doc["response_id"] is None for r in rows)
    again = p.fold(state, entry)  # a redelivered entry adds nothing
    assert again.totals == state.totals and p.history(state, again, entry) == []


def test_accepts_only_run_start_and_model_calls() -> None:
    p = CostMetricsProjection(PriceTable.shipped())
    accepted = {k for k in EntryKind if p.accepts(EntryBuilder().add(k))}
    assert accepted == {EntryKind.RUN_STARTED, EntryKind.MODEL_CALL}


# -- pricing -------------------------------------------------------------------------------


def test_price_in_effect_at_the_call_time() -> None:
    raw = {"promptTokenCount": 1_000_000, "cachedContentTokenCount": 1_000_000}
    part = usage("google", "gemini-2.5-pro", raw, input_tokens=1_000_000, output_tokens=0)
    run = Run()
    run.call(
        part.model_copy(update={"provider_response_id": "old"}),
        when=at("2026-05-31T23:59:59.999999"),
    )
    run.call(
        part.model_copy(update={"provider_response_id": "new"}), when=at("2026-06-01T00:00:00")
    )
    run.call(
        part.model_copy(update={"provider_response_id": "early"}), when=at("2024-01-01T12:00:00")
    )
    _, rows = fold(run.entries)
    old, new, early = (r.doc for r in rows)
    assert (old["cost_usd"], old["price_effective_from"]) == ("0.31", "2025-06-17")
    assert (new["cost_usd"], new["price_effective_from"]) == ("0.125", "2026-06-01")
    assert early["unpriced"] is True and early["cost_usd"] is None
    assert (old["day"], new["day"]) == ("2026-05-31", "2026-06-01")


def test_cached_and_reasoning_charged_at_their_rates(tmp_path: Path) -> None:
    rates = {"effective_from": "2026-01-01", "input": 2, "cached_input": 0.5, "output": 8}
    prices = table(
        tmp_path,
        {
            "openai/with-rates": [{**rates, "reasoning": 12}],
            "openai/plain": [{"effective_from": "2026-01-01", "input": 2, "output": 8}],
        },
    )
    raw = {
        "prompt_tokens": 1_000_000,
        "completion_tokens": 100_000,
        "prompt_tokens_details": {"cached_tokens": 400_000},
        "completion_tokens_details": {"reasoning_tokens": 30_000},
    }
    run = Run()
    run.call(usage("openai", "with-rates", raw, response_id="r1"))
    run.call(usage("openai", "plain", raw, response_id="r2"))
    state, rows = fold(run.entries, CostMetricsProjection(prices))
    # 600k*2 + 400k*0.5 + 70k*8 + 30k*12 per million; the plain model at input/output rates
    assert [r.doc["cost_usd"] for r in rows] == ["2.32", "2.8"]
    assert state.totals.cost_usd == Decimal("5.12")
    assert state.by_model["openai/plain"].cost_usd == Decimal("2.8")


def test_unpriced_model_has_no_cost_and_never_crashes() -> None:
    run = Run(budget="1.00")
    run.call(usage("anthropic", "claude-opus-99", response_id="u"))
    run.call(usage(response_id="p"))
    state, rows = fold(run.entries)
    unpriced, priced = (r.doc for r in rows)
    assert unpriced["unpriced"] is True and unpriced["cost_usd"] is None
    assert unpriced["price_effective_from"] is None and unpriced["cost_disagreement"] is False
    assert priced["unpriced"] is False
    assert state.totals.unpriced_calls == 1 and state.totals.calls == 2
    assert state.totals.cost_usd == Decimal(priced["cost_usd"])
    assert state.by_model["anthropic/claude-opus-99"].cost_usd == 0


def test_bare_model_key_is_found(tmp_path: Path) -> None:
    prices = table(
        tmp_path, {"my-model": [{"effective_from": "2020-01-01", "input": 1, "output": 1}]}
    )
    assert prices.price("any-provider", "my-model", at("2026-01-01T00:00:00")) is not None
    assert prices.price("any-provider", "other", at("2026-01-01T00:00:00")) is None


# -- provider-reported cost ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reported", "disagree"),
    [(0.0161, True), (0.016, False), (0.0159, False), (0.0158, False), (0.05, True)],
)
def test_disagreement_beyond_tolerance(reported: float, disagree: bool) -> None:
    # ours: (1500 uncached * $3 + 3000 cached * $0.30 + 700 output * $15) per million = $0.0159;
    # the tolerance is 1% of the reported cost (about $0.00016)
    run = Run()
    run.call(usage(provider_reported_cost_usd=reported))
    state, rows = fold(run.entries)
    doc = rows[0].doc
    assert doc["cost_usd"] == "0.0159"
    assert doc["provider_reported_cost_usd"] == str(reported)
    assert doc["cost_disagreement"] is disagree
    assert state.totals.cost_disagreements == int(disagree)
    assert state.totals.provider_reported_cost_usd == Decimal(str(reported))


def test_tiny_gaps_are_not_disagreements(tmp_path: Path) -> None:
    prices = table(tmp_path, {"m": [{"effective_from": "2020-01-01", "input": 0.5, "output": 0}]})
    part = usage(
        "acme",
        "m",
        {},
        input_tokens=1,
        output_tokens=0,
        provider_reported_cost_usd=0.000001,
    )
    run = Run()
    run.call(part)
    _, rows = fold(run.entries, CostMetricsProjection(prices))
    assert rows[0].doc["cost_usd"] == "0.0000005"  # 50% off but only $0.0000005
    assert rows[0].doc["cost_disagreement"] is False


# -- budget --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "expected_budget", "over"),
    [
        ("0.02", Decimal("0.02"), True),
        ("0.05", Decimal("0.05"), False),
        (None, None, False),
        ("lots", None, False),
        ("-1", None, False),
        ("NaN", None, False),
    ],
)
def test_over_budget(budget: str | None, expected_budget: Decimal | None, over: bool) -> None:
    run = Run(budget=budget)
    run.call(usage(response_id="a"))  # $0.0159
    run.call(usage(response_id="b"))
    state, _ = fold(run.entries)
    assert state.totals.cost_usd == Decimal("0.0318")
    assert state.task_budget_usd == expected_budget and state.over_budget is over


def test_over_budget_after_the_first_call_that_crosses_it() -> None:
    run = Run(budget="0.0159")
    run.call(usage(response_id="a"))
    p = CostMetricsProjection(PriceTable.shipped())
    state, _ = fold(run.entries, p)
    assert not state.over_budget, "equal to the budget is within it"
    run.call(usage(response_id="b"))
    assert fold(run.entries, p)[0].over_budget


# -- price tables ----------------------------------------------------------------------------


def test_user_table_overrides_the_shipped_one(tmp_path: Path) -> None:
    prices = table(
        tmp_path,
        {
            "anthropic/claude-sonnet-4-5": [
                {"effective_from": "2020-01-01", "input": 10, "output": 10}
            ]
        },
        version="acme-2026-07",
    )
    run = Run()
    run.call(usage())
    state, rows = fold(run.entries, CostMetricsProjection(prices))
    assert state.price_version == rows[0].doc["price_version"] == "acme-2026-07"
    assert rows[0].doc["cost_usd"] == "0.052"  # (4500 + 700) * $10 per million
    assert fold(run.entries)[0].price_version == PriceTable.shipped().version


def test_shipped_table_prices_every_simulated_model() -> None:
    shipped = PriceTable.shipped()
    assert shipped.version == json.loads(SHIPPED_FILE.read_text())["version"]
    when = at("2026-11-01T08:00:00")
    assert all(shipped.price(p, m, when) is not None for p, m in MODELS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not a JSON document"),
        ('{"version": "1", "currency": "EUR", "models": {}}', "currency"),
        ('{"version": "1", "currency": "USD", "models": {"m": []}}', "models.m"),
        (
            '{"version": "1", "currency": "USD", "models": {"m": '
            '[{"effective_from": "2026-01-01", "input": -1, "output": 1}]}}',
            "input",
        ),
        (
            '{"version": "1", "currency": "USD", "models": {"m": ['
            '{"effective_from": "2026-01-01", "input": 1, "output": 1},'
            '{"effective_from": "2026-01-01", "input": 2, "output": 2}]}}',
            "same effective_from",
        ),
    ],
)
def test_bad_price_tables_are_refused(tmp_path: Path, text: str, message: str) -> None:
    file = tmp_path / "prices.json"
    file.write_text(text)
    with pytest.raises(PriceTableError, match=message):
        PriceTable.load(file)


def test_missing_price_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PriceTableError, match="cannot read price table"):
        PriceTable.load(tmp_path / "absent.json")


# -- documents -------------------------------------------------------------------------------


def test_doc_round_trip_through_json() -> None:
    p = CostMetricsProjection(PriceTable.shipped())
    run = Run(budget="0.50")
    run.call(usage(response_id="z", provider_reported_cost_usd=0.0161))
    run.call(
        usage(
            "openai",
            "o4-mini",
            OPENAI_CHAT_RAW,
            response_id="a",
            purpose="coding",
            input_tokens=5000,
            output_tokens=900,
            status=ModelCallStatus.ERROR,
        )
    )
    run.call(usage("anthropic", "claude-opus-99", response_id="m"))
    state, _ = fold(run.entries, p)
    doc = json.loads(json.dumps(p.to_doc(state)))
    assert p.from_doc(doc) == state
    assert doc["seen_keys"] == ["a", "m", "z"], "sorted, whatever the hash seed"
    assert doc["totals"]["cost_usd"] == "0.02371" and doc["task_budget_usd"] == "0.5"
    assert state.totals.failed_calls == 1 and state.by_purpose["coding"].calls == 1


def test_history_rows_are_flat_with_stable_keys() -> None:
    run = Run()
    run.call(usage(response_id="resp-7", purpose="review"))
    _, (row,) = fold(run.entries)
    assert (row.kind, row.key, row.seq) == (HISTORY_KIND, "resp-7", 2)
    assert set(row.doc) == DOC_KEYS
    assert all(not isinstance(v, dict | list) for v in row.doc.values())
    assert row.doc["occurred_at"] == "2026-07-04T03:00:02.123458Z"
    assert row.doc["day"] == "2026-07-04" and row.doc["fleet_id"] == "fleet-a"
    assert json.loads(json.dumps(row.doc)) == row.doc


# -- roll-ups --------------------------------------------------------------------------------


def _rows() -> list[dict[str, Any]]:
    a = Run(run_id="run-a", fleet="fleet-1")
    a.call(usage(response_id="1", purpose="planning"), when=at("2026-07-04T10:00:00"))
    a.call(
        usage(
            "openai",
            "gpt-4.1",
            OPENAI_CHAT_RAW,
            response_id="2",
            purpose="coding",
            input_tokens=5000,
            output_tokens=900,
        ),
        when=at("2026-07-05T10:00:00"),
    )
    b = Run(run_id="run-b", fleet="fleet-2")
    b.call(usage(response_id="3", purpose="coding"), when=at("2026-07-05T11:00:00"))
    b.call(
        usage("anthropic", "claude-opus-99", response_id="4", purpose="coding"),
        when=at("2026-07-05T12:00:00"),
    )
    rows = fold(a.entries)[1] + fold(b.entries)[1]
    return [json.loads(json.dumps(r.doc)) for r in rows]


@pytest.mark.parametrize(
    ("by", "expected"),
    [
        ("run", {"run-a": (2, "0.0301"), "run-b": (2, "0.0159")}),
        ("fleet", {"fleet-1": (2, "0.0301"), "fleet-2": (2, "0.0159")}),
        (
            "model",
            {
                "anthropic/claude-opus-99": (1, "0"),
                "anthropic/claude-sonnet-4-5": (2, "0.0318"),
                "openai/gpt-4.1": (1, "0.0142"),
            },
        ),
        ("purpose", {"coding": (3, "0.0301"), "planning": (1, "0.0159")}),
        ("day", {"2026-07-04": (1, "0.0159"), "2026-07-05": (3, "0.0301")}),
    ],
)
def test_rollup_by_each_dimension(by: Any, expected: dict[str, tuple[int, str]]) -> None:
    got = rollup(_rows(), by)
    assert [g.key for g in got] == sorted(expected)
    assert {g.key: (g.calls, g.cost_usd) for g in got} == {
        k: (n, Decimal(c)) for k, (n, c) in expected.items()
    }
    assert all(g.by == by for g in got)
    assert sum(g.input_tokens for g in got) == 4500 * 3 + 5000


def test_rollup_keeps_unpriced_and_latency() -> None:
    (total,) = rollup([r | {"fleet_id": "all"} for r in _rows()], "fleet")
    assert total.unpriced_calls == 1 and total.calls == 4
    assert total.latency_ms_sum == 4 * 1200 and total.avg_latency_ms == 1200
    assert total.model_dump(mode="json")["cost_usd"] == "0.046"


# -- the simulator ---------------------------------------------------------------------------


def _table_by_hand() -> dict[str, list[dict[str, Any]]]:
    models: dict[str, list[dict[str, Any]]] = json.loads(
        SHIPPED_FILE.read_text(), parse_float=Decimal
    )["models"]
    return models


def _tokens_by_hand(provider: str, raw: dict[str, Any]) -> tuple[int, int, int, int]:
    """(uncached input, cached input, non-reasoning output, reasoning) from raw usage."""
    if provider == "anthropic":
        return raw["input_tokens"], raw["cache_read_input_tokens"], raw["output_tokens"], 0
    if provider == "openai":
        cached = raw["prompt_tokens_details"]["cached_tokens"]
        reasoning = raw["completion_tokens_details"]["reasoning_tokens"]
        return (
            raw["prompt_tokens"] - cached,
            cached,
            raw["completion_tokens"] - reasoning,
            reasoning,
        )
    cached = raw["cachedContentTokenCount"]
    return (
        raw["promptTokenCount"] - cached,
        cached,
        raw["candidatesTokenCount"],
        raw["thoughtsTokenCount"],
    )


def _cost_by_hand(entry: LedgerEntry, part: ModelUsagePart) -> Decimal:
    periods = _table_by_hand()[f"{part.provider}/{part.model}"]
    day = entry.occurred_at.date()
    price = max(
        (p for p in periods if date.fromisoformat(p["effective_from"]) <= day),
        key=lambda p: str(p["effective_from"]),
    )
    uncached, cached, out, reasoning = _tokens_by_hand(
        part.provider, json.loads(part.raw_usage_json)
    )
    per_million: Decimal = (
        uncached * price["input"]
        + cached * price.get("cached_input", price["input"])
        + out * price["output"]
        + reasoning * price.get("reasoning", price["output"])
    )
    return per_million / 1_000_000


def test_simulated_run_costs_equal_their_rows_and_an_independent_derivation() -> None:
    duplicates = 0
    for run in simulate_runs(2, 14, seed=1):
        state, rows = fold(run)
        expected, seen = Decimal(0), set()
        for entry in run:
            for part in entry.parts:
                if isinstance(part, ModelUsagePart) and part.provider_response_id not in seen:
                    seen.add(part.provider_response_id)
                    expected += _cost_by_hand(entry, part)
        assert state.totals.calls == len(seen) == len(rows)
        assert state.totals.cost_usd == sum(Decimal(r.doc["cost_usd"]) for r in rows) == expected
        assert state.totals.unpriced_calls == 0
        assert state.totals.input_tokens == sum(r.doc["input_tokens"] for r in rows)
        assert all(
            r.doc["normalizer"] != ENTRY_FIELDS and not r.doc["usage_mismatch"] for r in rows
        )
        duplicates += state.duplicate_reports
    assert duplicates > 0, "the simulator re-reports some responses"


# -- unknown is not zero (schema v3), reported run totals, gateways ------------------------------


def test_an_unknown_latency_is_left_out_of_the_average_not_counted_as_zero() -> None:
    run = Run()
    run.call(usage(response_id="a", latency_ms=1000))
    run.call(usage(response_id="b", latency_ms=0, unknown_fields=("latency_ms",)))
    state, rows = fold(run.entries)
    assert state.totals.calls == 2 and state.totals.latency_calls == 1
    assert state.totals.avg_latency_ms == 1000
    assert rows[1].doc["latency_ms"] is None


def test_unknown_token_counts_give_no_tokens_and_no_cost_never_zero_dollars() -> None:
    unknown = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens")
    run = Run(budget="1.00")
    run.call(usage(response_id="a"))
    run.call(
        usage(
            response_id="b",
            raw=None,
            raw_usage_json="null",
            input_tokens=0,
            output_tokens=0,
            unknown_fields=unknown,
        )
    )
    state, rows = fold(run.entries)
    priced = fold(run.entries[:2])[0]
    assert state.totals.calls == 2 and state.totals.usage_unknown_calls == 1
    assert state.totals.cost_usd == priced.totals.cost_usd  # the known call's cost alone
    assert rows[1].doc["cost_usd"] is None and rows[1].doc["input_tokens"] is None


def test_a_zero_that_is_called_unknown_is_refused() -> None:
    with pytest.raises(ValidationError, match="latency_ms is unknown"):
        usage(latency_ms=5, unknown_fields=("latency_ms",))


def test_cache_writes_are_counted_and_priced_at_their_own_rate_when_the_table_has_one() -> None:
    table = PriceTable.from_json(
        json.dumps(
            {
                "version": "t",
                "currency": "USD",
                "models": {
                    "anthropic/claude-sonnet-4-5": [
                        {
                            "effective_from": "2025-01-01",
                            "input": 3,
                            "cached_input": 0.3,
                            "output": 15,
                            "cache_write": 3.75,
                        }
                    ]
                },
            }
        )
    )
    run = Run()
    run.call(usage())
    state, _ = fold(run.entries, CostMetricsProjection(table))
    assert state.totals.cache_write_input_tokens == 500
    # 1,000 uncached at $3 + 500 written at $3.75 + 3,000 read at $0.30 + 700 out at $15, per M
    expected = (Decimal(1000) * 3 + 500 * Decimal("3.75") + 3000 * Decimal("0.3") + 700 * 15) / (
        10**6
    )
    assert state.totals.cost_usd == expected


def test_reported_run_totals_stand_beside_the_call_sums_and_a_difference_is_flagged() -> None:
    from projectors.cost_metrics import RUN_TOTALS_REF
    from schemas.models import JsonPart

    totals = {"cost_usd": "1.26719", "input_tokens": 122612, "output_tokens": 1369, "calls": 2}
    only = Run()
    only.b.add(
        EntryKind.RUN_FINISHED,
        (JsonPart(json_text=json.dumps(totals), schema_ref=RUN_TOTALS_REF),),
        run_status=RunStatus.SUBMITTED,
    )
    state, _ = fold(only.entries)
    assert state.totals.calls == 0 and state.totals.cost_usd == 0  # never added to the sums
    assert state.reported_totals is not None
    assert state.reported_totals.cost_usd == Decimal("1.26719")
    assert not state.reported_disagrees  # nothing per call to compare with

    both = Run()
    both.call(usage(response_id="a"))
    both.b.add(
        EntryKind.RUN_FINISHED,
        (JsonPart(json_text=json.dumps(totals), schema_ref=RUN_TOTALS_REF),),
        run_status=RunStatus.SUCCEEDED,
    )
    assert fold(both.entries)[0].reported_disagrees


def test_an_unpriced_call_spends_the_budget_by_its_reported_cost() -> None:
    run = Run(budget="0.01")
    run.call(usage("acme", "no-such-model", response_id="a", provider_reported_cost_usd=0.02))
    state, _ = fold(run.entries)
    assert state.totals.unpriced_calls == 1 and state.totals.cost_usd == 0
    assert state.over_budget


def test_gateways_report_a_google_models_reasoning_apart_from_its_completion() -> None:
    raw = {
        "prompt_tokens": 1000,
        "completion_tokens": 200,
        "completion_tokens_details": {"reasoning_tokens": 300},
    }
    got = normalize_raw("openrouter", "google/gemini-2.5-pro", json.dumps(raw))
    assert got is not None and (got.output, got.reasoning) == (500, 300)
    plain = normalize_raw(
        "openrouter", "openai/gpt-4.1", json.dumps(raw | {"completion_tokens": 400})
    )
    assert plain is not None and (plain.output, plain.reasoning) == (400, 300)


def test_codex_token_count_shape_is_read_as_openai() -> None:
    raw = {
        "input_tokens": 44218,
        "cached_input_tokens": 42880,
        "output_tokens": 96,
        "reasoning_output_tokens": 17,
        "total_tokens": 44314,
    }
    assert normalize_raw("openai", "gpt-5.3-codex", json.dumps(raw)) == Usage(
        44218, 42880, 96, 17, "openai"
    )


# -- prices from a maintained database (genai-prices), our table over it -------------------------


def test_the_default_prices_are_the_maintained_database_with_its_version() -> None:
    from projectors.pricing import LayeredPrices

    p = CostMetricsProjection()
    assert isinstance(p.prices, LayeredPrices)
    assert p.prices.version.startswith("genai-prices 0.2.3")
    run = Run()
    run.call(usage("anthropic", "claude-opus-4-6", response_id="a"))  # not in our table
    state, _ = fold(run.entries, p)
    assert state.price_version == p.prices.version
    assert state.totals.unpriced_calls == 0 and state.totals.cost_usd > 0


def test_genai_prices_charge_cache_reads_and_writes_at_their_rates() -> None:
    from projectors.pricing import GenaiPrices

    prices = GenaiPrices()
    at = datetime(2026, 2, 10, tzinfo=UTC)
    plain = prices.price_call("anthropic", "claude-opus-4-6", at, Usage(1000, 0, 0, 0, "x"))
    read = prices.price_call("anthropic", "claude-opus-4-6", at, Usage(1000, 1000, 0, 0, "x"))
    written = prices.price_call(
        "anthropic", "claude-opus-4-6", at, Usage(1000, 0, 0, 0, "x", cache_write=1000)
    )
    assert plain is not None and read is not None and written is not None
    # Opus 4.6: $5 input, $0.50 cache read, $6.25 cache write, per million tokens
    assert (plain.cost, read.cost, written.cost) == (
        Decimal("0.005"),
        Decimal("0.0005"),
        Decimal("0.00625"),
    )
    assert prices.price_call("meta", "llama-4-maverick", at, Usage(1, 0, 1, 0, "x")) is None


def test_our_table_prices_what_it_names_and_the_database_the_rest() -> None:
    from projectors.pricing import LayeredPrices

    table = PriceTable.from_json(
        json.dumps(
            {
                "version": "ours-1",
                "currency": "USD",
                "models": {
                    "acme/house-model": [{"effective_from": "2025-01-01", "input": 1, "output": 2}]
                },
            }
        )
    )
    prices = LayeredPrices(table)
    assert prices.version == "genai-prices 0.2.3 + table ours-1"
    at = datetime(2026, 2, 10, tzinfo=UTC)
    ours = prices.price_call("acme", "house-model", at, Usage(10**6, 0, 10**6, 0, "x"))
    theirs = prices.price_call("openai", "gpt-4", at, Usage(10**6, 0, 0, 0, "x"))
    assert ours is not None and ours.cost == 3 and ours.source == "table ours-1"
    assert theirs is not None and theirs.source.startswith("genai-prices")
    assert prices.price_call("acme", "other", at, Usage(1, 0, 1, 0, "x")) is None


# -- genai-prices applied per price, not per call ------------------------------------------------

GENAI_TIMES = (
    datetime(2024, 3, 1, 3, 0, tzinfo=UTC),
    datetime(2026, 2, 1, 16, 30, tzinfo=UTC),  # in a daily off-peak window (deepseek)
    datetime(2026, 11, 1, 0, 15, tzinfo=UTC),
    datetime(2027, 9, 9, 23, 59, 59, tzinfo=UTC),
)
GENAI_COUNTS = (  # (input, cache read, cache write, output)
    (18420, 12000, 0, 1350),
    (250_000, 100_000, 20_000, 5000),  # past a 200k long-context tier
    (200_000, 0, 0, 10),
    (0, 0, 0, 0),
    (5000, 4000, 3000, 300),  # cache reads and writes above the input: genai-prices refuses it
    (2**62, 2**61, 2**61, 2**62),  # beyond a Decimal's 28 digits: rounded sums
    (3, 1, 2, 7),
)


def _genai_outcome(price: Callable[[], Any]) -> tuple[str, Any]:
    try:
        found = price()
    except Exception as exc:
        return "raises", (type(exc), str(exc))
    # the same Decimal: value, digits and exponent
    return "priced", found.as_tuple() if isinstance(found, Decimal) else found


def test_the_genai_memo_gives_calc_prices_decimal_for_every_model_of_the_database() -> None:
    """Every model genai-prices knows, at several times and usages: the memo's total is
    calc_price's to the last digit and exponent, and where calc_price raises it raises alike."""
    from genai_prices import __version__, data_snapshot

    from projectors.pricing import _GENAI_CHECKED, _Ask, _calc_total, _GenaiMemo

    assert __version__ == _GENAI_CHECKED, "check the memo against this release, then bump it"
    memo = _GenaiMemo.of_current_data()

    def memoized(provider: str, model: str, when: datetime, counts: Any) -> Any:
        total = memo.total(provider, model, when, counts)
        return _calc_total(provider, model, when, counts) if total is _Ask.CALC else total

    checked = 0
    for provider in data_snapshot.get_snapshot().providers:
        for n, model in enumerate(provider.models):
            when = GENAI_TIMES[n % len(GENAI_TIMES)]
            for counts in (GENAI_COUNTS[n % len(GENAI_COUNTS)], GENAI_COUNTS[0]):
                call = (provider.id, model.id, when, counts)
                assert _genai_outcome(partial(memoized, *call)) == _genai_outcome(
                    partial(_calc_total, *call)
                ), call
                checked += 1
    assert checked > 4000


def test_genai_prices_of_the_simulated_models_do_not_ask_calc_price() -> None:
    from projectors.pricing import _Ask, _GenaiMemo

    memo = _GenaiMemo.of_current_data()
    for provider, model in MODELS:
        for counts in GENAI_COUNTS[:4]:
            total = memo.total(provider, model, GENAI_TIMES[2], counts)
            assert isinstance(total, Decimal), (provider, model, counts)
    assert memo.total("acme", "house-model", GENAI_TIMES[2], GENAI_COUNTS[0]) is _Ask.UNPRICED


def test_a_call_whose_log_lost_its_output_keeps_its_known_input() -> None:
    """Found trying the product: a call whose log kept its input but lost its output count (a
    drifted Claude Code usage) had every count unknown, its input too. It is still of unknown
    usage (no cost: it cannot be priced), but its input is summed and known."""
    from projectors.cost_metrics import known_sum, partly_unknown, unknown_calls

    run = Run()
    run.call(usage(response_id="r1"))  # a whole call: 1000 in, 700 out
    lost = usage(
        response_id="r2",
        raw={"input_tokens": 400},  # no output_tokens: no normalizer reads it
        input_tokens=400,
        output_tokens=0,
        unknown_fields=("output_tokens", "reasoning_tokens"),
    )
    run.call(lost)
    blank = usage(
        response_id="r3",
        raw={},
        input_tokens=0,
        output_tokens=0,
        unknown_fields=("input_tokens", "output_tokens", "reasoning_tokens"),
    )
    run.call(blank)  # input unknown too: every count unknown, as before
    state, rows = fold(run.entries)
    partial = next(r.doc for r in rows if r.doc["response_id"] == "r2")
    assert (partial["input_tokens"], partial["output_tokens"], partial["cost_usd"]) == (
        400,
        None,
        None,
    )
    assert partial["cached_input_tokens"] == 0 and partial["unpriced"] is False
    empty = next(r.doc for r in rows if r.doc["response_id"] == "r3")
    assert [empty[n] for n in ("input_tokens", "cached_input_tokens", "output_tokens")] == [
        None
    ] * 3
    whole = next(r.doc for r in rows if r.doc["response_id"] == "r1")["input_tokens"]
    t = state.totals
    assert (t.calls, t.usage_unknown_calls, t.usage_partial_calls) == (3, 2, 1)
    assert t.input_tokens == whole + 400 and unknown_calls(t, "input_tokens") == 1
    assert known_sum(t, "input_tokens", t.input_tokens) == whole + 400  # >= (r3's input)
    assert unknown_calls(t, "output_tokens") == 2 and unknown_calls(t, "cost") == 2
    assert unknown_calls(t, "cached_input_tokens") == 1  # r2 kept its cached count (0)
    assert {"input_tokens", "output_tokens", "cost"} <= set(partly_unknown(t))
    # the SQL roll-up's rule, in Python: the same counts from the history rows
    [by_run] = rollup([r.doc for r in rows], "run")
    assert (by_run.usage_unknown_calls, by_run.usage_partial_calls, by_run.input_tokens) == (
        2,
        1,
        whole + 400,
    )
    # a build before this count (no usage_partial_calls kept): every count of such calls unknown
    older = t.model_copy(update={"usage_partial_calls": 0})
    assert unknown_calls(older, "input_tokens") == 2
