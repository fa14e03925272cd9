"""Docs as tests: every code block of the README, docs/ and schemas/JSON_FORM.md runs, or (for the
few that cannot run inside a test) is checked against what it names.

- ``jsonl``: written to the file the text names, published with the block that publishes it.
- ``python``: executed as written, with the deployment's ``AGENTLEDGER_*`` variables set.
- ``bash``: the quick start runs as ``agentledger demo`` (what ``make demo`` runs after making the
  venv); the record-a-run and rebuild blocks run line by line in a shell against a private
  deployment, each line must exit 0. Every line of every bash block is also checked: ``make``
  targets exist in the Makefile, exported variables are settings, and each ``agentledger`` line
  parses (command and options exist). Two lines cannot run here and are only checked so:
  ``make test`` (it is the command running this test) and the real-cluster ``export``s.
- ``json``: parsed strictly as a ledger entry. ``sql`` blocks of docs/ANALYTICS.md run in
  test_runs_cli.py; ``text`` blocks are prose.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from consumers.views import live_states
from infra.local import running_workers, server_running, stop_server, stop_worker
from infra.main import app
from infra.settings import Settings
from schemas.json_form import from_json, from_json_text
from streams.deployment import PrivateDeployment

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# The README (the front door), the manual under docs/ (ANALYTICS.md's sql blocks run in
# test_runs_cli.py) and the JSON form.
MANUAL = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS = [*(p for p in MANUAL if p.name != "ANALYTICS.md"), ROOT / "schemas" / "JSON_FORM.md"]
LANGUAGES = {"bash", "python", "json", "jsonl", "sql", "text"}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.M | re.S)
BIN = Path(sys.executable).parent


def blocks(path: Path, language: str | None = None) -> list[str]:
    """The fenced blocks of a Markdown file (of one language)."""
    found = FENCE.findall(path.read_text(encoding="utf-8"))
    return [body for lang, body in found if language is None or lang.strip() == language]


def manual_blocks(language: str) -> list[str]:
    """The blocks of one language in the README and docs/."""
    return [b for path in MANUAL for b in blocks(path, language)]


def commands(block: str) -> list[str]:
    """A bash block's command lines, comments and blank lines dropped."""
    lines = []
    for raw in block.replace("\\\n", " ").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def test_every_block_names_a_language_this_file_handles() -> None:
    for path in [*DOCS, ROOT / "docs" / "ANALYTICS.md"]:  # (ANALYTICS.md: sql blocks)
        langs = [lang.strip() for lang, _ in FENCE.findall(path.read_text(encoding="utf-8"))]
        assert langs or path.parent.name == "docs", path  # (a page of prose only)
        assert set(langs) <= LANGUAGES, (path, sorted(set(langs) - LANGUAGES))


# -- every bash line names things that exist -------------------------------------------------


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m for m in re.findall(r"^([a-z][\w.-]*):", text, re.M)}


def test_every_bash_line_names_a_real_target_setting_or_command() -> None:
    targets = _make_targets()
    runner = CliRunner()
    checked = 0
    for path in DOCS:
        for block in blocks(path, "bash"):
            for line in commands(block):
                words = shlex.split(line)
                if words[0] == "make":
                    assert set(words[1:]) <= targets, line
                elif words[0] == "export":
                    name = words[1].split("=", 1)[0]
                    assert name.startswith("AGENTLEDGER_"), line
                    assert name.removeprefix("AGENTLEDGER_").lower() in Settings.model_fields, line
                elif words[0] == "agentledger":
                    # --help after the arguments: click parses them all first, so an unknown
                    # command or option fails here with exit 2 (nothing connects anywhere).
                    result = runner.invoke(app, [*words[1:], "--help"])
                    assert result.exit_code == 0, f"{path.name}: {line}: {result.output}"
                else:
                    pytest.fail(f"{path.name}: a bash line this test cannot check: {line}")
                checked += 1
    assert checked >= 12


# -- the blocks that run ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def deployment(services: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    d = PrivateDeployment(services, "docs", ["fleet-01", "fleet-02"], tmp_path_factory.mktemp("d"))
    asyncio.run(d.create())
    try:
        yield d
    finally:
        d.drop()


def _env(d: PrivateDeployment, cwd: Path) -> dict[str, str]:
    return {
        **d.env(),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "AGENTLEDGER_STATE_DIR": str(cwd / ".agentledger"),
        "COLUMNS": "200",
    }


MARK = "::al-docs-line::"


