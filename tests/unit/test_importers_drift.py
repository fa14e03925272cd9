"""Formats drift: fields renamed, moved, missing, null, of another type, extra, reordered. Every
importer, fed the packs' real records mutated that way, either maps what it can and counts the
rest as skipped with a reason, or says the file is not its format (ImportFormatError); it never
crashes (issue 26)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from schemas.models import ModelUsagePart
from streams.importers import FORMATS
from streams.importers.base import ImportFormatError
from tests.packs import SHARED

CASES = [
    ("mini-swe-agent", "samples2/mini-swe-agent/pr814-django__django-13660.traj.json"),
    ("mini-swe-agent", "samples/mini-swe-agent/pr814-django__django-11039.traj.json"),
    ("swe-agent", "samples2/swe-agent/swesmith-1.0.1-pandas-dev__pandas.95280573.pr_53856.traj"),
    ("swe-agent", "samples/swe-agent/swe-agent-pr843-commit0-97af1e.traj"),
    ("openhands", "samples2/openhands/pr1973-prontoqa-gpt-4o-v1.5-output.jsonl"),
    ("openhands", "samples2/openhands/benchmarks-pr90-openagentsafety-v1sdk-output.jsonl"),
    ("openhands", "samples/openhands/basic.json"),
    ("claude-code", "samples2/claude-code/codemie-v2.0.76-session-196820da.jsonl"),
    ("codex", "samples2/codex"),
    ("codex", "samples/codex"),
]
JUNK: list[Any] = [None, 0, -1, "", "x", [], {}, True, 1.5, {"a": 1}, [None], "\x00"]
MUTATIONS = 40


def _mutate(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict) and value:
        value = dict(value)
        key = rng.choice(list(value))
        op = rng.random()
        if op < 0.25:
            del value[key]  # missing
        elif op < 0.5:
            value[key] = rng.choice(JUNK)  # null, another type
        elif op < 0.6:
            value[key + "_v2"] = value.pop(key)  # renamed
        elif op < 0.7:
            value["added_in_a_later_version"] = rng.choice(JUNK)  # extra
        else:
            value[key] = _mutate(value[key], rng)
        return value
    if isinstance(value, list) and value:
        value = list(value)
        i = rng.randrange(len(value))
        op = rng.random()
        if op < 0.2:
            del value[i]
        elif op < 0.3:
            value[i] = rng.choice(JUNK)
        elif op < 0.4:
            rng.shuffle(value)  # reordered
        else:
            value[i] = _mutate(value[i], rng)
        return value
    return rng.choice(JUNK) if rng.random() < 0.5 else value


def _source(relative: str) -> Path:
    path = SHARED / relative
    if path.is_dir():
        return sorted(path.glob("*.jsonl"))[0]
    return path


@pytest.mark.parametrize(("fmt", "relative"), CASES)
def test_drifted_records_are_skipped_with_a_reason_never_a_crash(
    fmt: str, relative: str, tmp_path: Path
) -> None:
    source = _source(relative)
    text = source.read_text()
    jsonl = source.suffix == ".jsonl"
    imported = refused = 0
    for seed in range(MUTATIONS):
        rng = random.Random(seed)
        if jsonl:
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
            for _ in range(rng.randint(1, 5)):
                i = rng.randrange(len(lines))
                lines[i] = _mutate(lines[i], rng)
            drifted = "\n".join(json.dumps(line) for line in lines)
        else:
            doc = json.loads(text)
            listed = isinstance(doc, list)  # a list of events: the records themselves
            if listed:
                doc = {"events": doc}
            records = [k for k, v in doc.items() if isinstance(v, list) and v]
            for _ in range(rng.randint(1, 5)):
                if records and (listed or rng.random() < 0.7):  # a record: message, step, event
                    held = doc[rng.choice(records)]
                    i = rng.randrange(len(held))
                    held[i] = _mutate(held[i], rng)
                else:  # the document itself: a key missing, renamed, null, extra
                    doc = _mutate(doc, rng)
                    if not isinstance(doc, dict):
                        break
                    records = [k for k, v in doc.items() if isinstance(v, list) and v]
            whole = isinstance(doc, dict) and listed and "events" in doc
            drifted = json.dumps(doc["events"] if whole else doc)
        path = tmp_path / f"{seed}-{source.name}"
        path.write_text(drifted)
        try:
            runs, summary = FORMATS[fmt].import_file(path, "fleet-x")
        except ImportFormatError as exc:
            assert str(path) in str(exc)  # says which file and why
            refused += 1
            continue
        imported += 1
        for run in runs:  # what went in is valid, numbered without gaps
            assert [e.sequence_no for e in run.entries] == list(range(1, len(run.entries) + 1))
        assert all(isinstance(n, int) and n > 0 for n in summary.skipped.values())
    assert imported > refused  # most drifts still import: the importer bends


def _claude_lines() -> list[dict[str, Any]]:
    source = _source("samples2/claude-code/codemie-v2.0.76-session-196820da.jsonl")
    return [json.loads(line) for line in source.read_text().splitlines() if line.strip()]


def _import_claude(lines: list[dict[str, Any]], tmp_path: Path) -> Any:
    path = tmp_path / "drifted.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    [run], summary = FORMATS["claude-code"].import_file(path, "fleet-x")
    calls = [p for e in run.entries for p in e.parts if type(p).__name__ == "ModelUsagePart"]
    return calls, summary


def test_a_claude_code_usage_missing_a_count_leaves_it_unknown_never_zero(tmp_path: Path) -> None:
    """Found trying the product (2026-12-07): ``output_tokens`` renamed gave every call 0 output
    tokens and a cost shown as exact; a usage with no ``input_tokens`` gave 0 input. A count
    the usage does not hold is unknown (named in ``unknown_fields``)."""
    before, _ = _import_claude(_claude_lines(), tmp_path)
    lines = _claude_lines()
    for line in lines:
        usage = (line.get("message") or {}).get("usage")
        if isinstance(usage, dict):
            usage["output_tokenz"] = usage.pop("output_tokens", None)
            usage.pop("input_tokens", None)
    calls, summary = _import_claude(lines, tmp_path)
    assert len(calls) == len(before) == summary.calls > 0
    for call in calls:
        assert {"input_tokens", "output_tokens"} <= set(call.unknown_fields)


def test_claude_code_responses_without_usage_or_time_are_still_calls(tmp_path: Path) -> None:
    """A response whose lines keep no usage is a call of unknown usage, not no call; a message
    line with no timestamp is given the one before it, with a note, not dropped."""
    before, _ = _import_claude(_claude_lines(), tmp_path)
    lines = _claude_lines()
    for line in lines:
        message = line.get("message")
        if line.get("type") == "assistant" and isinstance(message, dict):
            message.pop("usage", None)
    calls, summary = _import_claude(lines, tmp_path)
    assert len(calls) == len(before) == summary.calls
    assert all("input_tokens" in c.unknown_fields for c in calls)
    lines = _claude_lines()
    first = next(i for i, line in enumerate(lines) if line.get("timestamp"))
    for line in lines[first + 1 :]:
        if line.get("type") in ("assistant", "user"):
            line.pop("timestamp", None)
    calls, summary = _import_claude(lines, tmp_path)
    assert len(calls) == len(before)
    assert any("had no timestamp" in note for note in summary.notes)


def test_a_line_with_bytes_that_are_not_utf8_is_read_not_dropped(tmp_path: Path) -> None:
    """Found trying the product: a few invalid bytes in one user message dropped the whole
    line ("not JSON"). The line is read with U+FFFD in their place, and the summary says so."""
    lines = _claude_lines()
    user = next(i for i, line in enumerate(lines) if line.get("type") == "user")
    raw = [json.dumps(line).encode() for line in lines]
    raw[user] = raw[user].replace(b'"content": "', b'"content": "\xff\xfe ', 1)
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b"\n".join(raw))
    before = _import_claude(_claude_lines(), tmp_path)[1].entries
    [run], summary = FORMATS["claude-code"].import_file(path, "fleet-x")
    assert len(run.entries) == before
    assert any("not UTF-8" in note for note in summary.notes)


def test_a_mini_swe_agent_response_without_usage_is_a_call_of_unknown_usage(
    tmp_path: Path,
) -> None:
    """Found trying the product: responses whose ``usage`` was removed were skipped as
    messages without a response, and the run showed no calls and 0 tokens."""
    source = _source("samples2/mini-swe-agent/pr814-django__django-13660.traj.json")
    doc = json.loads(source.read_text())
    for message in doc["messages"]:
        response = (message.get("extra") or {}).get("response")
        if isinstance(response, dict):
            response.pop("usage", None)
    path = tmp_path / "nousage.traj.json"
    path.write_text(json.dumps(doc))
    [run], summary = FORMATS["mini-swe-agent"].import_file(path, "fleet-x")
    calls = [p for e in run.entries for p in e.parts if isinstance(p, ModelUsagePart)]
    assert summary.calls == len(calls) == 46  # the sample's responses
    assert all("input_tokens" in c.unknown_fields for c in calls)


def test_a_codex_token_count_missing_a_count_leaves_it_unknown(tmp_path: Path) -> None:
    """Found trying the product: ``output_tokens`` renamed in a rollout's token counts broke
    every call ("line breaking the ledger contract at reasoning_tokens"), and the run showed
    0 in / 0 out. The calls stay, that count unknown."""
    [source] = (SHARED / "samples/codex").glob("localpush-rollout-2026-02-23T20-34-25-*.jsonl")
    lines = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    for line in lines:
        info = (line.get("payload") or {}).get("info")
        if isinstance(info, dict) and isinstance(info.get("total_token_usage"), dict):
            usage = info["total_token_usage"]
            usage["output_tokenz"] = usage.pop("output_tokens", None)
    path = tmp_path / "rollout.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    [run], summary = FORMATS["codex"].import_file(path, "fleet-x")
    calls = [p for e in run.entries for p in e.parts if isinstance(p, ModelUsagePart)]
    assert summary.calls == len(calls) == 6  # as the sample's README counts them
    assert not any("ledger contract" in why for why in summary.skipped)
    assert all("output_tokens" in c.unknown_fields and c.input_tokens > 0 for c in calls)


def test_a_rollout_whose_token_counts_hold_no_usage_has_its_calls_unknown(tmp_path: Path) -> None:
    """The review found it: token_count events that all hold ``info: null`` made a rollout
    count as metered with 0 calls; it is a rollout without usage (calls unknown)."""
    from projectors.cost_metrics import CALLS_KEY, CALLS_UNKNOWN

    [source] = (SHARED / "samples/codex").glob("localpush-rollout-2026-02-23T20-34-25-*.jsonl")
    lines = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    for line in lines:
        if (line.get("payload") or {}).get("type") == "token_count":
            line["payload"]["info"] = None
    path = tmp_path / "rollout.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    [run], summary = FORMATS["codex"].import_file(path, "fleet-x")
    assert summary.calls_known is False and summary.calls == 0
    assert run.entries[0].metadata[CALLS_KEY] == CALLS_UNKNOWN


def test_a_session_written_twice_counts_each_line_once_and_is_no_failure(tmp_path: Path) -> None:
    """Found trying the product: a Claude Code session with every line written twice gave the
    right figures but '213 lines the importer cannot map (ValueError)' and exit 1. A line the
    same as an earlier one is a repeat, skipped and counted as such; another record under an
    id already used is still a record that could not be mapped."""
    [source] = sorted((SHARED / "samples2/claude-code").rglob("*.jsonl"))[:1]
    lines = source.read_bytes().splitlines(keepends=True)
    doubled = tmp_path / source.name
    doubled.write_bytes(b"".join(line + line for line in lines))
    importer = FORMATS["claude-code"]
    [once], first = importer.import_file(source, "f")
    [twice], second = importer.import_file(doubled, "f")
    assert second.unmapped == 0 and first.unmapped == 0
    assert (second.calls, second.input_tokens, second.output_tokens) == (
        first.calls,
        first.input_tokens,
        first.output_tokens,
    )
    assert [e.entry_id for e in twice.entries] == [e.entry_id for e in once.entries]
    assert sum(n for why, n in second.skipped.items() if why.startswith("repeated")) > 0
    # a different line under a used id: the first kept, the second counted as not mapped
    docs = [json.loads(line) for line in lines if line.strip()]
    with_id = next(d for d in docs if d.get("type") == "user" and d.get("uuid"))
    other = dict(with_id, message={"role": "user", "content": "another text"})
    changed = tmp_path / "changed.jsonl"
    changed.write_bytes(source.read_bytes() + json.dumps(other).encode() + b"\n")
    _, third = importer.import_file(changed, "f")
    assert third.unmapped == 1
