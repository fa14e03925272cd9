"""Issue 26, "Unknown is never zero": every read command's text and ``--json`` over runs with
unknown figures (calls of unknown usage, an unpriced model, no provider-reported cost, a Codex
rollout without usage), beside a run whose figures are all known, on a real stack and worker.

A figure that is unknown must be null in JSON (or named in ``partly_unknown`` when the sum
covers only some calls) and "unknown"/"unpriced"/"-" or ">= ..." in text, never 0 or $0."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from consumers.views import live_states
from infra.settings import Settings
from schemas.factory import BASE_TIME, EntryBuilder, model_usage, sample_run
from schemas.json_form import to_json_text
from schemas.models import EntryKind, LedgerEntry, ModelUsagePart
from streams.deployment import PrivateDeployment
from tests.packs import SHARED

pytestmark = pytest.mark.integration

FLEET = "unknowns"
CODEX = (
    SHARED
    / "samples2"
    / "codex"
    / "codemie-rollout-2026-05-11T13-28-45-019e1695-0522-7c83-8b39-0dd379793f80.jsonl"
)
CODEX_RUN = "codex-019e1695-0522-7c83-8b39-0dd379793f80"
PROJECTIONS = (
    "run-stats",
    "cost-metrics",
    "diff-timelines",
    "failure-classifications",
    "working-memory",
    "context-manifests",
)
TOKENS = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens")
ZEROS = {"0", "$0", "$0.0000", "$0.00", "0.0", "0.0k"}


def _unmetered(response_id: str) -> ModelUsagePart:
    """A call whose log keeps no usage (as an OpenHands output with ``metrics: null``)."""
    return ModelUsagePart.model_validate(
        model_usage(response_id).model_dump()
        | {
            "model": "gpt-unmetered",
            "purpose": "unmetered-purpose",
            **dict.fromkeys(TOKENS, 0),
            "latency_ms": 0,
            "provider_reported_cost_usd": None,
            "raw_usage_json": "{}",
            "unknown_fields": (*TOKENS, "latency_ms"),
        }
    )


def _run(run_id: str, usages: list[ModelUsagePart], days: int = 0) -> list[LedgerEntry]:
    """sample_run's story with its model call's usage replaced (``days`` later)."""
    builder = EntryBuilder(run_id, fleet_id=FLEET, start=BASE_TIME + timedelta(days=days))
    entries = []
    for entry in sample_run(run_id):
        seq = entry.sequence_no
        update: dict[str, Any] = {
            "fleet_id": FLEET,
            "occurred_at": builder.time(seq),
        }
        if entry.kind is EntryKind.MODEL_CALL:
            update["parts"] = tuple(usages)
        entries.append(entry.model_copy(update=update))
    return entries


def _runs() -> dict[str, list[LedgerEntry]]:
    known = model_usage("known-resp")
    return {
        "unk-known": _run("unk-known", [known]),
        # every call of unknown usage, on a day of its own: every roll-up row of it is unknown
        "unk-unmetered": _run("unk-unmetered", [_unmetered("um-1"), _unmetered("um-2")], days=3),
        "unk-unpriced": _run(
            "unk-unpriced",
            [
                model_usage("up-1").model_copy(
                    update={
                        "provider": "acme-labs",
                        "model": "acme-private-1",
                        "provider_reported_cost_usd": None,
                    }
                )
            ],
        ),
        "unk-unreported": _run(
            "unk-unreported",
            [model_usage("ur-1").model_copy(update={"provider_reported_cost_usd": None})],
        ),
        "unk-mixed": _run("unk-mixed", [model_usage("mx-1"), _unmetered("mx-2")]),
        # a log that kept the call's input but lost its output: no cost, its input known
        "unk-partial": _run("unk-partial", [_output_lost("pt-1")]),
    }


def _output_lost(response_id: str) -> ModelUsagePart:
    return ModelUsagePart.model_validate(
        model_usage(response_id).model_dump()
        | {
            "output_tokens": 0,
            "reasoning_tokens": 0,
            "raw_usage_json": '{"input_tokens": 18420}',
            "unknown_fields": ("output_tokens", "reasoning_tokens"),
        }
    )


def _cli(d: PrivateDeployment, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "infra.main", *args],
        env={**d.env(), "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == code, f"{args}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
    return done


@pytest.fixture(scope="module")
def stack(
    services: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PrivateDeployment, dict[str, Any]]]:
    assert CODEX.is_file(), f"the sample is not at {CODEX}"
    tmp = tmp_path_factory.mktemp("unk")
    d = PrivateDeployment(services, "unk", [FLEET], tmp / "logs")
    asyncio.run(d.create())
    try:
        d.start_worker("unk-worker")
        d.wait_partitions("unk-worker")
        runs = _runs()
        path = tmp / "entries.jsonl"
        path.write_text("".join(to_json_text(e) + "\n" for r in runs.values() for e in r))
        _cli(d, "publish", str(path))
        imported = {
            "json": json.loads(_cli(d, "import", "codex", str(CODEX), "--json").stdout)[0],
            "text": _cli(d, "import", "codex", str(CODEX)).stdout,  # again: publishes nothing
        }
        expected = {r: len(e) for r, e in runs.items()}
        expected[CODEX_RUN] = imported["json"]["run_entries"][CODEX_RUN]
        deadline = time.monotonic() + 90
        while True:
            states = [live_states(d.settings, p, list(expected)) for p in PROJECTIONS]
            if all(
                s.get(r, {}).get("applied_seq") == n for s in states for r, n in expected.items()
            ):
                break
            assert time.monotonic() < deadline, "the worker did not apply every run in 90 s"
            time.sleep(0.5)
        yield d, {"imported": imported, "tmp": tmp}
    finally:
        d.drop()


UNKNOWN_COST = ("unk-unmetered", "unk-unpriced", "unk-partial")
UNKNOWN_TOKENS = ("unk-unmetered",)
UNKNOWN_REPORTED = ("unk-unmetered", "unk-unpriced", "unk-unreported")


def _check_json_row(row: dict[str, Any]) -> None:
    """A roll-up row (or a header): each figure null when unknown for all its calls, named in
    partly_unknown when unknown for some, never 0 in place of unknown."""
    calls, lower = row["calls"], set(row["partly_unknown"])
    if calls is None:  # a run whose log keeps no usage: how many calls, and every sum, unknown
        assert all(row[n] is None for n in ("cost_usd", *TOKENS, "provider_reported_cost_usd"))
        return
    blank = row["usage_unknown_calls"] - row["usage_partial_calls"]  # no count at all
    for names, unknown in (
        (["cost_usd"], row["unpriced_calls"] + row["usage_unknown_calls"]),
        (["input_tokens"], blank),
        (["cached_input_tokens"], max(blank, row["cached_unknown_calls"])),
        (["output_tokens"], max(blank, row["output_unknown_calls"])),
        (["reasoning_tokens"], max(blank, row["reasoning_unknown_calls"])),
        (["provider_reported_cost_usd"], calls - row.get("reported_calls", calls)),
    ):
        for name in names:
            if calls and unknown >= calls:
                assert row[name] is None, (name, row)
            elif unknown:
                assert name in lower, (name, row)


def test_costs_json_by_every_dimension(stack: Any) -> None:
    d, _ = stack
    for by in ("run", "fleet", "model", "purpose", "day"):
        doc = json.loads(_cli(d, "costs", "--by", by, "--fleet", FLEET, "--json").stdout)
        for row in [*doc["rows"], doc["total"]]:
            _check_json_row(row)
        total = doc["total"]  # known and unknown mixed: the known part is not the whole
        assert {"cost_usd", "input_tokens", "provider_reported_cost_usd"} <= set(
            total["partly_unknown"]
        ), total
        rows = {r["key"]: r for r in doc["rows"]}
        unmetered = {
            "run": "unk-unmetered",
            "fleet": None,
            "model": "openai/gpt-unmetered",
            "purpose": "unmetered-purpose",
            "day": (BASE_TIME + timedelta(days=3)).date().isoformat(),
        }[by]
        # the rollout without usage: whatever the dimension, the total leaves it out and says so
        assert total["runs_left_out"] == 1 and "calls" in total["partly_unknown"], total
        if by == "run":  # it is a row: its calls unknown, not absent, and no count of them 0
            assert rows[CODEX_RUN]["calls"] is None, rows[CODEX_RUN]
            assert rows[CODEX_RUN]["failed_calls"] is None, rows[CODEX_RUN]
            assert rows[CODEX_RUN]["cost_disagreements"] is None, rows[CODEX_RUN]
        if by == "fleet":  # its fleet's row is a lower bound too
            assert rows[FLEET]["runs_left_out"] == 1, rows[FLEET]
            assert {"calls", "failed_calls"} <= set(rows[FLEET]["partly_unknown"]), rows[FLEET]
        if unmetered is not None:
            row = rows[unmetered]
            assert row["calls"] == row["usage_unknown_calls"] >= 2, row
            assert row["cost_usd"] is None and row["provider_reported_cost_usd"] is None, row
            assert all(row[t] is None for t in TOKENS), row
    rows = {
        r["key"]: r
        for r in json.loads(_cli(d, "costs", "--by", "run", "--fleet", FLEET, "--json").stdout)[
            "rows"
        ]
    }
    assert rows["unk-known"]["cost_usd"] not in (None, "0")
    assert rows["unk-known"]["partly_unknown"] == []
    assert rows["unk-unpriced"]["cost_usd"] is None and rows["unk-unpriced"]["input_tokens"] > 0
    assert rows["unk-unreported"]["provider_reported_cost_usd"] is None
    assert rows["unk-unreported"]["cost_usd"] not in (None, "0")
    partial = rows["unk-partial"]  # (found trying the product: its input was unknown too)
    assert (partial["input_tokens"], partial["output_tokens"], partial["cost_usd"]) == (
        18420,
        None,
        None,
    ), partial
    assert (partial["usage_unknown_calls"], partial["usage_partial_calls"]) == (1, 1), partial
    mixed = rows["unk-mixed"]
    assert mixed["cost_usd"] is not None and "cost_usd" in mixed["partly_unknown"], mixed
    assert "input_tokens" in mixed["partly_unknown"], mixed


def _table(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """A rich table's header and rows by their first cell."""
    lines = [ln for ln in text.splitlines() if ln.startswith(("│", "┃"))]
    cells = [[c.strip() for c in ln.strip("│┃").split("│" if "│" in ln else "┃")] for ln in lines]
    return cells[0], {c[0]: c for c in cells[1:]}


