"""Issue 26: a 500-file import of mixed formats in one command (`import auto`): every log of both
sample packs (folders as they are, subagent files beside their sessions), synthetic mini-swe-agent
trajectories to make 500 (short ones: the bench's import figure takes 500 of real length), a
corrupt file and a README among them. Each file's format is recognised by its content; the
corrupt file skips only itself with its reason; the README is left out; `--json` prints every
file's report; a second import publishes nothing."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.settings import Settings
from streams.bench_import import write_trajectories
from streams.deployment import PrivateDeployment
from tests.packs import SHARED

pytestmark = pytest.mark.integration

PACK_LOGS = {
    "samples": [
        "claude-code",
        "codex",
        "openhands",
        "mini-swe-agent",
        "swe-agent",
        "otel-genai",
        "aider",
    ],
    "samples2": [
        "claude-code",
        "codex",
        "openhands",
        "openhands-llm-logs",
        "mini-swe-agent",
        "swe-agent",
        "aider",
    ],
}
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


def _cli(d: PrivateDeployment, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.main", *args],
        env={**d.env(), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_five_hundred_files_of_mixed_formats_import_in_one_command(
    services: Settings, tmp_path: Path
) -> None:
    mixed = tmp_path / "mixed"
    for pack, folders in PACK_LOGS.items():
        for folder in folders:
            shutil.copytree(SHARED / pack / folder, mixed / pack / folder)
    (mixed / "samples2" / "swe-agent" / "pr843-portalocker_madeup_cmd-all_preds.jsonl").unlink()
    logs = sum(1 for p in mixed.rglob("*") if p.is_file())
    (mixed / "README.md").write_text("# notes\nnot a log\n")
    (mixed / "broken" / "cut.traj.json").parent.mkdir()
    (mixed / "broken" / "cut.traj.json").write_text('{"info": {}, "messages": [{"role": ')
    # many files, not many entries: ~25 entries each (the bench imports 500 of real length)
    write_trajectories(mixed / "synthetic", 470, "mixed", longest=25)
    files = sum(1 for p in mixed.rglob("*") if p.is_file())
    assert files >= 500, files

    d = PrivateDeployment(services, "mixed", ["mixed"], tmp_path / "state")
    asyncio.run(d.create())
    try:
        done = _cli(d, "import", "auto", str(mixed), "--fleet", "mixed", "--json")
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        assert done.returncode == 1, done.stderr[-3000:]  # the corrupt file
        reports = {Path(r["path"]): r for r in json.loads(done.stdout)}
        [broken] = [r for p, r in reports.items() if p.name == "cut.traj.json"]
        assert "neither JSON nor JSON lines" in broken["error"]
        assert not any(p.name == "README.md" for p in reports)
        errors = {p: r["error"] for p, r in reports.items() if "error" in r}
        assert list(errors) == [mixed / "broken" / "cut.traj.json"], errors
        for path, report in reports.items():
            if "error" in report:
                continue
            assert report["published"] == report["entries"] > 0, path
            top = path.relative_to(mixed).parts
            if top[0] in PACK_LOGS:
                assert f"recognised as {FOLDER_FORMAT[top[1]]}" in report["notes"], path
            else:
                assert "recognised as mini-swe-agent" in report["notes"], path
        # every log file is in a report (the OpenHands session and completion-log folders as
        # one report each: their files count once)
        in_folders = sum(1 for p in reports if p.is_dir() for f in p.rglob("*") if f.is_file())
        assert len(reports) - sum(1 for p in reports if p.is_dir()) + in_folders == (logs + 470 + 1)

        again = _cli(d, "import", "auto", str(mixed), "--fleet", "mixed", "--json")
        assert again.returncode == 1, again.stderr[-3000:]
        assert sum(r["published"] for r in json.loads(again.stdout)) == 0
        text = _cli(d, "import", "auto", str(mixed / "broken"), str(mixed / "README.md"))
        assert text.returncode == 1
        assert "2 of 2 files skipped" in text.stderr and "not a log of any format" in text.stderr
    finally:
        d.drop()
