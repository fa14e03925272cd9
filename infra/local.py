"""``infra up|down|status``: the local stack as one unit."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console

from infra.process import (
    cmdline,
    died_at_start,
    free_port,
    is_alive,
    live_pid,
    port_free,
    spawn,
    stop_pid,
    wait_until,
)
from infra.services import ServiceStatus, all_services, purge_state
from infra.settings import Settings


def up(settings: Settings, console: Console) -> list[ServiceStatus]:
    """Start what is not running (idempotent) and say what runs."""
    services = all_services(settings, console)
    for service in services:
        console.print(service.up())
    _prepare(settings, console)
    return [s.status() for s in services]


def _prepare(settings: Settings, console: Console) -> None:
    """Topics and tables the pipeline needs; idempotent."""
    from infra.admin import create_fleet_topics_sync
    from infra.migrate import migrate_and_claim

    created = create_fleet_topics_sync(settings, settings.fleet_ids)
    console.print(f"topics: {len(created)} created for fleets {', '.join(settings.fleet_ids)}")
    applied = migrate_and_claim(settings.pg_address, settings.topic_prefix)
    console.print(f"migrations: {', '.join(applied) if applied else 'up to date'}")


def worker_pidfile(settings: Settings) -> Path:
    return settings.state_dir / "worker" / "worker.pid"


def worker_pid(settings: Settings) -> int | None:
    return live_pid(worker_pidfile(settings), "infra.main worker")


def _registry(settings: Settings) -> Path:
    return settings.state_dir / "workers"


def register_worker(
    settings: Settings,
    projections: str,
    *,
    child_pid: int | None = None,
    restarts: int = 0,
    last_exit: str | None = None,
) -> Path:
    """Note this process as a running worker of the project (``infra status`` lists it); a
    supervisor notes its faust process, how often it restarted it and why it last ended."""
    folder = _registry(settings)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{os.getpid()}.json"
    try:
        started = json.loads(path.read_text())["started_at"]
    except (OSError, ValueError, KeyError, TypeError):
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    note: dict[str, Any] = {
        "pid": os.getpid(),
        "started_at": started,
        "projections": projections,
        "topic_prefix": settings.topic_prefix,
        # (no fleet list: a worker projects every <prefix>.ledger.* topic, new fleets too;
        # the fleets whose partitions it holds are in its health row)
        "supervised": child_pid is not None,
        "child_pid": child_pid,
        "restarts": restarts,
        "last_exit": last_exit,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(note))
    tmp.replace(path)
    return path


def running_workers(settings: Settings) -> list[dict[str, Any]]:
    """The project's workers that are running (any started with ``agentledger worker``, the
    demo's included); notes of workers that died are removed."""
    out = []
    folder = _registry(settings)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            note = json.loads(path.read_text())
            pid = int(note["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if is_alive(pid) and "worker" in cmdline(pid):
            out.append(note)
        else:
            path.unlink(missing_ok=True)
    return out


def start_worker(settings: Settings, console: Console) -> int:
    """A background projection worker (what the demo runs); idempotent."""
    pid = worker_pid(settings)
    if pid is not None:
        console.print(f"worker: already running (pid {pid})")
        return pid
    log = settings.state_dir / "worker" / "worker.log"
    pid = spawn([sys.executable, "-m", "infra.main", "worker", "--loglevel", "info"], log)
    worker_pidfile(settings).write_text(f"{pid}\n")
    console.print(f"worker: started (pid {pid}, log {log})")
    return pid


def stop_worker(settings: Settings, console: Console) -> None:
    pid = worker_pid(settings)
    if pid is not None:
        clean = stop_pid(pid, settings.stop_timeout_s)
        console.print(f"worker: {'stopped' if clean else 'killed after timeout'} (pid {pid})")


def server_pidfile(settings: Settings) -> Path:
    return settings.state_dir / "serve" / "serve.pid"


def server_running(settings: Settings) -> tuple[int, int] | None:
    """(pid, port) of the background ``agentledger serve`` the demo started, if it runs."""
    pidfile = server_pidfile(settings)
    pid = live_pid(pidfile, "infra.main serve")
    if pid is None:
        return None
    try:
        return pid, int(pidfile.read_text().splitlines()[1])
    except (OSError, ValueError, IndexError):
        return None


def start_server(settings: Settings, console: Console) -> int:
    """A background ``agentledger serve`` on loopback (what the demo runs), answering
    ``/health``; idempotent. Its port: ``serve_port``, or a free one when that is taken."""
    running = server_running(settings)
    if running is not None:
        console.print(f"web: already running (pid {running[0]}, port {running[1]})")
        return running[1]
    port = settings.serve_port
    if not port_free(port):
        port = free_port()
        console.print(f"web: port {settings.serve_port} is taken; serving on {port}")
    log = settings.state_dir / "serve" / "serve.log"
    pid = spawn([sys.executable, "-m", "infra.main", "serve", "--port", str(port)], log)
    server_pidfile(settings).write_text(f"{pid}\n{port}\n")
    if not wait_until(lambda: _answers(port), settings.start_timeout_s):
        raise died_at_start("web", log)
    console.print(f"web: started (pid {pid}, log {log})")
    return port


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def stop_server(settings: Settings, console: Console) -> None:
    running = server_running(settings)
    if running is not None:
        clean = stop_pid(running[0], settings.stop_timeout_s)
        console.print(f"web: {'stopped' if clean else 'killed after timeout'} (pid {running[0]})")


def down(settings: Settings, console: Console, purge: bool = False) -> None:
    """Stop our services (SIGTERM, SIGKILL after a timeout); keep data unless ``purge``."""
    stop_server(settings, console)
    stop_worker(settings, console)
    services = all_services(settings, console)
    for service in reversed(services):
        console.print(service.down())
    if purge:
        purge_state(settings, services)
        console.print(f"purged service data under {settings.state_dir}")


def status(settings: Settings, console: Console) -> list[ServiceStatus]:
    return [s.status() for s in all_services(settings, console)]
