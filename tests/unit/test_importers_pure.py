"""The importers' pure parts: patch line counts as git counts them, each format's double count
(on the real sample files), entry ids stable across imports."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from schemas.models import (
    DiffPart,
    LedgerEntry,
    ModelUsagePart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    VerificationPart,
)
from streams.importers import FORMATS
from streams.importers.base import ImportedRun, patch_files, patch_numstat
from tests.packs import SHARED

SAMPLES = SHARED / "samples"

PATCH = (
    "diff --git a/app.py b/app.py\n"
    "--- a/app.py\n"
    "+++ b/app.py\n"
    "@@ -1,3 +1,4 @@\n"
    " keep\n"
    "-old\n"
    "+new\n"
    "+more\n"
    " keep\n"
    "diff --git a/gone.txt b/gone.txt\n"
    "deleted file mode 100644\n"
    "--- a/gone.txt\n"
    "+++ /dev/null\n"
    "@@ -1,2 +0,0 @@\n"
    "-a\n"
    "-b\n"
)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_patch_lines_are_counted_as_git_apply_numstat_counts_them(
    newline: str, tmp_path: Path
) -> None:
    patch = PATCH.replace("\n", newline)
    ours = patch_numstat(patch)
    assert ours == {"app.py": (2, 1), "gone.txt": (0, 2)}
    (tmp_path / "p.diff").write_bytes(patch.encode())
    git = subprocess.run(
        ["git", "apply", "--numstat", str(tmp_path / "p.diff")],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    theirs = {
        path: (int(a), int(d)) for a, d, path in (line.split("\t") for line in git.splitlines())
    }
    assert ours == theirs


def test_claude_code_counts_one_call_per_message_id_with_its_last_usage() -> None:
    _, summary = FORMATS["claude-code"].import_file(
        SAMPLES / "claude-code" / "spotter-short.jsonl", "f"
    )
    # five lines share one message.id with identical usage: one call, not five
    assert (summary.calls, summary.duplicate_reports) == (1, 4)
    assert summary.output_tokens == 13


def test_codex_repeated_totals_add_nothing() -> None:
    [path] = (SAMPLES / "codex").glob("localpush-rollout-2026-02-23T20-34-25-*.jsonl")
    _, summary = FORMATS["codex"].import_file(path, "f")
    assert (summary.calls, summary.duplicate_reports) == (6, 5)
    assert (summary.input_tokens, summary.output_tokens) == (298373, 1123)


def test_a_second_import_yields_the_same_entries() -> None:
    path = SAMPLES / "openhands" / "basic_gui_mode.json"
    first, _ = FORMATS["openhands"].import_file(path, "f")
    again, _ = FORMATS["openhands"].import_file(path, "f")
    assert [e.entry_id for e in first[0].entries] == [e.entry_id for e in again[0].entries]
    assert first[0].entries == again[0].entries


# -- real providers' usage, normalized, never refused (issue 26) ---------------------------------

SAMPLES2 = SAMPLES.parent / "samples2"


def test_openai_usage_counts_parts_inside_their_totals_as_openai_does() -> None:
    from streams.importers.base import openai_usage

    got = openai_usage(
        {
            "prompt_tokens": 1000,
            "completion_tokens": 200,
            "prompt_tokens_details": {"cached_tokens": 800},
            "completion_tokens_details": {"reasoning_tokens": 150},
            "cost": 0.0042,
        }
    )
    assert (got.input_tokens, got.cached_input_tokens, got.output_tokens) == (1000, 800, 200)
    assert (got.reasoning_tokens, got.cost_usd, got.notes) == (150, 0.0042, ())
    part = got.part(
        provider="openrouter", model="x/y", purpose="agent", status="OK", raw_usage_json="{}"
    )
    assert part.provider_reported_cost_usd is not None and part.unknown_fields == ("latency_ms",)


def test_reasoning_or_cache_reported_apart_is_added_and_flagged_not_refused() -> None:
    from streams.importers.base import openai_usage

    # Portkey: reasoning outside completion; Anthropic through older litellm: cache outside prompt
    got = openai_usage(
        {
            "prompt_tokens": 4,
            "completion_tokens": 30,
            "cache_creation_input_tokens": 20_000,
            "cache_read_input_tokens": 0,
            "completion_tokens_details": {"reasoning_tokens": 500},
        }
    )
    assert (got.input_tokens, got.cache_write_input_tokens) == (20_004, 20_000)
    assert (got.output_tokens, got.reasoning_tokens) == (530, 500)
    assert len(got.notes) == 2 and all("reported apart" in n for n in got.notes)
    part = got.part(provider="p", model="m", purpose="agent", status="OK", raw_usage_json="{}")
    assert part.reasoning_tokens <= part.output_tokens  # the contract holds, nothing refused
    # reads inside the prompt, writes apart: only the writes are added
    mixed = openai_usage(
        {
            "prompt_tokens": 100,
            "completion_tokens": 1,
            "cache_read_input_tokens": 80,
            "cache_creation_input_tokens": 30,
        }
    )
    assert mixed.input_tokens == 130


def test_unreported_usage_is_unknown_never_zero() -> None:
    from streams.importers.base import openai_usage

    got = openai_usage({"completion_tokens": 7, "cost": "free"})
    assert got.input_tokens is None and got.cost_usd is None
    part = got.part(provider="p", model="m", purpose="agent", status="OK", raw_usage_json="{}")
    assert {"input_tokens", "cached_input_tokens", "reasoning_tokens"} <= set(part.unknown_fields)
    assert part.output_tokens == 7 and part.known("output_tokens")
    assert openai_usage({"prompt_tokens": 3.0, "completion_tokens": -1}).unknown == (
        "cached_input_tokens",  # (the part's field order)
        "output_tokens",
        "reasoning_tokens",
        "latency_ms",
    )


@pytest.mark.parametrize(
    ("provider", "model", "expected"),
    [
        ("google", "google/google/gemini-3-pro-preview", "google/gemini-3-pro-preview"),
        ("openrouter", "google/google/gemini-3-pro-preview", "google/gemini-3-pro-preview"),
        ("openrouter", "openrouter/openrouter/x", "openrouter/x"),
        ("deepseek", "deepseek-reasoner", "deepseek-reasoner"),
        ("anthropic", " claude-sonnet-4/ ", "claude-sonnet-4"),
        ("x", "", "unknown"),
    ],
)
def test_model_ids_never_double_their_provider(provider: str, model: str, expected: str) -> None:
    from streams.importers.base import model_id

    assert model_id(provider, model) == expected


def test_a_mini_swe_agent_run_without_any_timestamp_imports_with_its_time_marked_unknown() -> None:
    path = SAMPLES2 / "mini-swe-agent" / "pr816-reasoner-pylint-dev__astroid-1978.traj.json"
    runs, summary = FORMATS["mini-swe-agent"].import_file(path, "fleet-x")
    (run,) = runs
    assert run.entries[0].metadata["import.time"].startswith("unknown")
    assert any("no message has a time" in n for n in summary.notes)
    assert summary.calls == 0


def test_mini_swe_agent_times_come_from_the_response_when_messages_have_none(
    tmp_path: Path,
) -> None:
    import json

    path = SAMPLES2 / "mini-swe-agent" / "pr814-django__django-13660.traj.json"
    doc = json.loads(path.read_text())
    for message in doc["messages"]:  # a version that keeps only extra.response.created
        message.get("extra", {}).pop("timestamp", None)
    drifted = tmp_path / "drifted.traj.json"
    drifted.write_text(json.dumps(doc))
    runs, summary = FORMATS["mini-swe-agent"].import_file(drifted, "fleet-x")
    original, _ = FORMATS["mini-swe-agent"].import_file(path, "fleet-x")
    assert summary.calls == 46 and summary.input_tokens == 483_680
    assert summary.output_tokens == 7_692
    first = runs[0].entries[0].occurred_at.timestamp()
    assert first == 1775810653  # the first response's `created`
    assert "import.time" not in runs[0].entries[0].metadata
    assert [e.kind for e in runs[0].entries] == [e.kind for e in original[0].entries]


def test_import_help_names_every_format() -> None:
    from typer.testing import CliRunner

    from infra.main import app

    shown = CliRunner().invoke(app, ["import", "--help"], env={"COLUMNS": "300"})
    assert shown.exit_code == 0
    for name in FORMATS:
        assert name in shown.output, name


def test_swe_agent_1x_names_its_model_tools_and_task_and_marks_its_time_unknown() -> None:
    from collections import Counter

    path = SAMPLES2 / "swe-agent" / "swesmith-1.0.1-pandas-dev__pandas.95280573.pr_53856.traj"
    (run,), _summary = FORMATS["swe-agent"].import_file(path, "fleet-x")
    start = run.entries[0].metadata
    assert start["swe_agent.model"] == "claude-3-7-sonnet-20250219"
    assert start["swe_agent.version"] == "1.0.1" and start["import.time"].startswith("unknown")
    tools = Counter(
        p.tool_name for e in run.entries for p in e.parts if isinstance(p, ToolCallPart)
    )
    assert tools == {"bash": 9, "str_replace_editor": 6, "submit": 2}  # samples2 README
    (task,) = _texts(run.entries, "USER_TASK")
    assert task.startswith("<uploaded_files>")  # not a Python repr of a list


def test_swe_agent_0x_demonstrations_are_not_the_task() -> None:
    path = SAMPLES2 / "swe-agent" / "pr843-portalocker_madeup_cmd-97af1e.traj"
    (run,), summary = FORMATS["swe-agent"].import_file(path, "fleet-x")
    tasks = _texts(run.entries, "USER_TASK")
    assert tasks and not any("demonstration" in t for t in tasks)
    assert summary.skipped["demonstration message"] == 1


def _texts(entries: list[LedgerEntry], kind: str) -> list[str]:
    return [
        p.text for e in entries if e.kind.value == kind for p in e.parts if isinstance(p, TextPart)
    ]


# -- OpenHands layouts recognised by content (samples2 README figures) ---------------------------

OPENHANDS2 = SAMPLES2 / "openhands"


def _usage(run: ImportedRun) -> list[ModelUsagePart]:
    return [p for e in run.entries for p in e.parts if isinstance(p, ModelUsagePart)]


def test_an_openhands_v0_session_folder_is_one_run_and_its_usage_is_counted_once() -> None:
    folder = OPENHANDS2 / "pr9633-session-63b43159"
    assert FORMATS["openhands"].discover([OPENHANDS2]).count(folder) == 1
    (run,), summary = FORMATS["openhands"].import_file(folder, "fleet-x")
    calls = _usage(run)
    assert len(calls) == 3 and summary.duplicate_reports == 2  # 5 reports, 3 response ids
    assert sum(c.output_tokens for c in calls) == 302
    assert sum(c.cached_input_tokens for c in calls) == 13_316
    assert sum(c.cache_write_input_tokens or 0 for c in calls) == 6_972
    # the first call reports 4 prompt tokens without its 6,972 cache writes: added, flagged
    assert sum(c.input_tokens for c in calls) == 13_332 + 6_972
    assert any("reported apart" in n for n in summary.notes)


def test_a_2024_evaluation_output_gives_a_run_per_instance_and_unknown_usage_per_action() -> None:
    path = OPENHANDS2 / "pr1973-prontoqa-gpt-4o-v1.5-output.jsonl"
    runs, summary = FORMATS["openhands"].import_file(path, "fleet-x")
    assert [r.run_id.rsplit("-", 1)[-1] for r in runs] == [f"ProntoQA_{n}" for n in range(1, 7)]
    assert [len(_usage(r)) for r in runs] == [4, 4, 4, 4, 4, 3]  # the agent's actions
    for run in runs:
        for call in _usage(run):
            assert not call.known("input_tokens") and not call.known("output_tokens")
            assert call.provider_reported_cost_usd is None
            assert (call.provider, call.model) == ("openai", "gpt-4o-2024-05-13")
    assert summary.runs == 6


def test_a_v1_sdk_evaluation_output_maps_its_kind_events() -> None:
    path = OPENHANDS2 / "benchmarks-pr90-openagentsafety-v1sdk-output.jsonl"
    runs, summary = FORMATS["openhands"].import_file(path, "fleet-x")
    assert len(runs) == 2 and not summary.skipped
    for run in runs:
        assert len(_usage(run)) == 9  # 9 unique llm_response_ids
        kinds = [e.kind.value for e in run.entries]
        assert kinds.count("TOOL_CALL_REQUEST") == kinds.count("TOOL_CALL_RESULT") == 9
        assert {c.model for c in _usage(run)} == {"gpt-4o-2024-08-06"}


def test_jsonl_that_is_not_an_evaluation_output_is_refused_by_content(tmp_path: Path) -> None:
    from streams.importers.base import ImportFormatError

    path = tmp_path / "other.jsonl"
    path.write_text('{"type": "user"}\n{"type": "assistant"}\n')
    with pytest.raises(ImportFormatError, match="no line holds a 'history'"):
        FORMATS["openhands"].import_file(path, "fleet-x")


def test_a_folder_of_completion_logs_is_one_run_with_each_calls_cost_and_latency() -> None:
    from decimal import Decimal

    folder = SAMPLES2 / "openhands-llm-logs" / "sdk-claude-sonnet-4-run"
    assert folder in FORMATS["openhands"].discover([SAMPLES2])
    (run,), summary = FORMATS["openhands"].import_file(folder, "fleet-x")
    calls = _usage(run)
    assert len(calls) == 6 == summary.calls
    assert sum(c.input_tokens for c in calls) == 35_428  # samples2 README
    assert sum(c.output_tokens for c in calls) == 804
    cost = sum((Decimal(repr(c.provider_reported_cost_usd)) for c in calls), Decimal(0))
    assert cost.quantize(Decimal("1e-9")) == Decimal("0.118344000")
    assert all(c.known("latency_ms") and c.latency_ms > 0 for c in calls)
    assert {(c.provider, c.model) for c in calls} == {("anthropic", "claude-sonnet-4-20250514")}


def test_a_codex_rollout_without_token_counts_has_unknown_calls_and_exit_codes_from_text() -> None:
    (path,) = (SAMPLES2 / "codex").glob("*.jsonl")
    (run,), summary = FORMATS["codex"].import_file(path, "fleet-x")
    assert summary.as_json()["calls"] is None and not summary.calls_known  # unknown, never 0
    results = [p for e in run.entries for p in e.parts if isinstance(p, ToolResultPart)]
    assert len(results) == 38
    assert sum(r.exit_code == 0 for r in results) == 34  # "Process exited with code 0"
    assert [r.exit_code for r in results if r.status.value == "FAILED"] == [1]
    for path in (SAMPLES / "codex").glob("*.jsonl"):  # rollouts with token counts: known
        assert FORMATS["codex"].import_file(path, "fleet-x")[1].as_json()["calls"] > 0


# -- patches are the truth for files -------------------------------------------------------------

KINDS_PATCH = (
    "diff --git a/src/x.py b/src/x.py\n"
    "index 1111111..2222222 100644\n"
    "--- a/src/x.py\n"
    "+++ b/src/x.py\n"
    "@@ -1,3 +1,3 @@\n"
    " a\n"
    "--- old comment\n"
    "+-- new comment\n"
    " c\n"
    "diff --git a/empty.txt b/empty.txt\n"
    "new file mode 100644\n"
    "index 0000000..e69de29\n"
    "diff --git a/img.png b/img.png\n"
    "new file mode 100644\n"
    "index 0000000..3333333\n"
    "Binary files /dev/null and b/img.png differ\n"
    "diff --git a/old.py b/new.py\n"
    "similarity index 90%\n"
    "rename from old.py\n"
    "rename to new.py\n"
    "index 4444444..5555555 100644\n"
    "--- a/old.py\n"
    "+++ b/new.py\n"
    "@@ -1 +1 @@\n"
    "-x\n"
    "+y\n"
    "diff --git a/gone.txt b/gone.txt\n"
    "deleted file mode 100644\n"
    "index 6666666..0000000\n"
    "--- a/gone.txt\n"
    "+++ /dev/null\n"
    "@@ -1,2 +0,0 @@\n"
    "-a\n"
    "-b\n"
)


def test_every_file_of_a_patch_is_kept_as_git_sees_it_empty_binary_renamed_and_deleted(
    tmp_path: Path,
) -> None:
    (tmp_path / "p.diff").write_text(KINDS_PATCH)
    git = subprocess.run(
        ["git", "apply", "--numstat", str(tmp_path / "p.diff")],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    theirs = {
        path: (0 if a == "-" else int(a), 0 if d == "-" else int(d))  # binary: "-"
        for a, d, path in (line.split("\t") for line in git.splitlines())
    }
    files = {f.path: f for f in patch_files(KINDS_PATCH)}
    assert {p: (f.lines_added, f.lines_deleted) for p, f in files.items()} == theirs
    assert {p: f.status.value for p, f in files.items()} == {
        "src/x.py": "MODIFIED",
        "empty.txt": "ADDED",
        "img.png": "ADDED",
        "new.py": "RENAMED",
        "gone.txt": "DELETED",
    }
    assert files["new.py"].old_path == "old.py"


def test_a_plain_diff_of_two_files_ends_each_hunk_where_its_header_says() -> None:
    patch = (
        "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-x\n+y\n"
        "--- a/b.txt\n+++ b/b.txt\n@@ -1 +1,2 @@\n z\n+w\n"
    )
    assert patch_numstat(patch) == {"a.txt": (1, 1), "b.txt": (1, 0)}


@pytest.mark.parametrize(
    ("name", "path", "added", "deleted"),
    [  # samples2 README: patch statistics from git apply --numstat
        ("pr816-reasoner-sqlfluff__sqlfluff-2419.traj.json", "src/sqlfluff/rules/L060.py", 6, 4),
        ("pr814-django__django-13660.traj.json", "django/core/management/commands/shell.py", 2, 2),
    ],
)
def test_a_submitted_patch_gives_the_changed_files_and_lines(
    name: str, path: str, added: int, deleted: int
) -> None:
    runs, _ = FORMATS["mini-swe-agent"].import_file(SAMPLES2 / "mini-swe-agent" / name, "f")
    diffs = [p for e in runs[0].entries for p in e.parts if isinstance(p, DiffPart)]
    assert [(f.path, f.lines_added, f.lines_deleted) for d in diffs for f in d.files] == [
        (path, added, deleted)
    ]


def _as_mini_1x(doc: dict[str, Any]) -> dict[str, Any]:
    """A mini 2.x (tool calling) trajectory drifted back to 1.x: text actions in bash blocks, the
    outputs as user messages, no per-message timestamps (only the responses' ``created``)."""
    out = []
    for m in doc["messages"]:
        m = dict(m)
        extra = dict(m.get("extra") or {})
        extra.pop("timestamp", None)
        m["extra"] = extra
        if m["role"] == "assistant":
            commands = [json.loads(c["function"]["arguments"])["command"] for c in m["tool_calls"]]
            m["content"] = (m.get("content") or "") + "".join(
                f"\n\n```bash\n{c}\n```" for c in commands
            )
            del m["tool_calls"]
        elif m["role"] == "tool":
            m = {"role": "user", "content": m["content"], "extra": extra}
        elif m["role"] == "exit":
            continue
        out.append(m)
    info = dict(doc["info"], mini_version="1.17.0")
    return {**doc, "messages": out, "info": info, "trajectory_format": "mini-swe-agent-1"}


def test_a_mini_1x_trajectory_has_one_task_and_its_text_actions_as_tool_calls(
    tmp_path: Path,
) -> None:
    doc = json.loads(
        (SAMPLES2 / "mini-swe-agent" / "pr814-django__django-13660.traj.json").read_text()
    )
    path = tmp_path / "django__django-13660.traj.json"
    path.write_text(json.dumps(_as_mini_1x(doc)))
    runs, summary = FORMATS["mini-swe-agent"].import_file(path, "f")
    kinds = Counter(e.kind.value for e in runs[0].entries)
    assert kinds["USER_TASK"] == 1  # not every observation
    assert kinds["TOOL_CALL_REQUEST"] == 46  # one per assistant message (README: 46)
    assert kinds["TOOL_CALL_RESULT"] == 45  # README: 45 tool messages (the submit's is the exit)
    assert summary.calls == 46
    results = [p for e in runs[0].entries for p in e.parts if isinstance(p, ToolResultPart)]
    assert results[0].exit_code == 0 and results[0].status.value == "SUCCEEDED"
    first = runs[0].entries[0].occurred_at
    assert int(first.timestamp()) == 1775810653  # README: the first response's created


# -- OpenHands evaluation outputs: how each instance ended and its verdict ------------------------


def _verdicts(run: ImportedRun) -> list[str]:
    return [p.status.value for e in run.entries for p in e.parts if isinstance(p, VerificationPart)]


def _final_status(run: ImportedRun) -> str | None:
    ends = [e.run_status.value for e in run.entries if e.run_status is not None]
    return ends[-1] if ends else None


def test_a_2024_evaluation_output_submits_each_instance_and_brings_its_verdict_in() -> None:
    path = OPENHANDS2 / "pr1973-prontoqa-gpt-4o-v1.5-output.jsonl"
    runs, _ = FORMATS["openhands"].import_file(path, "fleet-x")
    # README: test_result.result is true for 5, false for ProntoQA_1; error null everywhere
    assert [_verdicts(r) for r in runs] == [["FAILED"]] + [["PASSED"]] * 5
    assert all(r.entries[-1].kind.value == "VERIFIER_RESULT" for r in runs)  # after the end
    assert {_final_status(r) for r in runs} <= {"SUBMITTED", "UNKNOWN"}  # never SUCCEEDED
    assert "SUCCEEDED" not in {_final_status(r) for r in runs}


def test_a_v1_evaluation_output_without_checks_has_no_verdict_and_is_not_running() -> None:
    path = OPENHANDS2 / "benchmarks-pr90-openagentsafety-v1sdk-output.jsonl"
    runs, summary = FORMATS["openhands"].import_file(path, "fleet-x")
    assert [_verdicts(r) for r in runs] == [[], []]  # final_score 0 of 0: not evaluated
    assert all(_final_status(r) is not None for r in runs)  # it ended: not shown as RUNNING
    assert sum("holds no verdict" in n for n in summary.notes) == 2


def _swe_instance(error: str | None, patch: str | None, resolved: bool | None) -> dict[str, Any]:
    """A SWE-bench-style OpenHands evaluation instance: an edit with a sandbox path, a finish."""
    t = "2025-01-01T00:00:0{}"
    meta = {"tool_call_id": "t1", "function_name": "str_replace_editor"}
    history = [
        {"id": 0, "timestamp": t.format(0), "source": "user", "action": "message",
         "args": {"content": "fix the bug"}},
        {"id": 1, "timestamp": t.format(1), "source": "agent", "action": "edit",
         "args": {"path": "/workspace/astropy__astropy__4.3/astropy/a.py"},
         "tool_call_metadata": meta},
        {"id": 2, "timestamp": t.format(2), "source": "agent", "observation": "edit", "cause": 1,
         "extras": {"path": "/workspace/astropy__astropy__4.3/astropy/a.py",
                    "old_content": "a\nb\n", "new_content": "a\nc\nd\ne\n", "prev_exist": True},
         "tool_call_metadata": meta},
    ]  # fmt: skip
    if error is None:
        history.append(
            {"id": 3, "timestamp": t.format(3), "source": "agent", "action": "finish", "args": {}}
        )
    test_result: dict[str, Any] = {}
    if patch is not None:
        test_result["git_patch"] = patch
    if resolved is not None:
        test_result["report"] = {"resolved": resolved, "tests_status": {
            "FAIL_TO_PASS": {"success": ["t_a"], "failure": []}}}  # fmt: skip
    return {
        "instance_id": "astropy__astropy-12907",
        "history": history,
        "metadata": {"model_name": "gpt-4o"},
        "test_result": test_result,
        "error": error,
    }


FINAL_PATCH = "diff --git a/astropy/a.py b/astropy/a.py\n--- a/astropy/a.py\n+++ b/astropy/a.py\n@@ -1,2 +1,3 @@\n a\n+c\n b\n"  # noqa: E501


@pytest.mark.parametrize(
    ("error", "patch", "resolved", "status", "verdicts", "files"),
    [
        (None, FINAL_PATCH, True, "SUBMITTED", ["PASSED"], [("astropy/a.py", 1, 0)]),
        (None, FINAL_PATCH, False, "SUBMITTED", ["FAILED"], [("astropy/a.py", 1, 0)]),
        (None, None, None, "SUBMITTED", [], [("astropy/a.py", 3, 1)]),  # no patch: the edits
        (
            "RuntimeError: Agent reached maximum iteration in headless mode",
            "",
            None,
            "STEP_LIMIT",
            [],
            [],
        ),
        ("RuntimeError: sandbox died", None, None, "FAILED", [], [("astropy/a.py", 3, 1)]),
    ],
)
def test_an_evaluated_instance_ends_as_its_error_says_with_its_patch_as_the_files(
    tmp_path: Path,
    error: str | None,
    patch: str | None,
    resolved: bool | None,
    status: str,
    verdicts: list[str],
    files: list[tuple[str, int, int]],
) -> None:
    path = tmp_path / "output.jsonl"
    path.write_text(json.dumps(_swe_instance(error, patch, resolved)) + "\n")
    (run,), _ = FORMATS["openhands"].import_file(path, "fleet-x")
    assert _final_status(run) == status
    assert _verdicts(run) == verdicts
    diffs = [f for e in run.entries for p in e.parts if isinstance(p, DiffPart) for f in p.files]
    assert [(f.path, f.lines_added, f.lines_deleted) for f in diffs] == files


# -- import auto: formats recognised by content ----------------------------------------------------

FOLDER_FORMAT = {
    "claude-code": "claude-code",
    "codex": "codex",
    "openhands": "openhands",
    "openhands-llm-logs": "openhands",
    "mini-swe-agent": "mini-swe-agent",
    "swe-agent": "swe-agent",
    "otel-genai": "otel",
    "aider": "aider",
}


@pytest.mark.parametrize("pack", [SAMPLES, SAMPLES2])
def test_every_log_of_both_packs_is_recognised_by_its_content(pack: Path) -> None:
    from streams.importers.detect import AutoImporter, detect

    auto = AutoImporter()
    found = auto.discover([pack])
    assert len(found) >= 18
    for path in found:
        assert detect(path) == FOLDER_FORMAT[path.relative_to(pack).parts[0]], path
    # the packs' READMEs, evaluation reports and truth files are no logs: left out
    assert all(
        p.suffix in (".md", ".py") or "swebench-eval" in p.parts or "truth" in p.parts
        or p.name.endswith("all_preds.jsonl")
        for p in auto.ignored
    ), auto.ignored  # fmt: skip


def test_a_renamed_log_is_still_recognised_and_a_stranger_is_refused(tmp_path: Path) -> None:
    from streams.importers.base import ImportFormatError
    from streams.importers.detect import AutoImporter

    renamed = tmp_path / "session.log.json"  # a Codex rollout under another name
    renamed.write_bytes(next((SAMPLES2 / "codex").glob("*.jsonl")).read_bytes())
    runs, summary = AutoImporter().import_file(renamed, "f")
    assert summary.notes[0] == "recognised as codex" and len(runs) == 1
    stranger = tmp_path / "config.json"
    stranger.write_text('{"name": "app", "version": 3}')
    with pytest.raises(ImportFormatError, match="not a log of any format"):
        AutoImporter().import_file(stranger, "f")


@pytest.mark.parametrize(
    ("name", "category"),
    [  # samples2 README: an SSL EOF from DeepSeek; a connection timed out after 600 s
        ("pr816-reasoner-pvlib__pvlib-python-1072.traj.json", "provider"),
        ("pr816-reasoner-pylint-dev__astroid-1978.traj.json", "timeout.provider"),
    ],
)
def test_the_exception_that_ended_a_mini_run_is_its_last_error(name: str, category: str) -> None:
    from schemas.models import ErrorPart

    (run,), _ = FORMATS["mini-swe-agent"].import_file(SAMPLES2 / "mini-swe-agent" / name, "f")
    errors = [p for e in run.entries for p in e.parts if isinstance(p, ErrorPart)]
    assert [e.category for e in errors] == [category]
    assert errors[0].message.startswith("litellm.")


def test_a_claude_code_interruption_notice_is_not_the_runs_goal() -> None:
    """Found trying the product (2026-12-07): "[Request interrupted by user for tool use]",
    Claude Code's notice written as the user's text, became the run's goal (memory, runs list,
    the web page and MCP); the task was the user's line before it."""
    from projectors.base import fold_all
    from projectors.registry import all_projections
    from projectors.working_memory import INTERRUPTION_KEY
    from streams.importers.claude_code import import_file
    from tests.packs import SHARED

    [run], _ = import_file(SHARED / "samples/claude-code/spotter-short.jsonl", "f")
    notices = [e for e in run.entries if e.metadata.get(INTERRUPTION_KEY) == "true"]
    assert len(notices) == 1 and "interrupted" in str(notices[0].parts[0])  # kept, marked
    [memory] = [p for p in all_projections() if p.name == "working-memory"]
    state = fold_all(memory, run.entries)
    assert state is not None and state.task_goal == "mix phx.server doesnt seem to start"


def test_an_openhands_harness_reply_is_not_the_runs_goal() -> None:
    """Found trying the product (2026-12-07): OpenHands' evaluation harness answers in the
    user's place ("Please continue working on the task on whatever approach you think is
    suitable..."); that reply became the goal of all six ProntoQA runs (runs list, memory)."""
    from projectors.base import fold_all
    from projectors.registry import all_projections
    from projectors.working_memory import AUTO_REPLY_KEY
    from streams.importers.openhands import import_file
    from tests.packs import SHARED

    runs, _ = import_file(
        SHARED / "samples2/openhands/pr1973-prontoqa-gpt-4o-v1.5-output.jsonl", "f"
    )
    [memory] = [p for p in all_projections() if p.name == "working-memory"]
    for run in runs:
        replies = [e for e in run.entries if e.metadata.get(AUTO_REPLY_KEY) == "true"]
        assert replies and all("Please continue" in str(e.parts[0]) for e in replies)  # kept
        state = fold_all(memory, run.entries)
        assert state is not None
        assert state.task_goal.startswith("You are a helpful assistant assigned with logic")


def test_a_run_with_model_output_and_no_call_has_its_calls_unknown() -> None:
    """Found trying the product: a log whose 46 calls were all refused by the ledger contract
    (a secret in the response id) showed "no model calls". A run whose log shows the model's
    output but holds no model call keeps no usage: its calls are unknown, never 0."""
    from datetime import UTC, datetime

    from projectors.cost_metrics import CALLS_KEY, CALLS_UNKNOWN
    from schemas.factory import model_usage
    from schemas.models import EntryKind, TextPart
    from streams.importers.base import ImportedRun, Summary, mark_unmetered

    at = datetime(2026, 12, 7, tzinfo=UTC)

    def run(*kinds: EntryKind) -> ImportedRun:
        r = ImportedRun(f"r-{len(kinds)}-{kinds[-1].value}", "f", "s", "test")
        r.add(EntryKind.RUN_STARTED, at, "start", [TextPart(text="run imported")])
        for n, kind in enumerate(kinds):
            usage = model_usage(f"resp-{n}")
            r.add(
                kind, at, f"e{n}", [usage if kind is EntryKind.MODEL_CALL else TextPart(text="x")]
            )
        return r

    replied = run(EntryKind.USER_TASK, EntryKind.ASSISTANT_RESPONSE)
    counted = run(EntryKind.ASSISTANT_RESPONSE, EntryKind.MODEL_CALL)
    silent = run(EntryKind.USER_TASK)
    summary = Summary("x")
    mark_unmetered([replied, counted, silent], summary)
    assert replied.entries[0].metadata[CALLS_KEY] == CALLS_UNKNOWN
    assert (
        CALLS_KEY not in counted.entries[0].metadata and CALLS_KEY not in silent.entries[0].metadata
    )
    assert summary.as_json()["calls"] is None  # no call of the file known
    # a file whose other runs have known calls keeps them known (its sums are lower bounds)
    mixed = Summary("y", calls=3)
    mark_unmetered([run(EntryKind.ASSISTANT_RESPONSE)], mixed)
    assert mixed.as_json()["calls"] == 3 and mixed.as_json()["runs_calls_unknown"] == 1


def test_a_timeout_is_the_providers_only_when_a_model_call_timed_out() -> None:
    """Found by a review: with OpenTelemetry root spans read by the same rule, an agent's own
    TimeoutError (a tool sandbox) was called the provider's fault."""
    from streams.importers.base import exit_error

    for text in (
        "Timeout",  # mini-swe-agent's exit status (its model call's connection timed out)
        "litellm.Timeout: Connection timed out after 600.0 seconds",
        "openai.APITimeoutError: Request timed out.",
        "httpx.ReadTimeout: timed out",
    ):
        assert exit_error(text).category == "timeout.provider", text
    for text in ("TimeoutError: tool sandbox timed out", "subprocess.TimeoutExpired: pytest"):
        assert exit_error(text).category == "timeout", text


def test_import_auto_names_the_swebench_reports_it_leaves_out() -> None:
    """Found by a user trial: `import auto ../shared/samples2` said only that 10 files were no
    log of a known format; five of them are SWE-bench reports, whose verdicts go in by
    `import swebench-report`, which it now says."""
    from streams.cli import _verdict_reports
    from streams.importers.detect import AutoImporter
    from tests.packs import SAMPLES2

    auto = AutoImporter()
    auto.discover([SAMPLES2])
    reports = _verdict_reports(auto.ignored)
    assert sorted(p.name for p in reports) == [
        "pr814-django__django-11039.report.json",
        "pr814-django__django-13660.report.json",
        "swesmith-pandas-dev__pandas.95280573.pr_53856.report.json",
        "swesmith-pydantic__pydantic.acb0f10f.pr_8316.report.json",
        "swesmith-run-report.json",
    ]
    assert len(auto.ignored) > len(reports)  # the others (READMEs, predictions) are not named