def test_costs_text_by_every_dimension(stack: Any) -> None:
    d, _ = stack
    figures = ("in", "cached", "out", "cost", "reported")
    for by, key in (
        ("run", "unk-unmetered"),
        ("model", "openai/gpt-unmetered"),
        ("purpose", "unmetered-purpose"),
        ("day", (BASE_TIME + timedelta(days=3)).date().isoformat()),
        ("fleet", None),
    ):
        header, rows = _table(_cli(d, "costs", "--by", by, "--fleet", FLEET).stdout)
        col = {name: header.index(name) for name in figures}
        if key is not None:
            row = rows[key]
            for name in ("in", "cached", "out", "cost"):
                assert row[col[name]] == "unknown", (by, name, row)
            assert row[col["reported"]] == "-", (by, row)
        total = rows["total"]
        for name in figures:  # known and unknown mixed: a lower bound, said so
            assert total[col[name]].startswith(">= "), (by, name, total)
        # the total leaves out the rollout without usage: its calls are a lower bound too
        assert total[header.index("calls")].startswith(">= "), (by, total)
        if by == "run":
            assert rows[CODEX_RUN][header.index("calls")] == "unknown"
            assert rows["unk-unpriced"][col["cost"]] == "unpriced"
            assert rows["unk-unpriced"][col["reported"]] == "-"
            assert rows["unk-unreported"][col["reported"]] == "-"
            assert rows["unk-mixed"][col["cost"]].startswith(">= $")
            assert rows["unk-mixed"][col["in"]].startswith(">= ")
        # no unknown shown as a bare 0 (a known part of a mixed sum is ">= ..."; the known run's
        # own zeros, e.g. no cached tokens, are figures)
        for run, names in (
            ("total", figures),
            (key, figures),
            ("unk-mixed", figures),
            ("unk-unpriced", ("cost", "reported")),
            ("unk-unreported", ("reported",)),
        ):
            for name in names:
                if run in rows:
                    assert rows[run][col[name]] not in ZEROS, (by, run, name, rows[run])


