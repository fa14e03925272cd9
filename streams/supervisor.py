"""``agentledger worker``: a small supervisor that keeps one faust worker process running.

The faust process is crash-only (:mod:`streams.worker`): a crashed service, a stall, a fatal
batch or new fleet topics end it with an exit code and one line saying why. This parent starts
it again: at once when it asked for that (new topics), else after a backoff of 1 s doubling to
``AGENTLEDGER_WORKER_RESTART_MAX_BACKOFF_S`` (a process that ran for a minute starts the count
again). SIGTERM/SIGINT are passed on, and the child is SIGKILLed after ``STOP_TIMEOUT_S``; the
child dies with this process (``PR_SET_PDEATHSIG``), so killing the supervisor never leaves an
unsupervised worker behind. Platforms that supervise (systemd, Kubernetes) run
``agentledger worker --no-restart`` instead, and restart it on a non-zero exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from infra.local import register_worker
from infra.settings import Settings
from streams.health import forget_worker, restarting

EXIT_RESTART = 75  # streams.worker.EXIT_RESTART (not imported: faust stays out of this process)
# streams.worker.EXIT_CONFIG: a setting no restart can mend (the database holds another
# deployment): the supervisor ends with it instead of starting the process again forever
EXIT_CONFIG = 78
HEALTHY_RUN_S = 60.0  # a child that ran this long resets the backoff
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def describe_exit(code: int, reason: str | None) -> str:
    """``exit 71: faust service Fetcher crashed: ...`` or ``killed by SIGKILL``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (f": {reason}" if reason else "")
    return f"exit {code}" + (f": {reason}" if reason else "")


def stopped_code(code: int) -> int:
    """The supervisor's exit code once asked to stop, from its child's (pure): a clean end, the
    SIGTERM passed on, or a child that was just leaving to restart onto new fleet topics (it
    will not be restarted: nothing is lost) is 0; anything else is the child's failure."""
    return 0 if code in (0, -signal.SIGTERM, EXIT_RESTART) else code


def next_delay(code: int, ran_s: float, previous: float, max_s: float) -> float:
    """How long to wait before the next start (pure)."""
    if code == EXIT_RESTART:
        return 0.0
    if ran_s >= HEALTHY_RUN_S or previous <= 0:
        return 1.0
    return min(previous * 2, max_s)


# the file the faust process's watchdog thread touches every second (named by the supervisor)
SIGN_OF_LIFE_ENV = "AGENTLEDGER_WORKER_SIGN_OF_LIFE"
# a frozen faust process is killed this long after its watchdog would have ended a stalled loop
FROZEN_MARGIN_S = 10.0


def watchdog_limit_s(settings: Settings) -> float:
    """How long the faust process's event loop may be silent before it ends itself: the loop
    beats once per health interval; its own stall is declared after the stall setting on top."""
    return settings.worker_stall_s + 2 * settings.worker_health_s


class SignOfLife:
    """How long the faust process has given no sign of life, timed on this process's monotonic
    clock (a wall clock steps, and a suspended machine's wall time jumps on resume; monotonic
    time stands still while suspended): from when the file's modification time last changed."""

    def __init__(self, began_wall: float) -> None:
        self.began_wall = began_wall
        self.touched: float | None = None  # the file's last modification time seen
        self.seen_at = 0.0  # (monotonic) when it was seen to change

    def silent_s(self, touched: float | None, now: float) -> float:
        """Seconds without a change of the file (``touched``: its modification time, None
        when there is none); 0 before the first sign (still starting; a start that hangs is
        bounded by its own timeouts), or for a file left by an earlier process."""
        if touched is None or touched < self.began_wall:
            return 0.0
        if touched != self.touched:
            self.touched, self.seen_at = touched, now
        return now - self.seen_at


