"""What the pages and the API show, without services: costs in words (unknown is never $0),
cursors, filters parsed as ``agentledger runs`` parses its options, token expiry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from consumers.access import parse_expiry, token_hash
from consumers.queries import cost_text, parse_run_filters
from consumers.views import OUTCOMES, outcome_filter, run_outcome
from consumers.web.app import HttpError, _offset, _usd, cursor_at, run_cursor, run_cursor_key
from consumers.web.charts import HEIGHT, WIDTH, bars, cost_line, stacked
from schemas.errors import BadArgumentError


def _run(cost: Any, unpriced: int = 0, unknown: int = 0, partly: bool = False) -> dict[str, Any]:
    return {
        "cost_usd": cost,
        "unpriced_calls": unpriced,
        "usage_unknown_calls": unknown,
        "cost_partly_unknown": partly,
    }


def test_an_unknown_cost_is_never_shown_as_zero() -> None:
    assert cost_text(_run(None)) == "unknown"
    assert cost_text(_run(None, unpriced=2)) == "unpriced"
    assert cost_text(_run(Decimal("0.5"), unpriced=1, partly=True)) == ">= $0.5000 + 1 unpriced"
    assert cost_text(_run("0.25", unknown=3, partly=True)) == ">= $0.2500 + 3 of unknown usage"
    assert cost_text(_run(Decimal(0))) == "$0.0000"  # a known zero is a cost
    assert _usd(None) == "unknown" and _usd("1.5") == "$1.5000"


def test_a_cursor_comes_back_as_its_offset_and_junk_is_a_400() -> None:
    assert [_offset(cursor_at(n)) for n in (0, 1, 50, 10_000)] == [0, 1, 50, 10_000]
    assert _offset(None) == 0 and _offset("") == 0
    for junk in ("not-a-cursor", cursor_at(-1), "e30", "!!"):
        with pytest.raises(HttpError) as caught:
            _offset(junk)
        assert caught.value.status == 400


def test_a_runs_cursor_carries_its_sort_value_and_run_exactly() -> None:
    at = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)
    runs: dict[str, dict[str, Any]] = {
        "last": {"run_id": "r-1", "last_at": at},
        "first": {"run_id": "r-1", "first_at": None},
        "cost": {"run_id": "r-2", "cost_usd": Decimal("0.1733899")},
        "entries": {"run_id": "r-3", "entries": 10_005},
        "id": {"run_id": "r-4"},
    }
    for sort, run in runs.items():
        value = None if sort == "id" else next(v for k, v in run.items() if k != "run_id")
        expected = ("r-4", "r-4") if sort == "id" else (value, run["run_id"])
        assert run_cursor_key(sort, run_cursor(sort, run)) == expected
    assert run_cursor_key("last", None) is None
    for junk in ("not-a-cursor", run_cursor("cost", runs["cost"]), cursor_at(5)):
        with pytest.raises(BadArgumentError):
            run_cursor_key("last", junk)


def test_filters_are_checked_as_the_cli_checks_them() -> None:
    f = parse_run_filters(status="failed", since="2026-12-01", cost_above="0.5", sort="cost")
    assert f.status == "FAILED" and f.cost_above == Decimal("0.5") and f.sort == "cost"
    assert f.since == datetime(2026, 12, 1, tzinfo=UTC)
    assert parse_run_filters(fleet="", search="").fleet is None  # an empty field: not given
    for bad in ({"status": "bogus"}, {"sort": "cheapest"}, {"cost_above": "lots"}, {"since": "x"}):
        with pytest.raises(BadArgumentError):
            parse_run_filters(**bad)


def test_a_text_filter_postgresql_cannot_take_is_a_bad_argument() -> None:
    """A NUL in a text filter was a 500 from the web API and an internal error from MCP (the
    database refuses it); a search of a megabyte took ~10 s of ILIKE. Both are refused, named."""
    for field in ("fleet", "failure_class", "search", "model", "repository"):
        with pytest.raises(BadArgumentError, match=field):
            parse_run_filters(**{field: "a\x00b"})
    with pytest.raises(BadArgumentError, match="search"):
        parse_run_filters(search="x" * 1_000_000)
    assert parse_run_filters(search="x" * 1_000).text == "x" * 1_000


def test_expiry_and_hash() -> None:
    now = datetime(2026, 12, 2, tzinfo=UTC)
    assert parse_expiry("30", now) == parse_expiry("30d", now) == now + timedelta(days=30)
    assert parse_expiry("12h", now) == now + timedelta(hours=12)
    assert parse_expiry("45m", now) == now + timedelta(minutes=45)
    for bad in ("0", "soon", "-1d", "3w"):
        with pytest.raises(BadArgumentError):
            parse_expiry(bad, now)
    assert len(token_hash("alt_x")) == 32 and token_hash("alt_x") != token_hash("alt_y")


def test_the_charts_geometry() -> None:
    rows: list[dict[str, Any]] = [
        {"cost_so_far_usd": None},
        {"cost_so_far_usd": "0.5"},
        {"cost_so_far_usd": "1.0"},
    ]
    line = cost_line(rows)
    assert line is not None and line.top_usd == Decimal("1.0")
    assert line.points == f"{WIDTH / 2:.1f},{HEIGHT / 2:.1f} {WIDTH:.1f},0.0"  # None: left out
    assert cost_line([{"cost_so_far_usd": None}]) is None
    day = bars([("2026-12-01", "2"), ("2026-12-02", None), ("2026-12-03", "1")])
    assert [b.value for b in day] == ["$2.0000", "unknown", "$1.0000"]
    assert [b.height for b in day] == [HEIGHT, 0.0, HEIGHT / 2]
    # a known amount too small for four decimals is not shown as $0.0000 (the pages' money rule)
    assert [b.value for b in bars([("d", "0.000014"), ("e", "0")])] == ["$0.000014", "$0.0000"]
    tiny, _ = stacked([("d", "m", "0.0000031")])
    assert tiny[0].value == "$0.0000031"


def test_stacked_bars_add_up_per_day_and_unknown_is_no_height() -> None:
    items = [
        ("2026-12-01", "openai/gpt-4.1", "1.5"),
        ("2026-12-01", "anthropic/claude", "0.5"),
        ("2026-12-02", "openai/gpt-4.1", None),
        ("2026-12-02", "anthropic/claude", "1"),
    ]
    segments, legend = stacked(items)
    assert [name for name, _ in legend] == ["anthropic/claude", "openai/gpt-4.1"]
    first = [s for s in segments if s.label == "2026-12-01"]
    assert sum(s.height for s in first) == pytest.approx(HEIGHT)  # the tallest day fills it
    assert first[0].y + first[0].height == pytest.approx(HEIGHT)  # stacked from the bottom
    assert first[1].y + first[1].height == pytest.approx(first[0].y)
    unknown = next(s for s in segments if s.value == "unknown")
    assert (unknown.label, unknown.height) == ("2026-12-02", 0.0)
    assert {s.x for s in segments if s.label == "2026-12-02"} == {WIDTH / 2 + 1}
    counts, _ = stacked([("d", "tool", 3), ("d", "model", 1)], "count")
    assert [s.value for s in counts] == ["3", "1"]


def test_an_outcome_filter_is_the_status_and_evaluation_of_its_words() -> None:
    assert outcome_filter("running") == ("RUNNING", None)
    assert outcome_filter("timed out") == ("TIMED_OUT", None)
    assert outcome_filter("submitted, evaluation passed") == ("SUBMITTED", "passed")
    assert outcome_filter("submitted, evaluation failed") == ("SUBMITTED", "failed")
    for outcome in OUTCOMES:  # each is what run_outcome says of runs it keeps
        status, evaluation = outcome_filter(outcome)
        failure_class = {"passed": "none", "failed": "tool", "unevaluated": None, None: None}
        shown = run_outcome(None if status == "RUNNING" else status, failure_class[evaluation])
        assert shown.split(" (")[0] == outcome
    with pytest.raises(BadArgumentError):
        outcome_filter("won")
    with pytest.raises(BadArgumentError):
        parse_run_filters(outcome="won")
