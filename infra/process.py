"""Process plumbing for local services: pid files, liveness, ports, clean stops, log tails."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from infra.errors import InfraError, PortInUseError


def is_alive(pid: int) -> bool:
    """True when ``pid`` names a live process (zombies count as dead)."""
    state = _state(pid)
    return state is not None and state != "Z"


def is_running(pid: int) -> bool:
    """True when ``pid`` names a live process that is not stopped (SIGSTOP, a tracer): one that
    can do work."""
    return _state(pid) not in (None, "Z", "T", "t")


def _state(pid: int) -> str | None:
    """The process's state letter (``/proc/PID/stat``), None when there is no such process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "S"  # someone else's live process: its state is not ours to read
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def read_pid(path: Path) -> int | None:
    """First line of a pid file, or None when absent or unreadable."""
    try:
        return int(path.read_text().splitlines()[0].strip())
    except (OSError, ValueError, IndexError):
        return None


def live_pid(path: Path, marker: str) -> int | None:
    """The pid in ``path`` when it is alive and its command line mentions ``marker``."""
    pid = read_pid(path)
    if pid is None or not is_alive(pid) or marker not in cmdline(pid):
        return None
    return pid


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the system's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def require_free_ports(service: str, ports: dict[str, int]) -> None:
    """Raise a clear error naming the first port (and its setting) that is taken."""
    for setting, port in ports.items():
        if not port_free(port):
            raise PortInUseError(
                f"{service}: port {port} on 127.0.0.1 is already in use by another process. "
                f"Stop that process or choose another port with AGENTLEDGER_{setting}."
            )


# Servers started by this process, kept so they are reaped when stopped (and never garbage
# collected while running, which Python reports as a ResourceWarning).
_children: dict[int, subprocess.Popen[bytes]] = {}


def spawn(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Start a detached process (own session, stdio to ``log``) and return its pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    _children[proc.pid] = proc
    return proc.pid


def stop_pid(pid: int, timeout_s: float, sig: signal.Signals = signal.SIGTERM) -> bool:
    """Send ``sig``; SIGKILL after ``timeout_s``. True when it stopped cleanly."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    if wait_until(lambda: not is_alive(pid), timeout_s):
        _reap(pid)
        return True
    with contextlib.suppress(ProcessLookupError):
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not is_alive(pid), 10.0)
    _reap(pid)
    return False


def _reap(pid: int) -> None:
    proc = _children.pop(pid, None)
    if proc is not None:
        proc.wait(timeout=10)


def wait_until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def died_at_start(service: str, log: Path) -> InfraError:
    return InfraError(f"{service} exited during start-up. Last lines of {log}:\n{log_tail(log)}")


def run_checked(argv: Sequence[str], what: str) -> str:
    """Run a short command; on failure raise with its output."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise InfraError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout
