"""Untrusted text that made a pure function take time faster than its length grows: each case
fixed at its cause, and held here by counted work (regex backtracking points, characters
scanned, calls), never by timing, with the old behaviour kept as the reference result."""

from __future__ import annotations

import base64
import io
import json
import random
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from rich.text import Text

from consumers.render import print_memory
from consumers.web import app as web_app
from infra.cli_support import SafeConsole
from infra.settings import Settings
from projectors import context_manifests, working_memory
from projectors.context_manifests import _key_lines
from projectors.working_memory import WorkingMemoryProjection
from schemas.errors import BadArgumentError
from schemas.factory import EntryBuilder, verification
from schemas.models import (
    DiffFile,
    EntryKind,
    FileChangeStatus,
    FileClassification,
    VerificationStatus,
)
from streams import otlp, publish_file
from streams.importers import claude_code, codex, openhands, otel, swe_agent
from streams.importers.base import ImportFormatError
from streams.importers.detect import detect
from streams.importers.otel import Span, TraceBook, runs_from_spans
from streams.importers.swe_agent import _text_action
from streams.importers.verdicts import read_report
from streams.otlp import Receiver, app
from tests.packs import SAMPLES
from tests.unit.regex_work import CountingSearch, backtracking_repeats, patterns_used

# --- the tool output's key lines (context_manifests) ---------------------------------------

# The regex _key_lines used before (its results are the reference).
_OLD_KEY_LINE = re.compile(
    r"^.*(?:Error|Exception|Traceback|FAILED|FAIL\b|Failed|failed|assert|panic|fatal|"
    r"error\b|expected .* got).*$",
    re.MULTILINE,
)


def _old_key_lines(text: str, keep: int = 3) -> tuple[str, ...]:
    found = [m.group(0).strip()[:300] for m in _OLD_KEY_LINE.finditer(text[-200_000:])]
    return tuple(dict.fromkeys(line for line in found if line))[-keep:]


def test_key_lines_run_no_backtracking_regex() -> None:
    # ^.*(…|expected .* got).*$ scanned the rest of a line again for each "expected " on it:
    # 200,000 characters of "expected expected …" took 3 s of a worker's fold, per entry.
    used = patterns_used(_key_lines)
    assert used, "no regex found: the test no longer sees what _key_lines runs"
    assert {name: backtracking_repeats(p) for name, p in used.items()} == dict.fromkeys(used, 0)


@pytest.mark.parametrize(
    "unit", ["expected ", "expected x got y Error ", "Error\n", "\n", "x FAIL", "expected\n"]
)
def test_key_lines_scan_each_character_a_bounded_number_of_times(
    unit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = CountingSearch(context_manifests._KEY_WORD)
    monkeypatch.setattr(context_manifests, "_KEY_WORD", counted)
    text = unit * (20_000 // len(unit))
    assert _key_lines(text) == _old_key_lines(text)
    assert counted.scanned <= len(text) + 1


def test_key_lines_give_what_the_old_regex_gave() -> None:
    rnd = random.Random(7)
    pieces = [
        *("Error", "error", "errors", "error_", "FAIL", "FAILED", "FAILé", "Traceback"),
        *("expected ", " got", "got", "assert", "panic", "\n", "\r", "\t", " ", "x", "é"),
    ]
    for _ in range(20_000):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 16)))
        for keep in (1, 3, 10):
            assert _key_lines(text, keep) == _old_key_lines(text, keep), repr(text)
    long = ("x" * 400 + " Error\n") * 600 + "expected 10 got 9\n"
    assert _key_lines(long) == _old_key_lines(long)


# --- mini-swe-agent 1.x's bash block (importer) ---------------------------------------------

_OLD_BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)


class _Run:
    def __init__(self) -> None:
        self.commands: list[str] = []

    def request(self, *args: object) -> None:
        arguments = args[-1]
        assert isinstance(arguments, dict)
        self.commands.append(arguments["command"])


def _command(text: str) -> str | None:
    run = _Run()
    call_id = _text_action(run, text, None, 1)  # type: ignore[arg-type]
    return run.commands[0] if call_id is not None else None


def test_bash_block_runs_no_backtracking_regex() -> None:
    # r"```bash\s*\n(.*?)\n```" retried its lazy body from every unclosed fence, and from every
    # newline after one: 100,000 characters of "```bash\nx " took 11 s to import, a fence
    # then 50,000 newlines 13 s.
    used = patterns_used(_text_action)
    assert {name: backtracking_repeats(p) for name, p in used.items()} == dict.fromkeys(used, 0)
    assert "_BASH_BLOCK" not in vars(swe_agent)


def test_bash_block_gives_what_the_old_regex_gave() -> None:
    rnd = random.Random(11)
    pieces = ["```bash", "```", "\n", " ", "\t", "x", "bash", "`", "\n```", "\u2028", "\x0b"]
    for _ in range(50_000):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 12)))
        old = _OLD_BASH_BLOCK.search(text)
        assert _command(text) == (old[1] if old else None), repr(text)
    assert _command("think\n```bash\nls -la\n```\n") == "ls -la"
    assert _command("```bash\n\n```") == ""  # the whitespace's last newline opens the close
    assert _command("```bash\nx " * 1000) is None


# --- OpenTelemetry spans: the receiver's book (importer and `agentledger otlp`) --------------


class _CountingParents(dict[str, str]):
    """A span's parents, counting the look-ups made in them."""

    looked_up = 0

    def get(self, key: str, default: Any = None) -> Any:
        _CountingParents.looked_up += 1
        return super().get(key, default)


def _span(i: int, parent: int | None, usage: bool, trace: int = 1) -> Span:
    return Span(
        trace_id=f"{trace:032x}",
        span_id=f"{i:016x}",
        parent_span_id=None if parent is None else f"{parent:016x}",
        name="chat",
        start_ns=1_788_787_518_970_589_000 + i,
        end_ns=1_788_787_518_970_589_001 + i,
        attributes={"gen_ai.usage.input_tokens": 5} if usage else {},
        error=False,
    )


def _look_ups(exports: int) -> int:
    book = TraceBook(parents=_CountingParents())
    _CountingParents.looked_up = 0
    for i in range(exports):  # one span an export (a SimpleSpanProcessor), each of its trace
        runs_from_spans([_span(i, 10**9 + i, usage=True, trace=i)], "fleet-01", book)
    return _CountingParents.looked_up


def test_an_export_costs_its_own_spans_not_every_span_seen_before() -> None:
    # Each export walked up from every span with usage the receiver had ever seen: 16,000
    # exports of one span took 35 s, the last ones 4 ms each and growing.
    counts = [_look_ups(500), _look_ups(1_000)]
    assert counts[1] <= 2 * counts[0] + 10, counts


def _walked_up(parents: dict[str, str], with_usage: set[str], hops: int) -> set[str]:
    """The spans with usage below them as runs_from_spans found them before: walking up."""
    out = set()
    for span_id in with_usage:
        parent, walked = parents.get(span_id), 0
        while parent is not None and walked < hops:
            out.add(parent)
            parent, walked = parents.get(parent), walked + 1
    return out


@pytest.mark.parametrize("hops", [1, 3, 1000])  # (1000: USAGE_HOPS)
def test_usage_below_is_what_walking_up_found(hops: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otel, "USAGE_HOPS", hops)
    rnd = random.Random(hops)
    for _ in range(1_500):
        n = rnd.randint(1, 24)  # parents drawn at random: chains, trees, loops, unknown ones
        spans = [
            _span(i, rnd.randrange(n + 3) if rnd.random() < 0.8 else None, rnd.random() < 0.3)
            for i in range(n)
        ]
        rnd.shuffle(spans)
        book, parents, with_usage = TraceBook(), {}, set()
        while spans:
            cut = rnd.randint(1, 5)
            batch, spans = spans[:cut], spans[cut:]
            book.learn(batch)
            for s in batch:
                if s.parent_span_id:
                    parents[s.span_id] = s.parent_span_id
                if otel.has_usage(s):
                    with_usage.add(s.span_id)
            assert set(book.usage_below) == _walked_up(parents, with_usage, hops)


