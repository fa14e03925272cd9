"""A small faust app run crash-only by :func:`streams.worker.execute`, for
``test_crash_only.py``: ``python -m tests.integration.crash_app MODE GROUP`` where MODE is
``crash`` (a timer raises), ``agent`` (an agent raises), ``block`` (a timer blocks the event
loop) or ``idle`` (nothing happens until a signal)."""

from __future__ import annotations

import sys
import time
from typing import Any

import faust

from infra.settings import load_settings
from streams.worker import execute


def main(mode: str, group: str) -> None:
    settings = load_settings()
    app = faust.App(
        group,
        broker=f"kafka://{settings.kafka_address}",
        store="memory://",
        web_enabled=False,
        topic_allow_declare=False,
        datadir=f"/tmp/{group}",
    )

    @app.timer(interval=1.0)  # type: ignore[untyped-decorator]
    async def tick() -> None:
        print(f"tick {mode}", flush=True)
        if mode == "crash":
            raise RuntimeError("a timer failed")
        if mode == "block":
            time.sleep(600)  # the loop never runs again

    if mode == "agent":

        @app.agent()
        async def broken(stream: Any) -> None:
            raise RuntimeError("an agent failed")

    execute(app, "info", stop_timeout_s=3.0, watchdog_s=float(sys.argv[3]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
