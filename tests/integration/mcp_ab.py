"""Two A/B measurements of MCP's own cost, in process, each variant interleaved with the other
on the same deployment and moment (docs/mcp.md, *Read latency*): ``PYTHONPATH=.
.venv/bin/python -m tests.integration.mcp_ab`` with the stack's settings. Not collected by
pytest.

- *pool*: plain ``get_working_memory`` reads beside 8 reads waiting for a ``min_seq`` that
  does not come (as the bench's agent has up to 8 waiting on the worker's lag), the wait inside
  the read's pooled transaction (as before) or before it, holding no connection (now);
- *commit*: reads whose transaction (its only write: the audit count) waits for the WAL flush
  at commit (as before) or not (now)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import consumers.mcp_ledger as ml
from infra.provision import provisioned
from tests.integration.test_mcp import _project
from tests.integration.web_support import web_deployment

NEW_READ = ml.Ledger._read


def _old_read(self: ml.Ledger, via: str, run_id: str, projection: str, *rest: Any) -> ml.Answer:
    """The read as it was: the wait for min_seq inside the pooled transaction."""
    min_seq, timeout_s, build = rest
    with self._one_transaction():
        who, run_id, waited = self._arrive(via, run_id, projection, min_seq, timeout_s)
        return self._read_one(who, via, run_id, projection, waited, build)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] * 1000


def _report(times: dict[str, list[float]]) -> None:
    for name, v in times.items():
        print(
            f"{name}: p50 {_pct(v, 50):.1f} ms, p90 {_pct(v, 90):.1f} ms, p99 {_pct(v, 99):.1f} ms"
            f" (n={len(v)}, load average {os.getloadavg()[0]:.1f})"
        )


def _timed(read: Any) -> float:
    start = time.perf_counter()
    read()
    return time.perf_counter() - start


def pool(ledger: ml.Ledger, run: str, blocks: int = 6) -> None:
    stop = threading.Event()

    def waiting() -> None:
        while not stop.is_set():
            ledger.working_memory(run, min_seq=10**6, timeout_s=1)

    waiters = [threading.Thread(target=waiting) for _ in range(8)]
    times: dict[str, list[float]] = {"pool, wait holds a connection (before)": [], "pool, now": []}
    for waiter in waiters:
        waiter.start()
    try:
        for block in range(blocks):
            name = list(times)[block % 2]
            variant = _old_read if block % 2 == 0 else NEW_READ
            ml.Ledger._read = variant  # type: ignore[method-assign, assignment]
            time.sleep(1.2)  # the waiting reads have started again as this variant
            times[name] += [_timed(lambda: ledger.working_memory(run)) for _ in range(15)]
    finally:
        ml.Ledger._read = NEW_READ  # type: ignore[method-assign]
        stop.set()
        for waiter in waiters:
            waiter.join()
    _report(times)


def commit(ledger: ml.Ledger, run: str, reads: int = 300) -> None:
    times: dict[str, list[float]] = {"commit, waits for the flush (before)": [], "commit, now": []}
    for i in range(reads):
        for lazy in (True, False) if i % 2 else (False, True):
            ml.LAZY_COMMIT = lazy
            times[list(times)[lazy]].append(_timed(lambda: ledger.working_memory(run)))
    ml.LAZY_COMMIT = True
    _report(times)


def main() -> None:
    with provisioned() as services, web_deployment(services, Path(mkdtemp())) as web:
        asyncio.run(_project(web.settings))
        ledger = ml.Ledger(web.settings, web.token_a)
        try:
            for _ in range(20):
                ledger.working_memory(web.live_run)
            commit(ledger, web.live_run)
            pool(ledger, web.live_run)
        finally:
            ledger.close()


if __name__ == "__main__":
    main()