async def test_the_receiver_copies_nothing_it_saw_before_per_export(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copied = [0]

    def counting_set(items: Any = ()) -> set[Any]:
        made = set(items)
        copied[0] += len(made)
        return made

    monkeypatch.setattr(otlp, "set", counting_set, raising=False)
    receiver = Receiver(Settings(), "fleet-01")
    receiver.publisher = _Publisher()  # type: ignore[assignment]
    receiver.fleets = _Fleets()  # type: ignore[assignment]
    receiver.book.done.update(f"{i:016x}" for i in range(10_000))  # spans of earlier exports
    body = json.dumps(
        {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {"spans": [_otlp_json(_span(10**6 + i, None, True)) for i in range(3)]}
                    ]
                }
            ]
        }
    ).encode()
    async with TestClient(TestServer(app(receiver))) as client:
        answer = await client.post(
            "/v1/traces", data=body, headers={"Content-Type": "application/json"}
        )
        assert answer.status == 200
    assert copied[0] <= 3 * 3, copied  # (a few sets of the export's own spans; 10,000 before)


def _otlp_json(s: Span) -> dict[str, Any]:
    return {
        "traceId": s.trace_id,
        "spanId": s.span_id,
        "name": s.name,
        "startTimeUnixNano": str(s.start_ns),
        "endTimeUnixNano": str(s.end_ns),
        "attributes": [{"key": k, "value": {"intValue": str(v)}} for k, v in s.attributes.items()],
    }


class _Publisher:
    def __init__(self) -> None:
        self.book = SimpleNamespace(last={})

    async def resume(self, runs: object) -> None:
        return None

    async def publish_batch(self, entries: list[Any]) -> list[Any]:
        return entries