def _touched(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


class Supervisor:
    def __init__(self, settings: Settings, child_args: Sequence[str], projections: str) -> None:
        self.settings = settings
        self.child_args = list(child_args)
        self.projections = projections
        self.stopping: str | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.last_exit: str | None = None
        self.frozen: str | None = None  # why the supervisor killed its child, if it did
        self.sign_of_life: Path | None = None
        self.life = SignOfLife(0.0)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = signal.Signals(signum).name
        child = self.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        folder = self.settings.state_dir / "workers"
        folder.mkdir(parents=True, exist_ok=True)
        exit_file = folder / f"{os.getpid()}.exit"
        self.sign_of_life = folder / f"{os.getpid()}.alive"
        note = register_worker(self.settings, self.projections)
        delay = 0.0
        try:
            while self.stopping is None:
                exit_file.unlink(missing_ok=True)
                self.sign_of_life.unlink(missing_ok=True)
                self.frozen = None
                began = time.monotonic()
                self.life = SignOfLife(time.time())
                self.child = self._start(exit_file)
                register_worker(
                    self.settings,
                    self.projections,
                    child_pid=self.child.pid,
                    restarts=self.restarts,
                    last_exit=self.last_exit,
                )
                code = self._wait()
                reason = self.frozen or _read(exit_file)
                if self.stopping is not None:
                    if stopped_code(code) != 0:  # never silent: how it ended, in one line
                        _say(
                            f"agentledger worker: the faust process (pid {self.child.pid}) "
                            f"ended while stopping: {describe_exit(code, reason)}"
                        )
                    return stopped_code(code)
                if code == EXIT_CONFIG:
                    _say(f"agentledger worker: not started again: {describe_exit(code, reason)}")
                    return code
                self.restarts += 1
                self.last_exit = describe_exit(code, reason)
                restarting(self.settings.pg_address, os.getpid(), self.restarts, self.last_exit)
                ran = time.monotonic() - began
                delay = next_delay(code, ran, delay, self.settings.worker_restart_max_backoff_s)
                _say(
                    f"agentledger worker: the faust process (pid {self.child.pid}) ended after "
                    f"{ran:.0f}s ({self.last_exit}); starting it again in {delay:g}s "
                    f"(restart {self.restarts})"
                )
                self._sleep(delay)
            return 0
        finally:
            forget_worker(self.settings.pg_address, os.getpid())
            exit_file.unlink(missing_ok=True)
            self.sign_of_life.unlink(missing_ok=True)
            note.unlink(missing_ok=True)

    def _start(self, exit_file: Path) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "AGENTLEDGER_WORKER_SUPERVISOR": str(os.getpid()),
            "AGENTLEDGER_WORKER_RESTARTS": str(self.restarts),
            "AGENTLEDGER_WORKER_LAST_EXIT": self.last_exit or "",
            "AGENTLEDGER_WORKER_EXIT_FILE": str(exit_file),
            SIGN_OF_LIFE_ENV: str(self.sign_of_life),
        }
        return subprocess.Popen(
            [sys.executable, "-m", "infra.main", "worker", "--no-restart", *self.child_args],
            env=env,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # only a prctl call between fork and exec
        )

    def _wait(self) -> int:
        """The child's exit code; once stopping, SIGKILL after the stop timeout."""
        assert self.child is not None
        child = self.child
        deadline: float | None = None
        while True:
            try:
                return child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if self.stopping is None and self.frozen is None and self.sign_of_life is not None:
                limit = watchdog_limit_s(self.settings) + FROZEN_MARGIN_S
                silent = self.life.silent_s(_touched(self.sign_of_life), time.monotonic())
                if silent > limit:
                    self.frozen = f"frozen: no sign of life for {silent:.0f}s"
                    _say(
                        f"agentledger worker: the faust process (pid {child.pid}) has given no "
                        f"sign of life for {silent:.0f}s (frozen); killing it"
                    )
                    with contextlib.suppress(ProcessLookupError):
                        child.kill()
            if self.stopping is not None:
                if deadline is None:
                    deadline = time.monotonic() + self.settings.stop_timeout_s
                elif time.monotonic() > deadline:
                    _say(
                        f"agentledger worker: the faust process (pid {child.pid}) did not stop "
                        f"within {self.settings.stop_timeout_s:g}s; killing it"
                    )
                    child.kill()

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.stopping is None and time.monotonic() < end:
            time.sleep(min(0.2, end - time.monotonic()))


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def supervise(settings: Settings, child_args: Sequence[str], projections: str) -> int:
    """Run the faust worker as a child until SIGTERM/SIGINT; returns the exit code."""
    return Supervisor(settings, child_args, projections).run()