def _shell(block: str, env: dict[str, str], cwd: Path) -> list[str]:
    """The block as one bash script (its exports carry to the lines after them), stopping at the
    first line that fails; returns each command line's output."""
    script = "set -euo pipefail\n" + "".join(f"echo {MARK}\n{line}\n" for line in commands(block))
    done = subprocess.run(
        ["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    outputs = done.stdout.split(MARK + "\n")[1:]
    assert len(outputs) == len(commands(block))
    return outputs


def _wait_applied(
    d: PrivateDeployment,
    run_id: str,
    seq: int,
    projection: str = "run-stats",
    timeout_s: float = 60,
) -> dict[str, Any]:
    """The run's live state once ``projection`` has applied it through ``seq``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = live_states(d.settings, projection, [run_id]).get(run_id)
        if found is not None and found["applied_seq"] == seq:
            return dict(found["state"])
        time.sleep(0.3)
    pytest.fail(f"{projection}: {run_id} not applied through seq {seq} within {timeout_s}s")


def _python(block: str, name: str, env: dict[str, str], cwd: Path, **names: Any) -> None:
    saved = dict(os.environ)
    here = Path.cwd()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        exec(compile(block, name, "exec"), {"__name__": "__docs__", **names})
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(saved)


def test_record_an_agent_run_as_documented(deployment: PrivateDeployment, tmp_path: Path) -> None:
    """schemas/JSON_FORM.md, "Record an agent run": the JSONL file, its commands, the sync and
    the async SDK, each as written; the runs land in the projections as the text says."""
    d = deployment
    d.fleets.append("acme")  # the docs' fleet (its topics dropped with the deployment)
    env = _env(d, tmp_path)
    worker = d.start_worker("docs-worker")
    d.wait_partitions("docs-worker")
    doc = ROOT / "schemas" / "JSON_FORM.md"
    [jsonl] = blocks(doc, "jsonl")
    (tmp_path / "run-42.jsonl").write_text(jsonl)
    lines = jsonl.splitlines()
    assert len(lines) == 9 and all(from_json_text(line).run_id == "run-42" for line in lines)
    publish, query = [b for b in blocks(doc, "bash")]

    created, published = _shell(publish, env, tmp_path)
    assert "created " in created and ".ledger.acme" in created
    assert "published 9 entries (acme=9)" in published
    time.sleep(3)  # the worker finds the new fleet's topic (AGENTLEDGER_WORKER_FLEET_SCAN_S)
    _wait_applied(d, "run-42", 9)
    cost = _wait_applied(d, "run-42", 9, "cost-metrics")
    assert Decimal(cost["task_budget_usd"]) == Decimal("0.50"), cost
    assert cost["totals"]["calls"] == 1 and not cost["over_budget"], cost
    assert worker.poll() is None

    runs, timeline, costs = _shell(query, env, tmp_path)
    assert "run-42" in runs and "succeeded" in runs
    rows = json.loads(timeline)
    assert rows["run_id"] == "run-42" and rows["status"] == "SUCCEEDED"
    assert rows["repository"] == "github.com/acme/api" and rows["base_sha"] == "9f2c1e0", rows
    said = json.dumps(rows)
    assert "Make the CSV exporter stream rows instead of buffering them" in said
    assert "I will read the exporter first." in said
    # 1,200 uncached in at $3/M + 4,000 cached at $0.30/M + 310 out at $15/M
    assert "run-42" in costs and "$0.0094" in costs, costs

    sync_block, async_block = [b for b in blocks(doc, "python") if "Publisher" in b]
    _python(sync_block, "JSON_FORM.md:sync", env, tmp_path)  # the same file again: duplicates
    _python(async_block, "JSON_FORM.md:async", env, tmp_path)
    stats = _wait_applied(d, "run-43", 4)
    assert stats["status"] == "SUCCEEDED", stats
    cost = _wait_applied(d, "run-43", 4, "cost-metrics")
    # 900 uncached in at $3/M + 3,000 cached at $0.30/M + 120 out at $15/M
    assert cost["totals"]["calls"] == 1 and Decimal(cost["totals"]["cost_usd"]) == Decimal(
        "0.0054"
    ), cost
    again = live_states(d.settings, "run-stats", ["run-42"])["run-42"]
    assert again["applied_seq"] == 9 and again["state"]["entries"] == 9  # sent twice, once


def test_the_json_form_examples_hold(deployment: PrivateDeployment) -> None:
    doc = ROOT / "schemas" / "JSON_FORM.md"
    [example] = blocks(doc, "json")
    entry = from_json(json.loads(example))
    [intro] = [b for b in blocks(doc, "python") if "to_json" in b]
    _python(intro, "JSON_FORM.md:intro", {}, ROOT, entry=entry)


def test_the_readme_publisher_example_runs(deployment: PrivateDeployment, tmp_path: Path) -> None:
    from schemas.topics import ledger_topic
    from streams.simulate import simulate
    from streams.source import read_all

    d = deployment
    [block] = [b for b in manual_blocks("python") if "Publisher" in b]
    run = simulate(1, 1, seed=77)
    _python(block, "README.md", _env(d, tmp_path), tmp_path, entries=run)
    records = asyncio.run(
        read_all(d.settings.kafka_address, [ledger_topic(d.settings.topic_prefix, "fleet-01")])
    )
    assert {r.key for r in records} >= {run[0].run_id.encode()}


@pytest.fixture
def own_deployment(services: Settings, tmp_path: Path) -> Iterator[PrivateDeployment]:
    d = PrivateDeployment(services, "docs1", ["fleet-01", "fleet-02"], tmp_path / "logs")
    asyncio.run(d.create())
    try:
        yield d
    finally:
        d.drop()


def test_the_readme_rebuild_block_runs(own_deployment: PrivateDeployment, tmp_path: Path) -> None:
    """README "Rebuild by replay", as written: a new price table, a rebuild beside the live
    build, the swap, verify, and dropping the old build."""
    d = own_deployment
    env = _env(d, tmp_path)
    [block] = [b for b in manual_blocks("bash") if "rebuild swap" in b]
    table = json.loads((ROOT / "projectors" / "data" / "prices.v1.json").read_text())
    table["version"] = "2026-12-01"
    (tmp_path / "prices-2026-12.json").write_text(json.dumps(table))
    d.start_worker("docs-rebuild")
    d.wait_partitions("docs-rebuild")
    _shell("agentledger simulate --fleets 1 --runs 3 --seed 5 --publish", env, tmp_path)
    for _ in range(100):  # the worker made cost-metrics' first build, v4-1
        if "v4-1" in _shell("agentledger rebuild list", env, tmp_path)[0]:
            break
        time.sleep(0.3)
    outputs = _shell(block, env, tmp_path)
    built, listed, swapped, verified, dropped = outputs[1:]
    assert "v4-2" in built and "v4-2" in listed and "v4-1" in listed
    assert "2026-12-01" in listed  # the new build's price table, beside the live one's
    assert "equal" in verified.lower(), verified
    assert "v4-2" in swapped and "v4-1" in dropped, (swapped, dropped)


def test_the_quick_start_demo_runs(own_deployment: PrivateDeployment, tmp_path: Path) -> None:
    """``make demo`` is the venv, then ``agentledger demo``: run here against a private
    deployment (its services are external to it, so it starts none)."""
    d = own_deployment
    env = _env(d, tmp_path)
    [quick] = [b for b in manual_blocks("bash") if "make demo" in b]
    assert (
        "make demo" in quick
        and "demo: $(STAMP)\n\t$(BIN)/agentledger demo" in (ROOT / "Makefile").read_text()
    )
    try:
        done = subprocess.run(
            [str(BIN / "agentledger"), "demo"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        assert "published" in done.stdout and "timeline:" in done.stdout
        # the demo's web server: its sign-in URL opens the runs list of the demo's runs
        [login] = re.findall(
            r"^web: (http://127\.0\.0\.1:\d+/login\?token=\S+)$", done.stdout, re.M
        )
        with httpx.Client(follow_redirects=True) as client:
            page = client.get(login)
        assert page.url.path == "/runs" and page.text.count('<td class="outcome">') >= 14
    finally:
        settings = d.settings.model_copy(update={"state_dir": tmp_path / ".agentledger"})
        stop_server(settings, Console(file=io.StringIO()))
        stop_worker(settings, Console(file=io.StringIO()))
        assert not running_workers(settings) and server_running(settings) is None


def test_every_relative_link_of_the_docs_resolves() -> None:
    """The README links into docs/; a moved or renamed page breaks no link."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    broken = [
        f"{path.relative_to(ROOT)} -> {target}"
        for path in [*MANUAL, ROOT / "schemas" / "JSON_FORM.md"]
        for target in link.findall(path.read_text(encoding="utf-8"))
        if "://" not in target and not (path.parent / target).exists()
    ]
    assert broken == []
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert all(f"(docs/{p.name})" in readme for p in (ROOT / "docs").glob("*.md"))