def test_runs_text_and_json(stack: Any) -> None:
    d, _ = stack
    found = {r["run_id"]: r for r in json.loads(_cli(d, "runs", "--json").stdout)}
    for run in (*UNKNOWN_COST, CODEX_RUN):
        assert found[run]["cost_usd"] is None, found[run]
    # (found trying the product: the runs list gave the rollout without usage 0 calls)
    assert found[CODEX_RUN]["calls"] is None and found[CODEX_RUN]["unpriced_calls"] is None
    assert found["unk-known"]["calls"] > 0
    assert found["unk-known"]["cost_usd"] not in (None, 0, "0")
    assert found["unk-known"]["cost_partly_unknown"] is False
    assert found["unk-mixed"]["cost_partly_unknown"] is True
    header, rows = _table(_cli(d, "runs").stdout)
    cost = header.index("cost")
    assert rows["unk-unmetered"][cost] == "unknown"
    assert rows["unk-unpriced"][cost] == "unpriced"
    assert rows[CODEX_RUN][cost] == "unknown"
    assert rows["unk-mixed"][cost].startswith(">= $")
    for row in rows.values():
        assert not row[cost].startswith("$0.0000"), row
    # an unknown cost never passes --cost-above, however low
    above = json.loads(_cli(d, "runs", "--cost-above", "-1", "--json").stdout)
    assert {r["run_id"] for r in above} == {"unk-known", "unk-unreported", "unk-mixed"}