class _Fleets:
    unanswered = False

    def elsewhere(self, runs: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
        return []

    def close(self) -> None:
        return None


# --- the command line's console (rich) ------------------------------------------------------


def test_the_console_runs_no_backtracking_regex_over_untrusted_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # rich's repr highlighter ran [\w.]*?\( (and more) over every printed text: `memory` with a
    # task goal of one 20,000-character word took 3.1 s, one word of 50,000 characters 30 s.
    searched: dict[str, int] = {}
    highlight_regex = Text.highlight_regex

    def counting(text: Text, re_highlight: Any, *args: Any, **kwargs: Any) -> int:
        pattern = re_highlight if isinstance(re_highlight, re.Pattern) else re.compile(re_highlight)
        if backtracking_repeats(pattern):
            searched[pattern.pattern[:40]] = searched.get(pattern.pattern[:40], 0) + len(text)
        result: int = highlight_regex(text, re_highlight, *args, **kwargs)
        return result

    monkeypatch.setattr(Text, "highlight_regex", counting)
    out = io.StringIO()
    console = SafeConsole(file=out, force_terminal=True, color_system="standard", width=120)
    goal = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkw" * 20
    state = {"run_id": "run-1", "fleet_id": "fleet-01", "snapshot_version": 1, "task_goal": goal}
    print_memory(console, {"state": state, "applied_seq": 3})
    console.print(f"note: {goal} (1.5, 'x', None)")
    assert searched == {}
    shown = out.getvalue()
    assert goal in shown.replace("\n", "") and "\x1b[1m" in shown  # (its own styles stay)


# --- working memory: a run of many distinct checks -------------------------------------------


class _CountingTokens:
    """working_memory's token regex, counting the texts it tokenizes."""

    def __init__(self, regex: re.Pattern[str]) -> None:
        self.regex = regex
        self.texts = 0

    def findall(self, text: str) -> list[str]:
        self.texts += 1
        return self.regex.findall(text)


def _tokenized(checks: int, monkeypatch: pytest.MonkeyPatch) -> int:
    getattr(working_memory, "_NORMALIZED", {}).clear()
    counting = _CountingTokens(working_memory._TOKEN)
    monkeypatch.setattr(working_memory, "_TOKEN", counting)
    b = EntryBuilder()
    b.add(EntryKind.RUN_STARTED)
    for i in range(checks):  # a verifier reporting each test case: a fact each
        part = verification(VerificationStatus.PASSED)
        b.add(EntryKind.VERIFIER_RESULT, (part.model_copy(update={"check_id": f"t.py::test_{i}"}),))
    projection = WorkingMemoryProjection()
    state = projection.initial(b.entries[0])
    for entry in b.entries:
        state = projection.fold(state, entry)
    assert len(state.known_facts) == checks
    monkeypatch.undo()
    return counting.texts


def test_working_memory_tokenizes_each_fact_once_not_once_per_new_fact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each new fact was compared with every fact by tokenizing both again: 1,000/2,000/4,000
    # distinct passing checks folded in 4.1/11.7/36 s.
    counts = [_tokenized(200, monkeypatch), _tokenized(400, monkeypatch)]
    assert counts[1] <= 2 * counts[0] + 10, counts


def _fact_work(checks: int, flaky: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """(facts asked whether they are about a new fact's keys, fact indexes made) folding
    ``checks`` distinct passing checks (a fact each); with ``flaky``, each followed by a flaky
    check's result, passing and failing in turn (a fact made and superseded, and past
    KEEP_RETIRED the oldest superseded retired, on every other entry)."""
    asked = made = 0
    concerns, index_init = working_memory._concerns, working_memory._FactIndex.__init__

    def counted(key: str, keys: set[str]) -> bool:
        nonlocal asked
        asked += 1
        return concerns(key, keys)

    def counted_init(self: Any, facts: Any) -> None:
        nonlocal made
        made += 1
        index_init(self, facts)

    monkeypatch.setattr(working_memory, "_concerns", counted)
    monkeypatch.setattr(working_memory._FactIndex, "__init__", counted_init)
    working_memory._FactIndex._KEPT.clear()
    b = EntryBuilder()
    b.add(EntryKind.RUN_STARTED)
    for i in range(checks):
        part = verification(VerificationStatus.PASSED)
        b.add(EntryKind.VERIFIER_RESULT, (part.model_copy(update={"check_id": f"t.py::test_{i}"}),))
        if flaky:
            status = VerificationStatus.PASSED if i % 2 == 0 else VerificationStatus.FAILED
            part = verification(status).model_copy(update={"check_id": "t.py::flaky"})
            b.add(EntryKind.VERIFIER_RESULT, (part,))
    projection = WorkingMemoryProjection()
    state = projection.initial(b.entries[0])
    for entry in b.entries:
        state = projection.fold(state, entry)
    assert len(state.active_facts()) >= checks
    if flaky:
        assert state.facts_retired > checks // 3  # the trimming path was taken
    monkeypatch.undo()
    return asked, made


@pytest.mark.parametrize("flaky", [False, True])
def test_a_new_fact_looks_only_at_the_facts_about_it(
    flaky: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each new fact asked of every fact of the memory whether it was about it: 4,000
    # distinct passing checks folded in 6.5 s (0.15 s now); an index of the active facts by
    # text, key and key word is handed from each fact tuple to the next, retiring included
    # (made anew on each step, it was slower than no index once facts retired).
    (asked, made), (asked2, made2) = (_fact_work(n, flaky, monkeypatch) for n in (200, 400))
    assert made <= 2 and made2 <= 2, (made, made2)  # one per fold from scratch, not per fact
    assert asked2 <= 2 * asked + 10, (asked, asked2)  # what each new fact is about, no more
    if not flaky:
        assert asked == asked2 == 0


def test_fact_ids_are_never_given_twice_once_retired_facts_leave() -> None:
    """A check passing and failing in turn makes a fact and supersedes it each time; past
    KEEP_RETIRED the oldest superseded leave the memory, and the next fact's id was counted
    from what was left (``fact-10`` given twice)."""
    b = EntryBuilder()
    b.add(EntryKind.RUN_STARTED)
    for status in [VerificationStatus.PASSED, VerificationStatus.FAILED] * 12:
        part = verification(status)
        b.add(EntryKind.VERIFIER_RESULT, (part.model_copy(update={"check_id": "t.py::test_x"}),))
        other = verification(VerificationStatus.PASSED)
        b.add(EntryKind.VERIFIER_RESULT, (other.model_copy(update={"check_id": "t.py::test_y"}),))
    projection = WorkingMemoryProjection()
    state = projection.initial(b.entries[0])
    for entry in b.entries:
        state = projection.fold(state, entry)
        ids = [f.fact_id for f in state.known_facts]
        assert len(ids) == len(set(ids)), ids
    assert state.facts_retired > 0
    assert [f.fact.split(" (")[0] for f in state.active_facts()] == ["t.py::test_y"]


# --- JSON nested past Python's recursion limit: a clear answer, never a RecursionError --------

CODEX_SAMPLE = (
    SAMPLES
    / "codex"
    / ("localpush-rollout-2026-02-23T20-34-25-019c8bfe-ec25-79e0-97d7-bda6a9c575ff.jsonl")
)
DEEP = "[" * 100_000 + "]" * 100_000


def test_a_codex_tool_output_of_deep_json_is_kept_as_text(tmp_path: Path) -> None:
    # The output text is parsed when it starts with "{" (Codex CLI's JSON outputs): a hostile
    # tool output nested past the recursion limit crashed the whole rollout's import.
    lines = []
    for line in CODEX_SAMPLE.read_text().splitlines():
        doc = json.loads(line)
        if doc.get("payload", {}).get("type") == "function_call_output":
            doc["payload"]["output"] = '{"a":' * 100_000 + "1" + "}" * 100_000
        lines.append(json.dumps(doc))
    rollout = tmp_path / "rollout-deep.jsonl"
    rollout.write_text("\n".join(lines) + "\n")
    runs, _ = codex.import_file(rollout, "fleet-01")
    assert runs and runs[0].entries


def test_deep_json_files_are_not_json_to_every_reader(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    with pytest.raises(ImportFormatError):
        openhands.import_file(deep, "fleet-01")
    with pytest.raises(ImportFormatError):
        read_report(deep)
    assert detect(deep) is None
    first = tmp_path / "first.jsonl"
    first.write_text(DEEP + '\n{"a": 1}\n')
    assert detect(first) is None
    session = tmp_path / "session"
    (session / "events").mkdir(parents=True)
    (session / "metadata.json").write_text("{}")
    (session / "events" / "0.json").write_text(DEEP)
    with pytest.raises(ImportFormatError):
        openhands._session_events(session)
    follow = tmp_path / "session.jsonl"
    follow.write_text('{"type": "user"}\n' + DEEP + "\n")
    assert claude_code.still_streaming(follow) is False
    assert swe_agent._swe_model({"replay_config": DEEP}) is None
    assert publish_file._run_of(DEEP.encode()) is None


def test_a_deep_cursor_is_refused_as_a_cursor() -> None:
    cursor = base64.urlsafe_b64encode(DEEP.encode()).decode()
    with pytest.raises(BadArgumentError):
        web_app.run_cursor_key("cost", cursor)
    with pytest.raises(web_app.HttpError):
        web_app._offset(cursor)


class _Compared(str):
    """A path that counts the comparisons made of it (sorting, binary search)."""

    made = 0

    def __lt__(self, other: str) -> bool:
        _Compared.made += 1
        return str.__lt__(self, other)


def _file(path: str, status: FileChangeStatus, old_path: str | None = None) -> DiffFile:
    """A diff's file of one line added."""
    return DiffFile(
        path=path,
        status=status,
        lines_added=1,
        lines_deleted=0,
        classification=FileClassification.SOURCE,
        old_path=old_path,
    )


def _old_files(changed: set[str], created: set[str], file: Any) -> None:
    """The rule as it was (sets, sorted again after every diff): the reference result."""
    status = file.status.value

    def removed(path: str) -> bool:
        if path in created:
            created.discard(path)
            changed.discard(path)
            return True
        changed.add(path)
        return False

    if status == "RENAMED" and file.old_path:
        if removed(file.old_path):
            created.add(file.path)
        changed.add(file.path)
    elif status == "DELETED":
        removed(file.path)
    else:
        if status == "ADDED" and file.path not in changed:
            created.add(file.path)
        changed.add(file.path)


def test_a_diff_merges_its_files_into_the_run_s_sorted_lists_not_sorts_them_again() -> None:
    """A run that creates thousands of files one diff at a time: each diff's few files are
    merged into the run's sorted changed/created lists (one linear pass), where all of them
    were put in a set and sorted again each diff (4,000 files: 2.7 s of working-memory fold,
    now 0.2 s; 4.7x the time of 2,000 before). Counted: the comparisons one diff costs on a
    run of 4,096 files stay linear (~3 per file), where sorting them was ~12 per file."""
    paths = tuple(sorted(_Compared(f"src/gen/module_{i:05d}.py") for i in range(0, 8192, 2)))
    edit = working_memory._SortedEdit(paths)
    edit.add(_Compared("src/gen/module_00101.py"))
    _Compared.made = 0
    merged = edit.result()
    assert _Compared.made <= 3 * len(paths)
    assert merged == tuple(sorted({*paths, "src/gen/module_00101.py"}))
    _Compared.made = 0
    assert tuple(sorted(set(paths) | {"src/gen/module_00101.py"})) == merged
    assert _Compared.made > 6 * len(paths)  # (what sorting them again costs)
    unchanged = working_memory._SortedEdit(paths)
    unchanged.add(paths[7])
    unchanged.discard("not/there.py")
    assert unchanged.result() is paths  # nothing changed: the same tuple


@pytest.mark.parametrize("seed", range(6))
def test_changed_and_created_files_are_what_the_old_rule_gave(seed: int) -> None:
    """Random diffs (added, modified, deleted, renamed; paths reused) folded by the working
    memory give the changed and created files the set-and-sort rule gave, after every entry."""
    from schemas.factory import diff

    rng = random.Random(seed)
    # a small pool and up to 6 files a diff: a path added and removed in one diff is common
    pool = [f"p/{rng.randrange(10**6):06d}/é.py" for _ in range(10)]
    base = diff(False)
    builder = EntryBuilder()
    builder.add(EntryKind.RUN_STARTED)
    changed: set[str] = set()
    created: set[str] = set()
    expected: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for _ in range(120):
        files = []
        for _ in range(rng.randint(1, 6)):
            status = rng.choice(list(FileChangeStatus))
            path, old = rng.choice(pool), rng.choice(pool)
            renamed = status is FileChangeStatus.RENAMED
            files.append(_file(path, status, old if renamed else None))
        builder.add(EntryKind.DIFF_OBSERVATION, (base.model_copy(update={"files": tuple(files)}),))
        for file in files:
            _old_files(changed, created, file)
        expected.append((tuple(sorted(changed)), tuple(sorted(created))))
    projection = WorkingMemoryProjection()
    state = projection.initial(builder.entries[0])
    state = projection.fold(state, builder.entries[0])
    for entry, (want_changed, want_created) in zip(builder.entries[1:], expected, strict=True):
        state = projection.fold(state, entry)
        assert state.index.changed_files == want_changed
        assert state.changed_files == want_changed  # (at most 10 files: the memory lists all)
        assert state.changed_files_total == len(want_changed)
        assert state.index.created_files == want_created
    # a file created and removed in the same diff leaves no change (the reviewer's case)
    made_and_gone = tuple(
        _file("new.py", status) for status in (FileChangeStatus.ADDED, FileChangeStatus.DELETED)
    )
    fresh = EntryBuilder()
    fresh.add(EntryKind.RUN_STARTED)
    fresh.add(EntryKind.DIFF_OBSERVATION, (base.model_copy(update={"files": made_and_gone}),))
    state = projection.initial(fresh.entries[0])
    for entry in fresh.entries:
        state = projection.fold(state, entry)
    assert state.changed_files == () and state.index.created_files == ()
    assert state.changed_files_total == 0 and state.index.changed_files == ()


@pytest.mark.parametrize("seed", range(2))
def test_a_run_changing_thousands_of_files_keeps_a_bounded_memory(seed: int) -> None:
    """A run changing 1,500 files (random statuses, paths reused, the run's own files deleted
    again): the memory lists the CHANGED_FILES_SHOWN changed last (sorted), counts them all,
    and its index lists them all, as the set-and-sort rule gave; each snapshot row stays
    small (before working-memory 9 each held every path: 1,000 files made 13.9 MB of rows)."""
    from schemas.factory import diff

    rng = random.Random(seed)
    shown = working_memory.CHANGED_FILES_SHOWN
    pool = [f"src/pkg_{i // 50}/module_{i:05d}.py" for i in range(1_500)]
    base = diff(False)
    builder = EntryBuilder()
    builder.add(EntryKind.RUN_STARTED)
    changed: set[str] = set()
    created: set[str] = set()
    last_change: dict[str, int] = {}  # path -> the diff that changed it last
    expected = []
    for n in range(900):
        files = []
        for _ in range(rng.randint(1, 4)):
            status = rng.choices(list(FileChangeStatus), weights=(6, 3, 1, 1, 1))[0]
            path = pool[min(len(pool) - 1, int(rng.expovariate(1 / 700)))]
            renamed = status is FileChangeStatus.RENAMED
            files.append(_file(path, status, rng.choice(pool) if renamed else None))
        builder.add(EntryKind.DIFF_OBSERVATION, (base.model_copy(update={"files": tuple(files)}),))
        for file in files:
            _old_files(changed, created, file)
            for touched in (file.old_path, file.path):
                if touched is not None:
                    last_change[touched] = n
        expected.append((tuple(sorted(changed)), dict(last_change)))
    projection = WorkingMemoryProjection()
    state = projection.initial(builder.entries[0])
    state = projection.fold(state, builder.entries[0])
    largest = 0
    for entry, (want_all, last) in zip(builder.entries[1:], expected, strict=True):
        before, state = state, projection.fold(state, entry)
        assert state.index.changed_files == want_all
        assert state.changed_files_total == len(want_all)
        if state.changed_files_total != before.changed_files_total:  # a new snapshot version
            assert state.snapshot_version == before.snapshot_version + 1
        if len(want_all) <= shown:
            assert state.changed_files == want_all
        else:  # the newest by their last change, sorted by path; at least half of them (a
            # file the run created and deleted again leaves a place, filled at half)
            listed = state.changed_files
            assert listed == tuple(sorted(listed)) and shown // 2 <= len(listed) <= shown
            unlisted = set(want_all) - set(listed)
            assert min(last[p] for p in listed) >= max(last[p] for p in unlisted)
        for row in projection.history(before, state, entry):
            largest = max(largest, len(json.dumps(row.doc)))
    assert len(expected[-1][0]) > 5 * shown  # (the run did change far more than are listed)
    assert largest < 16_000


def test_a_memory_whose_listed_files_were_deleted_lists_the_newest_others() -> None:
    """150 files changed, then 100 created and deleted again (the review's case): the memory
    listed none of the 150 it counted; the newest of them fill the list again."""
    from schemas.factory import diff

    def changed(path: str, status: FileChangeStatus) -> tuple[Any, ...]:
        return (diff(False).model_copy(update={"files": (_file(path, status),)}),)

    builder = EntryBuilder()
    builder.add(EntryKind.RUN_STARTED)
    kept = [f"src/kept_{i:03d}.py" for i in range(150)]
    scratch = [f"tmp/scratch_{i:03d}.py" for i in range(100)]
    for path in kept:
        builder.add(EntryKind.DIFF_OBSERVATION, changed(path, FileChangeStatus.MODIFIED))
    for path in scratch:
        builder.add(EntryKind.DIFF_OBSERVATION, changed(path, FileChangeStatus.ADDED))
    for path in scratch:
        builder.add(EntryKind.DIFF_OBSERVATION, changed(path, FileChangeStatus.DELETED))
    projection = WorkingMemoryProjection()
    state = projection.initial(builder.entries[0])
    lengths = []
    for entry in builder.entries:
        state = projection.fold(state, entry)
        lengths.append(len(state.changed_files))
    assert state.changed_files_total == 150 and state.index.changed_files == tuple(kept)
    assert min(lengths[250:]) >= 50  # never fewer than half while it deleted
    assert state.changed_files[-1] == kept[-1] and set(state.changed_files) <= set(kept[50:])
    assert len(state.changed_files) >= 50


def _old_memory_text(head: str, lines: list[tuple[str, str]], limit: int) -> str:
    """memory_text's dropping as it was (its code before, none of today's helpers): one line
    removed, the whole text joined again."""
    omitted_names = context_manifests._OMITTED
    parts = context_manifests._MEMORY_PARTS

    def joined(lines: list[tuple[str, str]], omitted: dict[str, int]) -> str:
        body, last = [head], None
        for name, line in lines:
            if name != last:
                body.append(f"{name}:")
                last = name
            body.append(line)
        if omitted:
            counts = ", ".join(f"{n} {omitted_names[name]}" for name, n in omitted.items())
            body.append(f"[omitted to fit {limit} tokens: {counts}]")
        return "\n".join(body)

    def tokens(text: str) -> int:
        return -(-len(text.encode()) // 4)

    rank = {name: n for n, name in enumerate(parts)}
    order = sorted(range(len(lines)), key=lambda i: (-rank[lines[i][0]], i))
    victims = [lines[i] for i in order if lines[i][0] != parts[0]]
    text = joined(lines, {})
    if tokens(text) > limit:
        omitted: dict[str, int] = {}
        for victim in victims:
            lines.remove(victim)
            omitted[victim[0]] = omitted.get(victim[0], 0) + 1
            text = joined(lines, omitted)
            if tokens(text) <= limit:
                break
    return text


@pytest.mark.parametrize("seed", range(8))
def test_the_memory_text_drops_lines_counting_bytes_and_joins_once(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over its token limit, the memory text drops its lowest-priority lines counting the
    bytes each takes away and joins the text once (it joined every line again after each one
    dropped: thousands of changed files made each next turn quadratic); the text is the one
    the old way gave, for random memories and limits."""
    rng = random.Random(seed)
    memory = working_memory.WorkingMemory(
        run_id="r",
        fleet_id="f",
        task_goal="Fix the order service" + " é" * rng.randrange(0, 30),
        current_plan=tuple(
            f"step {i} " + "x" * rng.randrange(5, 60) for i in range(rng.randrange(0, 30))
        ),
        changed_files=tuple(
            sorted(
                f"src/é{i:04d}/" + "y" * rng.randrange(1, 40) for i in range(rng.randrange(0, 400))
            )
        ),
        snapshot_version=3,
    )
    head = (
        f"Working memory as of sequence 9 (snapshot {memory.snapshot_version}); every fact is "
        "backed by the evidence cited."
    )
    original = context_manifests._memory_joined
    for limit in (1, 40, 400, 4_000, 10**6):
        parts = context_manifests._memory_parts(memory, goal_bytes=2 * limit)
        lines = [(n, line) for n in context_manifests._MEMORY_PARTS for line in parts.get(n, ())]
        want = context_manifests._fitted(_old_memory_text(head, lines, limit), limit)
        calls = 0

        def counted(*args: Any) -> str:
            nonlocal calls
            calls += 1
            return str(original(*args))

        monkeypatch.setattr(context_manifests, "_memory_joined", counted)
        text = context_manifests.memory_text(memory, 9, limit)
        monkeypatch.setattr(context_manifests, "_memory_joined", original)
        assert text == want, limit
        assert calls <= 2


def test_a_memory_listing_part_of_its_files_says_how_many_more() -> None:
    """The next turn's memory text, the CLI's and the pages' line say how many changed files
    the memory does not list; a memory listing them all says nothing more."""
    from consumers.render import changed_files
    from projectors.working_memory import WorkingMemory

    part = WorkingMemory(
        run_id="r", fleet_id="f", changed_files=("a.py", "b.py"), changed_files_total=250
    )
    text = context_manifests.memory_text(part, 1, 10_000)
    assert "- a.py\n- b.py\n- (248 more changed files not listed)" in text
    line = changed_files(part.model_dump(mode="json"))
    assert line == "a.py, b.py (and 248 more in the evidence index)"
    whole = part.model_copy(update={"changed_files_total": 2})
    assert "more" not in context_manifests.memory_text(whole, 1, 10_000)
    assert changed_files(whole.model_dump(mode="json")) == "a.py, b.py"
    assert changed_files({}) == "-"
