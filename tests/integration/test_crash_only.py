"""The worker is crash-only (issue 25): whatever goes wrong inside the faust process ends it
with a non-zero exit and one line saying why, a stop is bounded, a stall ends it, and
``agentledger worker`` starts it again; ``infra status`` shows restarts, the last reason, and
exits non-zero while a worker is stalled."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from consumers.views import live_states
from infra.settings import Settings
from schemas.factory import EntryBuilder
from schemas.models import EntryKind, LedgerEntry, RunStatus
from streams.deployment import PrivateDeployment
from streams.publisher import AsyncPublisher

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "infra.main"]


def _app(mode: str, watchdog_s: float = 600) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.integration.crash_app", mode),
            *(f"crash-{uuid.uuid4().hex[:8]}", str(watchdog_s)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _ends(proc: subprocess.Popen[str], within_s: float) -> tuple[int, list[str]]:
    out, _ = proc.communicate(timeout=within_s)
    lines = [line for line in out.splitlines() if "agentledger worker (pid" in line]
    return proc.returncode, lines


@pytest.mark.parametrize(
    ("mode", "why"),
    [("crash", "App crashed: RuntimeError: a timer failed"), ("agent", "an agent failed")],
)
def test_a_crashed_faust_service_or_agent_ends_the_process_with_one_line(
    services: Settings, mode: str, why: str
) -> None:
    code, lines = _ends(_app(mode), within_s=60)
    assert code == 71
    assert len(lines) == 1 and "exit 71: faust service" in lines[0] and why in lines[0], lines


def _wait_for(proc: subprocess.Popen[str], text: str, timeout_s: float = 60) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        if text in line:
            return
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s}s"
    raise AssertionError(f"ended before {text!r}")


def test_sigterm_ends_the_process_within_the_stop_timeout_even_with_the_loop_blocked(
    services: Settings,
) -> None:
    proc = _app("block")
    _wait_for(proc, "tick block")  # the loop is now blocked in a timer for 600 s
    proc.send_signal(signal.SIGTERM)
    asked = time.monotonic()
    code, lines = _ends(proc, within_s=30)
    assert code == 73 and time.monotonic() - asked < 6  # the app's stop timeout is 3 s
    assert "did not stop within 3s of being asked (stopped by SIGTERM)" in lines[0]


def test_a_blocked_event_loop_is_a_stall_that_ends_the_process(services: Settings) -> None:
    code, lines = _ends(_app("block", watchdog_s=4), within_s=60)
    assert code == 72 and "stalled: the event loop has not run for" in lines[0], lines


def test_sigterm_stops_an_idle_app_cleanly(services: Settings) -> None:
    proc = _app("idle")
    _wait_for(proc, "tick idle")
    proc.send_signal(signal.SIGTERM)
    code, lines = _ends(proc, within_s=30)
    assert code == 0 and not lines


# -- the real worker ---------------------------------------------------------------------


@pytest.fixture
def deployment(services: Settings, tmp_path: Path) -> Iterator[PrivateDeployment]:
    env = {
        "AGENTLEDGER_WORKER_SESSION_TIMEOUT_S": "6",
        "AGENTLEDGER_WORKER_STALL_S": "8",
        "AGENTLEDGER_WORKER_HEALTH_S": "1",
    }
    d = PrivateDeployment(services, "crashonly", ["fleet-01"], tmp_path, env)
    asyncio.run(d.create())
    yield d
    d.drop()


def _run(run_id: str, entries: int) -> list[LedgerEntry]:
    b = EntryBuilder(run_id, fleet_id="fleet-01")
    b.add(EntryKind.RUN_STARTED)
    for _ in range(entries - 2):
        b.add(EntryKind.USER_TASK)
    b.add(EntryKind.RUN_FINISHED, run_status=RunStatus.SUCCEEDED)
    return b.entries


def _publish(d: PrivateDeployment, entries: list[LedgerEntry]) -> None:
    async def go() -> None:
        async with AsyncPublisher(d.settings) as publisher:
            await publisher.publish_batch(entries)

    asyncio.run(go())


def _applied(d: PrivateDeployment, run_id: str, seq: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        found = live_states(d.settings, "run-stats", [run_id]).get(run_id)
        if found is not None and found["applied_seq"] == seq:
            return
        assert time.monotonic() < deadline, f"{run_id} not at {seq} after {timeout_s}s"
        time.sleep(0.2)


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _status(d: PrivateDeployment, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "infra", "status", "--json"],
        env={**d.env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_supervisor_kills_and_restarts_a_frozen_faust_process(
    deployment: PrivateDeployment,
) -> None:
    """A faust process frozen as a whole (found trying the product: SIGSTOP; a hang holding the
    interpreter is the same) cannot end itself; its watchdog thread's sign of life stops, and
    the supervisor kills it and starts another (stall 8 s + 2 health intervals + 10 s)."""
    d = deployment
    worker = d.start_worker("frozen")
    _publish(d, _run("run-before", 3))
    _applied(d, "run-before", 3, 60)
    (child,) = _children(worker.pid)
    subprocess.run(["kill", "-STOP", str(child)], check=True)
    try:
        _publish(d, _run("run-after", 4))
        _applied(d, "run-after", 4, 90)  # by the faust process started in its place
    finally:
        subprocess.run(["kill", "-CONT", str(child)], check=False)
    (again,) = _children(worker.pid)
    assert again != child and worker.poll() is None
    log = d.log_of("frozen").read_text()
    assert f"the faust process (pid {child}) has given no sign of life for" in log
    assert "(frozen); killing it" in log
    assert "(killed by SIGKILL: frozen: no sign of life for" in log  # the reason status shows


def test_the_supervisor_restarts_a_killed_faust_process_and_status_says_why(
    deployment: PrivateDeployment,
) -> None:
    d = deployment
    _publish(d, _run("run-one", 3))
    # before any worker: status says the entries wait and nothing applies them (found trying
    # the product: it said nothing, and exited 0, with every worker gone)
    shown = _status(d)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "nothing is applying: 3 entries wait and no worker reports" in shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["nothing_applying"] is True and sum(doc["waiting"].values()) == 3
    worker = d.start_worker("w")
    _applied(d, "run-one", 3, 60)
    (child,) = _children(worker.pid)
    subprocess.run(["kill", "-KILL", str(child)], check=True)
    _publish(d, _run("run-two", 4))
    _applied(d, "run-two", 4, 60)  # applied by the faust process started again
    (again,) = _children(worker.pid)
    assert again != child and worker.poll() is None
    log = d.log_of("w").read_text()
    assert f"the faust process (pid {child}) ended after" in log
    assert "(killed by SIGKILL); starting it again in 1s (restart 1)" in log

    shown = _status(d)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    doc = json.loads(shown.stdout)
    (mine,) = [w for w in doc["workers"] if w["pid"] == worker.pid]
    assert mine["restarts"] == 1 and mine["last_exit"] == "killed by SIGKILL"
    assert mine["child_pid"] == again
    deadline = time.monotonic() + 15
    while True:
        rows = json.loads(_status(d).stdout)["worker_health"]
        # One row per supervised worker, kept across its faust processes.
        mine_now = [h for h in rows if h["worker_id"].endswith(f":{worker.pid}")]
        if mine_now and mine_now[0]["pid"] == again and mine_now[0]["lag"]:
            break
        assert time.monotonic() < deadline, f"the new faust process never reported: {rows}"
        time.sleep(1)
    (row,) = mine_now
    assert row["restarts"] == 1 and row["last_exit"] == "killed by SIGKILL"
    assert row["state"] == "ok" and row["behind"] == 0 and row["lag"]
    assert not [h for h in rows if h["pid"] == child]  # the killed process reports nothing
    assert json.loads(_status(d).stdout)["waiting"] == {}  # every entry applied

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=40) == 0
    assert not Path(f"/proc/{again}").exists()
    rows = json.loads(_status(d).stdout)["worker_health"]
    assert not [h for h in rows if h["worker_id"].endswith(f":{worker.pid}")]  # stopped: gone


def test_a_worker_that_cannot_apply_is_stalled_exits_and_is_restarted(
    deployment: PrivateDeployment,
) -> None:
    d = deployment
    worker = d.start_worker("w")
    _publish(d, _run("run-before", 3))
    _applied(d, "run-before", 3, 60)
    (child,) = _children(worker.pid)
    with psycopg.connect(d.settings.pg_address) as blocker:
        # Hold the offsets table against writers: the worker's next batch waits on the lock (a
        # real stall: a stuck transaction, a lock nobody releases).
        blocker.execute("LOCK TABLE al_offsets IN SHARE ROW EXCLUSIVE MODE")
        _publish(d, _run("run-blocked", 5))
        # status (with a shorter stall setting than the worker's) sees the stall and says so
        deadline = time.monotonic() + 30
        while True:
            shown = _status(d, AGENTLEDGER_WORKER_STALL_S="2")
            if shown.returncode == 1:
                break
            assert time.monotonic() < deadline, shown.stdout + shown.stderr
            time.sleep(0.5)
        said = f"stalled: worker {socket.gethostname()}:{worker.pid} (faust pid {child}) has"
        assert said in shown.stderr, shown.stderr
        stalled = json.loads(shown.stdout)["stalled"]
        assert len(stalled) == 1 and stalled[0].endswith(f":{worker.pid}"), stalled
        # the worker itself ends (over its 8 s stall setting) and is started again
        deadline = time.monotonic() + 40
        while f"the faust process (pid {child}) ended" not in d.log_of("w").read_text():
            assert time.monotonic() < deadline, d.log_of("w").read_text()[-3000:]
            time.sleep(0.5)
        blocker.rollback()
    log = d.log_of("w").read_text()
    assert "exit 72: stalled: one batch has been applying for" in log, log[-3000:]
    _applied(d, "run-blocked", 5, 60)  # and the new process applies what was waiting
    assert worker.poll() is None
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=40) == 0
