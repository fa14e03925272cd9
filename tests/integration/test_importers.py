"""Real agents in: every sample log of ../shared/samples imported with `agentledger import` into a
real stack, projected by a real worker; `costs --by run --json` must give exactly the
deduplicated totals of the samples' README (each format's double count avoided), the changed
files must be the patch's, and a second import must publish nothing.

The expected figures below are the samples README's, recomputed there from the files' bytes
(they are the specification, not our output)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from consumers.views import live_states
from infra.settings import Settings
from streams.deployment import PrivateDeployment
from tests.integration.web_support import cli_and_api_disagree
from tests.packs import SHARED

pytestmark = pytest.mark.integration

SAMPLES = SHARED / "samples"
FLEET = "imports"


def _cc(uncached: int, out: int, written: int, read: int, calls: int) -> dict[str, int | None]:
    """Claude Code's README figures (input without the cache) as our totals (input with it)."""
    return {
        "input_tokens": uncached + written + read,
        "cached_input_tokens": read,
        "cache_write_input_tokens": written,
        "output_tokens": out,
        "calls": calls,
    }


def _oai(
    prompt: int, cached: int, out: int, calls: int, reasoning: int | None = 0
) -> dict[str, int | None]:
    return {
        "input_tokens": prompt,
        "cached_input_tokens": cached,
        "output_tokens": out,
        "reasoning_tokens": reasoning,
        "calls": calls,
    }


EXPECTED: dict[str, tuple[str, dict[str, int | None]]] = {
    "258c7280-ae70-4798-800f-63464d01a85d.jsonl": (
        "claude-code",
        _cc(180, 38899, 349474, 14771617, 152),
    ),
    "agent-a881341.jsonl": ("claude-code", _cc(15, 3, 42176, 34159, 3)),
    "agent-acompact-fffbd0.jsonl": ("claude-code", _cc(3, 6, 2487, 166758, 1)),
    "spotter-short.jsonl": ("claude-code", _cc(3, 13, 13835, 11515, 1)),
    "codemie-session-9eda1058-summary.jsonl": ("claude-code", _cc(47, 4509, 147267, 22912, 5)),
    "turn-2.jsonl": ("claude-code", _cc(537, 10099, 157962, 223343, 11)),
    "agent-a485154.jsonl": ("claude-code", _cc(5233, 1845, 115531, 91980, 6)),
    "codemie-rollout-2026-05-11T11-26-55-019e1625-789d-76c0-80ab-3724b5ddb799.jsonl": (
        "codex",
        _oai(6055836, 4929536, 9118, 66, reasoning=1759),
    ),
    "localpush-rollout-2026-02-23T20-34-25-019c8bfe-ec25-79e0-97d7-bda6a9c575ff.jsonl": (
        "codex",
        _oai(298373, 238848, 1123, 6, reasoning=483),
    ),
    "localpush-rollout-2026-02-23T12-54-34-019c8a59-e9dd-71f0-9ae3-4079fe9726a9.jsonl": (
        "codex",
        _oai(33810485, 31621504, 133999, 286, reasoning=42113),
    ),
    "basic_gui_mode.json": ("openhands", _cc(17297 - 5482 - 11793, 2024, 5482, 11793, 4)),
    "basic.json": ("openhands", _cc(8132 - 4640 - 3482, 1312, 4640, 3482, 2)),
    "wrong_initial_state.json": ("openhands", _cc(14828 - 3927 - 10879, 358, 3927, 10879, 4)),
    # mini-swe-agent: every response's completion_tokens_details is null, so its reasoning
    # tokens are unknown (shown as 0 until 2026-12-07: unknown is never zero)
    "pr854-astropy__astropy-12907.traj.json": (
        "mini-swe-agent",
        _oai(1111619, 1093760, 17133, 64, reasoning=None),
    ),
    "pr814-django__django-11039.traj.json": (
        "mini-swe-agent",
        _oai(445781, 388736, 7841, 38, reasoning=None),
    ),
}
# Reported by the agent itself (the only accounting SWE-agent keeps; mini-swe-agent's per-call
# costs must sum to it).
REPORTED_COST = {
    "pr854-astropy__astropy-12907.traj.json": Decimal("0.04282166"),
    "pr814-django__django-11039.traj.json": Decimal("0.030150428"),
    "swe-agent-pr843-commit0-97af1e.traj": Decimal("0.153342"),
}
FOLDERS = {
    "claude-code": ["claude-code"],
    "codex": ["codex"],
    "openhands": ["openhands"],
    "mini-swe-agent": ["mini-swe-agent"],
    "swe-agent": ["swe-agent"],
    "otel": ["otel-genai"],
    "aider": ["aider"],
}
AIDER = "aider-tests-fixtures-chat-history.first-1MB.md"
# OpenTelemetry span files: a trace is a run (the Vercel capture gives each span its own trace);
# totals over the file's runs. The Vercel parents repeat their child's usage under ai.usage.*.
OTEL: dict[str, dict[str, int]] = {
    "openinference-vercel-ai-sdk-v6-all-spans.json": {
        "calls": 4,
        "input_tokens": 14 + 50 + 63 + 15,
        "output_tokens": 20 + 9 + 156 + 112,
    },
    "genai-interlingua-openllmetry-0.62.3-otlp.json": {
        "calls": 1,
        "input_tokens": 412,
        "output_tokens": 27,
        "cached_input_tokens": 256,
        "reasoning_tokens": 8,
    },
    "genai-interlingua-openinference-openai-0.1.58-otlp.json": {
        "calls": 1,
        "input_tokens": 412,
        "output_tokens": 27,
        "cached_input_tokens": 256,
        "reasoning_tokens": 8,
    },
}


