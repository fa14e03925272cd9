"""The CLI's plain-language lines: no raw dicts, no unexplained numbers."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from consumers.render import print_manifest, print_memory, violation_text
from consumers.render_analytics import budget_text


def _cost(**over: Any) -> dict[str, Any]:
    return {"task_budget_usd": "1.00", "over_budget": False, "cost_usd": "0.3761"} | over


def test_a_budget_stop_under_the_priced_cost_is_explained() -> None:
    assert budget_text(_cost(), "SUCCEEDED") == " of $1.00 budget"
    assert "OVER BUDGET" in budget_text(_cost(over_budget=True), "BUDGET_EXCEEDED")
    said = budget_text(_cost(), "BUDGET_EXCEEDED")
    assert said.startswith(" of $1.00 budget (the agent stopped for its budget by its own count")
    assert budget_text(_cost(task_budget_usd=None), "BUDGET_EXCEEDED") == ""


def _printed(fn: Any, doc: dict[str, Any]) -> str:
    out = io.StringIO()
    fn(Console(file=out, width=200), doc)
    return out.getvalue()


def test_manifest_tallies_and_violations_read_as_text() -> None:
    manifest = {
        "kind": "next_turn",
        "manifest_id": "next@9",
        "as_of_sequence_no": 9,
        "items": [],
        "total_tokens": 30,
        "stable_prefix_tokens": 10,
        "tokens_by_section": {"org_policy": 11, "recent_events": 19},
        "tokens_by_trust": {},
        "violations": [
            {
                "code": "UNTRUSTED_OUTSIDE_BOUNDARY",
                "item_index": 3,
                "source_entry_id": "e-7",
                "detail": "TOOL_OUTPUT_UNTRUSTED item in section None",
            }
        ],
        "dropped": [
            {
                "item_kind": "TOOL_RESULT",
                "source_entry_id": "e-5",
                "tool_call_id": "c-1",
                "tokens": 400,
                "reason": "over budget",
            }
        ],
    }
    text = _printed(print_manifest, manifest)
    assert "tokens by section: recent_events 19 · org_policy 11" in text
    assert "tokens by trust: -" in text
    assert "{" not in text and "None" not in text
    assert (
        "UNTRUSTED_OUTSIDE_BOUNDARY at item 3: TOOL_OUTPUT_UNTRUSTED item outside every section "
        "(source entry e-7)" in text
    )
    assert "TOOL_RESULT of c-1, 400 tokens: over budget" in text
    assert violation_text({"code": "X", "item_index": 0, "detail": "d"}) == "X at item 0: d"
    assert "more items, not listed" not in text
    listed = _printed(print_manifest, manifest | {"dropped_omitted": 1234, "dropped_tokens": 56789})
    assert "1,234 more items, not listed (56,789 tokens dropped in all)" in listed


def _memory(**view: Any) -> dict[str, Any]:
    state = {"run_id": "r-1", "fleet_id": "f", "snapshot_version": 2}
    return {"state": state} | view


def test_memory_at_a_sequence_says_where_it_last_changed() -> None:
    assert "through seq 2" in _printed(print_memory, _memory(seq=2, asked_seq=2))
    text = _printed(print_memory, _memory(seq=2, asked_seq=5))
    assert "as it stood after seq 5: last changed by seq 2" in text
    assert "through seq 7" in _printed(print_memory, _memory(applied_seq=7))


def test_a_runs_outcome_says_what_its_evaluation_said() -> None:
    from consumers.views import run_outcome

    assert run_outcome(None, None) == "running"
    assert run_outcome("SUBMITTED", "unevaluated") == "submitted, not evaluated yet"
    assert run_outcome("SUBMITTED", "none") == "submitted, evaluation passed"
    assert run_outcome("SUBMITTED", "verifier") == "submitted, evaluation failed (verifier)"
    assert run_outcome("STEP_LIMIT", "step-limit") == "step limit"
