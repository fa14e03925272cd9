"""Every command answers a bad argument with one line and exit code 2, never a traceback.

Each command runs as a user would run it (the installed entry point, a subprocess) with the
services pointed at closed ports: a command that connected before checking its arguments would
fail differently (or hang, and time out here).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from infra.main import app

BAD: dict[str, list[str]] = {
    "infra up": ["infra", "up", "--bogus"],
    "infra down": ["infra", "down", "--bogus"],
    "infra status": ["infra", "status", "--bogus"],
    "topics create": ["topics", "create", "--fleet", "bad fleet!"],
    "topics list": ["topics", "list", "--bogus"],
    "simulate": ["simulate", "--length-profile", "bogus", "--out", "x.jsonl"],
    "publish": ["publish", "missing.jsonl"],
    "import": ["import", "telepathy-agent", "some.jsonl"],
    "otlp": ["otlp", "--port", "99999"],
    "dlq list": ["dlq", "list", "--fleet", "bad fleet!"],
    "dlq redrive": ["dlq", "redrive", "--fleet", "../etc"],
    "dlq dismiss": ["dlq", "dismiss", "not-a-source", "--reason", "seen"],
    "worker": ["worker", "--projections", "bogus"],
    "bench": ["bench", "--mix", "bogus"],
    "memory": ["memory", "run-1", "--at", "soon"],
    "context": ["context"],
    "timeline": ["timeline"],
    "costs": ["costs", "--by", "bogus"],
    "failures": ["failures", "--since", "last tuesday"],
    "demo": ["demo", "--bogus"],
    "runs": ["runs", "--status", "bogus"],
    "mcp": ["mcp", "--bogus"],
    "mcp-audit": ["mcp-audit", "--bogus"],
    "rebuild": ["rebuild", "bogus"],
    "verify": ["verify", "bogus"],
    "replay-package": ["replay-package"],
    "subscribe": ["subscribe", "bogus"],
    "artifact get": ["artifact", "get", "not-a-sha"],
    "subscribe --from-time": ["subscribe", "cost-metrics", "--from-time", "last tuesday"],
    "serve": ["serve", "--port", "99999"],
    "tokens create": ["tokens", "create", "--fleet", "bad fleet!"],
    "tokens create --expires": ["tokens", "create", "--fleet", "fleet-01", "--expires", "soon"],
    "tokens list": ["tokens", "list", "--bogus"],
    "tokens revoke": ["tokens", "revoke"],
    "(unknown command)": ["bogus"],
}


def _commands(group: Any = None, prefix: str = "") -> set[str]:
    group = group or typer.main.get_command(app)
    names = set()
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            names |= _commands(command, f"{prefix}{name} ")
        else:
            names.add(f"{prefix}{name}")
    return names


def test_the_sweep_covers_every_command() -> None:
    assert _commands() == {name.split(" --")[0] for name in BAD} - {"(unknown command)"}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_argument_is_one_line_and_exit_2(name: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AGENTLEDGER_KAFKA_BOOTSTRAP": "127.0.0.1:1",
        "AGENTLEDGER_PG_DSN": "postgresql://127.0.0.1:1/none?connect_timeout=1",
        "AGENTLEDGER_REDIS_URL": "redis://127.0.0.1:1/0",
        "AGENTLEDGER_STATE_DIR": str(tmp_path / "state"),
        "COLUMNS": "80",
    }
    done = subprocess.run(
        [sys.executable, "-c", "from infra.main import main; main()", *BAD[name]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    assert done.returncode == 2, output
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert not (tmp_path / "state").exists(), "nothing was started or written"