def test_timeline_text_and_json(stack: Any) -> None:
    d, _ = stack
    for run in ("unk-unmetered", "unk-unpriced", CODEX_RUN):
        doc = json.loads(_cli(d, "timeline", run, "--json").stdout)
        cost = doc["cost"]
        assert cost["cost_usd"] is None and cost["provider_reported_cost_usd"] is None, cost
        for row in doc["rows"]:
            assert row["cost_so_far_usd"] is None, row
            if row["kind"] == "model-call":
                assert row["cost_usd"] is None, row
        text = _cli(d, "timeline", run).stdout
        assert "$0.0000" not in text and "cost unknown" in text, text
        if run == CODEX_RUN:  # (found trying the product: its header said 0 calls)
            assert cost["calls"] is None, cost
            assert "model calls unknown" in text and " 0 calls" not in text
        else:
            _check_json_row(cost)
            assert "unknown so far" in text
    unmetered = json.loads(_cli(d, "timeline", "unk-unmetered", "--json").stdout)["cost"]
    assert all(unmetered[t] is None for t in TOKENS), unmetered
    assert (
        "tokens: unknown in (unknown cached), unknown out"
        in _cli(d, "timeline", "unk-unmetered").stdout
    )
    mixed = json.loads(_cli(d, "timeline", "unk-mixed", "--json").stdout)
    assert "cost_usd" in mixed["cost"]["partly_unknown"]
    assert mixed["rows"][-1]["cost_so_far_lower_bound"] is True
    assert ">= $" in _cli(d, "timeline", "unk-mixed").stdout
    reported = json.loads(_cli(d, "timeline", "unk-unreported", "--json").stdout)["cost"]
    assert reported["provider_reported_cost_usd"] is None and reported["cost_usd"] is not None
    assert "provider reported no cost" in _cli(d, "timeline", "unk-unreported").stdout


