"""The project's state folder is found from anywhere inside the project, and running workers
note themselves there (``infra status`` lists them)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import local
from infra.settings import Settings


def test_the_state_folder_is_found_from_a_subfolder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTLEDGER_STATE_DIR", raising=False)
    project = tmp_path / "proj"
    deep = project / "streams" / "deeper"
    deep.mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "agentledger"\n')
    monkeypatch.chdir(deep)
    assert Settings().state_dir == project / ".agentledger"
    other = tmp_path / "elsewhere" / "sub"
    other.mkdir(parents=True)
    (tmp_path / "elsewhere" / ".agentledger").mkdir()
    monkeypatch.chdir(other)
    assert Settings().state_dir == tmp_path / "elsewhere" / ".agentledger"
    monkeypatch.chdir(tmp_path)
    assert Settings().state_dir == tmp_path / ".agentledger"  # outside any project: here


def test_running_workers_are_listed_and_dead_ones_forgotten(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    script = (
        "import sys, time; from infra.local import register_worker; "
        "from infra.settings import Settings; "
        f"register_worker(Settings(state_dir={str(settings.state_dir)!r}), 'agent'); "
        "print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        [worker] = local.running_workers(settings)
        assert worker["pid"] == proc.pid and worker["projections"] == "agent"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    time.sleep(0.1)
    assert local.running_workers(settings) == []
    assert not list((settings.state_dir / "workers").glob("*.json")), "the dead one's note gone"
    json.dumps(worker)  # a note is plain JSON (infra status --json prints it)
