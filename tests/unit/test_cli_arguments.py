"""Every command answers a bad argument with one line and exit code 2, never a traceback.

Each command runs in a process of its own, the entry point's ``main()`` with the command line as
a user gives it, with the services pointed at closed ports: a command that connected before
checking its arguments would fail differently (or hang, and time out here). The processes are
forked from one server that imported the CLI once (importing it is most of a command's start-up
and was most of this file's time when each case started Python afresh).
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from collections.abc import Callable, Iterator
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


# Forks a child per request (a JSON line: argv, cwd, env, where its stdout and stderr go), runs
# the CLI's main() in it as `agentledger ARGV` would, and answers the child's exit code.
_SERVER = r"""
import json, os, sys, traceback
from infra.main import main
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.chdir(request["cwd"])
        os.environ.update(request["env"])
        for fd, path in ((1, request["out"]), (2, request["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = ["agentledger", *request["argv"]]
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
"""

Run = Callable[[list[str], Path, dict[str, str]], tuple[int, str, str]]


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    env = {
        **os.environ,
        "AGENTLEDGER_KAFKA_BOOTSTRAP": "127.0.0.1:1",
        "AGENTLEDGER_PG_DSN": "postgresql://127.0.0.1:1/none?connect_timeout=1",
        "AGENTLEDGER_REDIS_URL": "redis://127.0.0.1:1/0",
        "COLUMNS": "80",
    }
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path_factory.mktemp("cli"),
        start_new_session=True,
    )
    assert server.stdin is not None and server.stdout is not None
    replies = selectors.DefaultSelector()
    replies.register(server.stdout, selectors.EVENT_READ)

    def run(argv: list[str], cwd: Path, extra: dict[str, str]) -> tuple[int, str, str]:
        assert server.stdin is not None and server.stdout is not None
        out, err = cwd / "stdout.txt", cwd / "stderr.txt"
        request = {"argv": argv, "cwd": str(cwd), "env": extra, "out": str(out), "err": str(err)}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        if not replies.select(timeout=60):  # a command that hangs (e.g. connected first)
            os.killpg(server.pid, 9)
            pytest.fail(f"agentledger {' '.join(argv)}: no exit within 60 s")
        code = int(json.loads(server.stdout.readline())["code"])
        return code, out.read_text(), err.read_text()

    try:
        yield run
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=30)
        finally:
            if server.poll() is None:
                os.killpg(server.pid, 9)
            replies.close()
            server.stdout.close()


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_argument_is_one_line_and_exit_2(name: str, tmp_path: Path, cli: Run) -> None:
    work = tmp_path / "work"
    work.mkdir()
    code, stdout, stderr = cli(BAD[name], work, {"AGENTLEDGER_STATE_DIR": str(tmp_path / "state")})
    output = stdout + stderr
    assert "Traceback" not in output, output
    assert code == 2, output
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert not (tmp_path / "state").exists(), "nothing was started or written"


def test_serve_on_a_taken_port_says_why_before_saying_serving() -> None:
    """Found trying the product: `serve` on a taken port printed "serving http://..." and then
    failed with a traceback-like [Errno 98] line (exit 3)."""
    import socket

    from typer.testing import CliRunner

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert done.exit_code == 1, done.output
    assert f"cannot listen on 127.0.0.1:{port}" in done.output
    assert "serving" not in done.output


def test_an_unknown_fleet_is_one_rule_for_every_command() -> None:
    from infra.cli_support import check_fleets

    asked: list[str] = []

    def kafka() -> list[str]:
        asked.append("kafka")
        return ["a", "b"]

    check_fleets(["a"], lambda f: {"a"}, kafka)  # has runs: Kafka is not asked
    assert asked == []
    check_fleets(["b"], lambda f: set(), kafka)  # a topic, no run yet: exists
    with pytest.raises(typer.Exit) as ended:
        check_fleets(["a", "nosuch"], lambda f: {"a"}, kafka)
    assert ended.value.exit_code == 1

    def down() -> list[str]:
        raise OSError("no broker")

    check_fleets(["nosuch"], lambda f: set(), down)  # cannot say: goes on (with a note)