def test_subscribe_lines(stack: Any) -> None:
    d, _ = stack
    args = ("subscribe", "cost-metrics", "--from-beginning", "--fleet", FLEET, "--idle-exit", "3")
    lines = {
        line.split()[2]: line
        for line in _cli(d, *args).stdout.splitlines()
        if "cost-metrics" in line
    }
    for run in ("unk-unmetered", "unk-unpriced"):
        assert "cost unknown, " in lines[run] and "$0" not in lines[run], lines[run]
    assert "cost unknown, model calls unknown" in lines[CODEX_RUN]
    assert ">= $" in lines["unk-mixed"]
    docs = [json.loads(line) for line in _cli(d, *args, "--json").stdout.splitlines()]
    states = {doc["run_id"]: doc["state"] for doc in docs if doc.get("state")}
    # the state document itself keeps sums with their counts: unknown is counted, not summed
    assert states["unk-unmetered"]["totals"]["usage_unknown_calls"] == 2


def test_import_summary_of_a_rollout_without_usage(stack: Any) -> None:
    _, found = stack
    report = found["imported"]["json"]
    assert report["calls"] is None and report["cost_usd"] is None, report
    assert report["input_tokens"] is None and report["output_tokens"] is None, report
    assert report["provider_reported_cost_usd"] is None
    text = found["imported"]["text"]
    assert "model calls unknown" in text and "tokens unknown" in text and "cost unknown" in text
    assert " 0 model calls" not in text and "0 in / 0 out" not in text and "$0" not in text


def test_the_other_read_commands(stack: Any) -> None:
    d, found = stack
    for run in ("unk-unmetered", CODEX_RUN):
        for args in (
            ("failures", run),
            ("failures", run, "--json"),
            ("memory", run),
            ("memory", run, "--json"),
            ("context", run),
            ("context", run, "--json"),
        ):
            out = _cli(d, *args).stdout
            assert "$0" not in out and "cost_usd" not in out, (args, out[:500])
    assert "$0" not in _cli(d, "failures").stdout
    folder = found["tmp"] / "package"
    wrote = _cli(d, "replay-package", "unk-unmetered", "--out", str(folder)).stdout
    assert "wrote" in wrote and "$0" not in wrote
    views = json.loads(_cli(d, "replay-package", "load", str(folder)).stdout)["views"]
    totals = views["cost-metrics"]["totals"]
    # the projection's document as shown: unknown counted, and its sums null (never 0)
    assert totals["calls"] == totals["usage_unknown_calls"] == 2, totals
    assert totals["input_tokens"] is None and totals["cost_usd"] is None, totals


def test_an_unknown_fleet_is_an_error_naming_the_fleets_there_are(stack: Any) -> None:
    """Found trying the product: `runs --fleet nosuchfleet` printed an empty table and exited 0,
    as for a fleet without runs (the API answers 403)."""
    d, _ = stack
    for args in (
        ("runs", "--fleet", "nosuchfleet"),
        ("costs", "--fleet", "nosuchfleet", "--json"),
        ("failures", "--fleet", "nosuchfleet"),
        ("dlq", "list", "--fleet", "nosuchfleet"),
    ):
        done = _cli(d, *args, code=1)
        assert f"no fleet nosuchfleet (the fleets: {FLEET}" in done.stderr, (args, done.stderr)
    assert json.loads(_cli(d, "runs", "--fleet", FLEET, "--json").stdout)  # a known one reads