def _cli(d: PrivateDeployment, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.main", *args],
        env={**d.env(), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def imported(
    services: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PrivateDeployment, dict[str, dict[str, Any]]]]:
    assert SAMPLES.is_dir(), f"the samples are not at {SAMPLES}"
    d = PrivateDeployment(services, "imp", [FLEET], tmp_path_factory.mktemp("imp"))
    asyncio.run(d.create())
    try:
        d.start_worker("imp-worker")
        d.wait_partitions("imp-worker")
        by_file: dict[str, dict[str, Any]] = {}
        for fmt, folders in FOLDERS.items():
            done = _cli(d, "import", fmt, *(str(SAMPLES / f) for f in folders), "--json")
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr
            assert "Traceback" not in done.stderr
            for report in json.loads(done.stdout):
                by_file[Path(report["path"]).name] = report | {"format": fmt}
        for report in by_file.values():
            for run_id, entries in report["run_entries"].items():
                _wait(d, run_id, entries)
        yield d, by_file
    finally:
        d.drop()


def _wait(d: PrivateDeployment, run_id: str, entries: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = [
            live_states(d.settings, p, [run_id]).get(run_id)
            for p in ("run-stats", "cost-metrics", "diff-timelines")
        ]
        if all(s is not None and s["applied_seq"] == entries for s in states):
            return
        time.sleep(0.5)
    pytest.fail(f"{run_id}: not applied through {entries} within {timeout_s}s")


def test_otel_span_files_give_their_usage_once(imported: Any) -> None:
    d, by_file = imported
    done = _cli(d, "costs", "--by", "run", "--fleet", FLEET, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["key"]: r for r in json.loads(done.stdout)["rows"]}
    for name, expected in OTEL.items():
        mine = [rows[r] for r in by_file[name]["run_ids"]]
        got = {k: sum(r[k] for r in mine) for k in expected}
        assert got == expected, name
        assert all(r["latency_calls"] == r["calls"] for r in mine), name  # spans time their calls


def test_every_sample_file_is_imported_as_one_run(imported: Any) -> None:
    _, by_file = imported
    assert set(by_file) == {*EXPECTED, *OTEL, AIDER, "swe-agent-pr843-commit0-97af1e.traj"}
    for name, report in by_file.items():
        if name not in OTEL and name != AIDER:
            assert report["runs"] == 1 and len(report["run_ids"]) == 1, name
        assert report["published"] == report["entries"] > 0, name


def test_costs_by_run_give_the_readmes_deduplicated_totals_exactly(imported: Any) -> None:
    d, by_file = imported
    done = _cli(d, "costs", "--by", "run", "--fleet", FLEET, "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["key"]: r for r in json.loads(done.stdout)["rows"]}
    for name, (_, expected) in EXPECTED.items():
        [run_id] = by_file[name]["run_ids"]
        row = rows[run_id]
        got = {k: row[k] for k in expected}
        assert got == expected, name
        assert row["usage_unknown_calls"] == 0 and row["latency_calls"] == 0, name  # unknown, not 0
        assert row["avg_latency_ms"] is None, name
    for name, cost in REPORTED_COST.items():
        [run_id] = by_file[name]["run_ids"]
        row = rows[run_id]
        assert abs(Decimal(row["reported_cost_usd"]) - cost) < Decimal("1e-8"), name
        if row["calls"]:  # mini-swe-agent: the per-call costs the agent reported sum to it
            assert abs(Decimal(row["provider_reported_cost_usd"]) - cost) < Decimal("1e-8"), name
    swe = rows[by_file["swe-agent-pr843-commit0-97af1e.traj"]["run_ids"][0]]
    assert swe["calls"] is None and swe["cost_usd"] is None  # nothing per call: unknown, not 0
    assert (swe["reported_input_tokens"], swe["reported_output_tokens"]) == (28434, 4536)


def test_the_runs_end_as_the_logs_say(imported: Any) -> None:
    d, by_file = imported
    status, classes = {}, {}
    for name in (
        "pr854-astropy__astropy-12907.traj.json",
        "swe-agent-pr843-commit0-97af1e.traj",
        "basic.json",
        "spotter-short.jsonl",
    ):
        [run_id] = by_file[name]["run_ids"]
        status[name] = live_states(d.settings, "run-stats", [run_id])[run_id]["state"]["status"]
        found = live_states(d.settings, "failure-classifications", [run_id])[run_id]["state"]
        classes[name] = found["classification"]["failure_class"]
    assert status["pr854-astropy__astropy-12907.traj.json"] == "SUBMITTED"
    assert status["swe-agent-pr843-commit0-97af1e.traj"] == "SUBMITTED"
    assert status["basic.json"] == "SUCCEEDED"
    assert status["spotter-short.jsonl"] is None  # a session records no end: still running
    # submitted, no evaluation verdict yet: neither succeeded nor failed (taxonomy v2)
    assert classes["pr854-astropy__astropy-12907.traj.json"] == "unevaluated"
    assert classes["basic.json"] == "none"


def test_changed_files_equal_the_patch(imported: Any) -> None:
    d, by_file = imported

    def files(name: str) -> dict[str, tuple[int, int]]:
        [run_id] = by_file[name]["run_ids"]
        state = live_states(d.settings, "diff-timelines", [run_id])[run_id]["state"]
        return {
            f["path"]: (f["lines_added"], f["lines_deleted"])
            for snap in state["snapshots"]
            for f in snap["files"]
        }

    # git apply --numstat of the submission: 2 2 django/core/management/commands/sqlmigrate.py
    assert files("pr814-django__django-11039.traj.json") == {
        "django/core/management/commands/sqlmigrate.py": (2, 2)
    }
    codex = files("codemie-rollout-2026-05-11T11-26-55-019e1625-789d-76c0-80ab-3724b5ddb799.jsonl")
    assert len(codex) == 3 and all(p.startswith("/Users/Sample_User/") for p in codex), codex
    assert files("basic.json") == {"/workspace/game_2048.py": (117, 0)}


def test_a_second_import_publishes_nothing(imported: Any) -> None:
    d, by_file = imported
    for fmt, folders in FOLDERS.items():
        done = _cli(d, "import", fmt, *(str(SAMPLES / f) for f in folders), "--json")
        assert done.returncode == 0, done.stderr
        for report in json.loads(done.stdout):
            first = by_file[Path(report["path"]).name]
            assert report["published"] == 0, report["path"]
            assert report["already_on_ledger"] == first["entries"], report["path"]


def test_a_run_on_the_ledger_is_not_imported_into_another_fleet(imported: Any) -> None:
    """Found trying the product (2026-12-07): a run imported again with another ``--fleet``
    was reported published while every entry was dead-lettered by the workers (a run's entries
    come from one topic), and a rebuild then took that copy. Now the file is refused, naming
    the fleet the run is in; nothing is sent."""
    d, by_file = imported
    path = SAMPLES / "claude-code" / "spotter-short.jsonl"
    [run_id] = by_file[path.name]["run_ids"]
    done = _cli(d, "import", "claude-code", str(path), "--fleet", "fleet-elsewhere", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    [report] = json.loads(done.stdout)
    assert report["published"] == 0
    assert f"run {run_id} is on the ledger in fleet {FLEET}" in report["error"]
    assert f"--fleet {FLEET}" in report["error"]


def test_a_follower_does_not_send_a_run_into_another_fleet(imported: Any) -> None:
    """``import --follow`` makes the same check as ``import`` (found trying the product: only
    the one-shot import did): the file is reported with the fleet its run is in, not sent."""
    from streams.importers import claude_code
    from streams.importers.publish import follow

    d, by_file = imported
    path = SAMPLES / "claude-code" / "spotter-short.jsonl"
    [run_id] = by_file[path.name]["run_ids"]
    reports: list[tuple[list[Any], str | None]] = []

    async def follow_once() -> None:
        stop = asyncio.Event()

        def report(_path: Path, _summary: Any, sent: list[Any], error: str | None) -> None:
            reports.append((sent, error))
            stop.set()

        await follow(
            d.settings, claude_code, [path], "fleet-elsewhere", report, 0.1, stop, quiet_s=0
        )

    asyncio.run(asyncio.wait_for(follow_once(), 60))
    [(sent, error)] = reports
    assert sent == [] and error is not None
    assert f"run {run_id} is on the ledger in fleet {FLEET}" in error


def test_claude_code_reasoning_tokens_are_unknown_never_zero(imported: Any) -> None:
    """Anthropic reports no reasoning count (thinking is inside the output): every roll-up
    showed Claude Code runs' reasoning tokens as 0. Unknown now, in the rows and the total."""
    d, by_file = imported
    done = _cli(d, "costs", "--by", "run", "--fleet", FLEET, "--json")
    report = json.loads(done.stdout)
    rows = {r["key"]: r for r in report["rows"]}
    for name, (fmt, _expected) in EXPECTED.items():
        if fmt == "claude-code":
            row = rows[by_file[name]["run_ids"][0]]
            assert row["reasoning_tokens"] is None and row["output_tokens"] > 0, name
    assert "reasoning_tokens" in report["total"]["partly_unknown"]


def test_the_costs_table_prices_by_the_maintained_database_and_never_shows_unknown_as_zero(
    imported: Any,
) -> None:
    d, by_file = imported
    done = _cli(d, "costs", "--by", "run", "--fleet", FLEET)
    assert done.returncode == 0, done.stderr
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if "│" in line}
    swe = rows[by_file["swe-agent-pr843-commit0-97af1e.traj"]["run_ids"][0]]
    assert "$0.1533" in swe and "$0.0000" not in swe, swe  # its own totals, no $0 of ours
    # claude-opus-4-6, which our own table lacks, priced by genai-prices: 3 in at $5, 13,835
    # cache writes at $6.25, 11,515 cache reads at $0.50, 13 out at $25, per million tokens
    opus = rows[by_file["spotter-short.jsonl"]["run_ids"][0]]
    assert "$0.0926" in opus, opus


def test_aider_counts_each_request_once_never_the_running_session_cost(imported: Any) -> None:
    d, by_file = imported
    text = (SAMPLES / "aider" / AIDER).read_text(encoding="utf-8", errors="replace")
    requests = re.findall(r"^> Tokens: .* Cost: \$([\d.]+) (?:request|message), ", text, re.M)
    tokens = re.findall(r"^> Tokens: ", text, re.M)
    assert (len(tokens), len(requests)) == (204, 196)  # the samples README's counts
    done = _cli(d, "costs", "--by", "run", "--fleet", FLEET, "--json")
    rows = {r["key"]: r for r in json.loads(done.stdout)["rows"]}
    mine = [rows[r] for r in by_file[AIDER]["run_ids"] if r in rows]
    assert sum(r["calls"] for r in mine if r["calls"] is not None) == 204
    # a session with the model's replies but no Tokens line keeps no usage: calls unknown
    # (found trying the product: such runs were shown as "no model calls"), never 0
    assert all(r["calls"] != 0 for r in mine)
    reported = sum(
        Decimal(r["provider_reported_cost_usd"])
        for r in mine
        if r["provider_reported_cost_usd"] is not None  # None: no request of the run had a cost
    )
    assert reported == sum(Decimal(x) for x in requests)  # the request costs, not the session's
    # not in the history: unknown, not 0 (every count of a session without usage is unknown)
    assert all(r["latency_calls"] in (0, None) for r in mine)


def test_the_timeline_shows_the_agents_own_run_totals(imported: Any) -> None:
    d, by_file = imported
    [run_id] = by_file["swe-agent-pr843-commit0-97af1e.traj"]["run_ids"]
    done = _cli(d, "timeline", run_id)
    assert done.returncode == 0, done.stderr
    assert "the agent reported for the run: $0.1533, 28,434 in / 4,536 out, 2 calls" in done.stdout
    doc = json.loads(_cli(d, "timeline", run_id, "--json").stdout)
    assert doc["cost"]["reported_totals"]["cost_usd"] == "0.153342"


def test_each_files_summary_prices_it_as_the_projection_does(imported: Any) -> None:
    d, by_file = imported
    done = _cli(d, "costs", "--by", "run", "--fleet", FLEET, "--json")
    rows = {r["key"]: r for r in json.loads(done.stdout)["rows"]}
    short = by_file["spotter-short.jsonl"]
    [run_id] = short["run_ids"]
    assert short["cost_usd"] == rows[run_id]["cost_usd"] and short["unpriced_calls"] == 0
    mini = by_file["pr814-django__django-11039.traj.json"]
    assert abs(Decimal(mini["provider_reported_cost_usd"]) - Decimal("0.030150428")) < Decimal(
        "1e-8"
    )
    assert by_file["swe-agent-pr843-commit0-97af1e.traj"]["cost_usd"] is None  # no calls: not $0


def test_runs_say_how_a_submission_ended(imported: Any) -> None:
    d, by_file = imported
    done = _cli(d, "runs", "--fleet", FLEET, "--json", "--limit", "500")
    assert done.returncode == 0, done.stderr
    outcome = {r["run_id"]: r["outcome"] for r in json.loads(done.stdout)}
    [astropy] = by_file["pr854-astropy__astropy-12907.traj.json"]["run_ids"]
    assert outcome[astropy] == "submitted, not evaluated yet"
    [basic] = by_file["basic.json"]["run_ids"]
    assert outcome[basic] == "succeeded"


def test_a_bad_file_skips_only_itself_and_json_always_prints(
    services: Settings, tmp_path: Path
) -> None:
    """Issue 26: a multi-file import goes on past a file it cannot import; the summary names it
    with its reason, exit 1, and --json prints every file's report."""
    samples2 = SAMPLES.parent / "samples2" / "mini-swe-agent"
    folder = tmp_path / "mixed"
    folder.mkdir()
    good = [
        "pr814-django__django-13660.traj.json",
        "pr816-reasoner-pylint-dev__astroid-1978.traj.json",
    ]
    for name in good:
        (folder / name).write_bytes((samples2 / name).read_bytes())
    (folder / "a-corrupt.traj.json").write_text('{"info": {}, "messages": [')  # cut short
    drifted = json.loads((samples2 / good[0]).read_text())
    drifted["messages"][2]["tool_calls"][0]["function"] = "bash"  # a field of another shape
    drifted["instance_id"] = "drifted__copy-1"  # a run of its own
    (folder / "c-drifted.traj.json").write_text(json.dumps(drifted))
    (folder / "b-not-mini.traj.json").write_text('{"info": {}, "trajectory": []}')
    d = PrivateDeployment(services, "imptol", ["tolerant"], tmp_path / "state")
    asyncio.run(d.create())
    try:
        done = _cli(d, "import", "mini-swe-agent", str(folder), "--fleet", "tolerant", "--json")
        assert done.returncode == 1, done.stdout[-2000:] + done.stderr
        reports = {Path(r["path"]).name: r for r in json.loads(done.stdout)}
        assert set(reports) == {
            *good,
            "a-corrupt.traj.json",
            "b-not-mini.traj.json",
            "c-drifted.traj.json",
        }
        # the record that cannot be mapped is skipped and counted; the rest of its file is sent
        assert reports["c-drifted.traj.json"]["unmapped"] == 1
        assert "error" not in reports["c-drifted.traj.json"]
        assert reports["c-drifted.traj.json"]["published"] > 0
        assert "not JSON" in reports["a-corrupt.traj.json"]["error"]
        assert "no 'messages' list" in reports["b-not-mini.traj.json"]["error"]
        django = reports["pr814-django__django-13660.traj.json"]
        assert django["calls"] == 46 and django["published"] == django["entries"] > 0
        assert reports["pr816-reasoner-pylint-dev__astroid-1978.traj.json"]["published"] > 0
        text = _cli(d, "import", "mini-swe-agent", str(folder), "--fleet", "tolerant")
        assert text.returncode == 1
        assert "2 of 5 files skipped" in text.stderr and "a-corrupt.traj.json" in text.stderr
        assert "1 records could not be mapped" in text.stderr
        assert "Traceback" not in text.stderr
    finally:
        d.drop()


def test_the_cli_and_the_api_agree_on_every_figure_of_the_samples(imported: Any) -> None:
    """Issue 29's must-show: every run imported from the sample pack, and the fleet's costs and
    failures, as ``--json`` prints them and as the API answers them."""
    d, by_file = imported
    compared, differ = cli_and_api_disagree(d.settings, FLEET)
    assert compared == len({r for rep in by_file.values() for r in rep["run_ids"]})
    assert differ == []


def test_a_follower_waits_for_a_streamed_response_to_end_however_quiet_the_file(
    imported: Any, tmp_path: Path
) -> None:
    """Claude Code writes one response as several lines of one message id, each with a larger
    usage, and a model may think for tens of seconds between them. Found trying the product: a
    follower took the first line once the file was quiet for 2 s and skipped the later ones as
    repeated usage (13 output tokens of 4,509). A last line with no stop reason now waits for
    the response's next line (up to the follower's bound)."""
    import uuid

    from schemas.codec import LedgerCodec
    from schemas.models import EntryKind, ModelUsagePart
    from schemas.topics import ledger_topic
    from streams.importers import claude_code
    from streams.importers.publish import follow
    from streams.source import read_all

    d, _ = imported
    source = SHARED / "samples2" / "claude-code" / "codemie-v2.0.76-session-196820da.jsonl"
    session = str(uuid.uuid4())
    docs = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    for doc in docs:
        if "sessionId" in doc:
            doc["sessionId"] = session
    # the first response written in several lines whose last one has its stop reason
    ids = [
        (doc.get("message") or {}).get("id") if doc.get("type") == "assistant" else None
        for doc in docs
    ]
    first = next(
        at
        for at, mid in enumerate(ids)
        if mid is not None
        and ids.count(mid) > 1
        and docs[max(i for i, m in enumerate(ids) if m == mid)]["message"].get("stop_reason")
    )
    last = max(i for i, m in enumerate(ids) if m == ids[first])
    path = tmp_path / "projects" / "p" / f"{session}.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(doc) + "\n" for doc in docs[: first + 1]))

    def outputs() -> list[int]:
        [run] = claude_code.import_file(path, FLEET)[0]
        return [
            p.output_tokens
            for e in run.entries
            if e.kind is EntryKind.MODEL_CALL
            for p in e.parts
            if isinstance(p, ModelUsagePart)
        ]

    sent: list[int] = []

    async def run_follower() -> None:
        stop = asyncio.Event()

        def report(_path: Path, _summary: Any, done: list[Any], error: str | None) -> None:
            assert error is None, error
            sent.extend(s.sent for s in done)

        task = asyncio.create_task(
            follow(d.settings, claude_code, [path.parent], FLEET, report, 0.1, stop, quiet_s=0.2)
        )
        settled = len(claude_code.import_file(path, FLEET, settled=True)[0][0].entries)
        await asyncio.sleep(2.0)  # ten times the quiet: the unfinished response must still wait
        waited = sum(sent)
        with path.open("a") as f:  # the rest of that response, then nothing more
            f.write("".join(json.dumps(doc) + "\n" for doc in docs[first + 1 : last + 1]))
        await asyncio.sleep(2.0)
        stop.set()
        await task
        assert waited == settled < sum(sent), (waited, settled, sent)

    asyncio.run(asyncio.wait_for(run_follower(), 60))
    [run] = claude_code.import_file(path, FLEET)[0]
    # what reached the ledger: every entry once, the response's call with its last usage
    records = asyncio.run(
        read_all(d.settings.kafka_address, [ledger_topic(d.settings.topic_prefix, FLEET)])
    )
    mine = [r for r in records if r.key == run.run_id.encode()]
    assert len(mine) == len(run.entries) == sum(sent)
    calls = [
        p.output_tokens
        for e in LedgerCodec().decode_many([r.value for r in mine if r.value is not None])
        if e.kind is EntryKind.MODEL_CALL
        for p in e.parts
        if isinstance(p, ModelUsagePart)
    ]
    assert calls == outputs() and calls[-1] > 50, calls  # the whole response's, not its first
