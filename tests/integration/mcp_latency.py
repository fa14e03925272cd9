"""MCP read latency beside the Redis read itself, on an idle stack (no worker, no load: what a
read costs; docs/mcp.md, *Read latency*): ``PYTHONPATH=. .venv/bin/python -m
tests.integration.mcp_latency`` with the stack's settings. Not collected by pytest; the same
reads under the hot path's load are ``agentledger bench``'s MCP phase (``streams.bench``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from tempfile import mkdtemp

from mcp import Client, StdioServerParameters

from infra.provision import provisioned
from projectors.stores.redis import RedisViewStore
from tests.integration.test_mcp import AGENTLEDGER, _env, _project
from tests.integration.web_support import FLEETS, Web, web_deployment

READS = 300


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _measure(web: Web) -> None:
    await _project(web.settings)  # (the test deployment's runs into Redis too)
    run = web.runs_of(FLEETS[0])[0]
    store = RedisViewStore.connect(web.settings.redis_address, web.settings.redis_prefix)
    redis = []
    for _ in range(READS):
        start = time.perf_counter()
        assert await store.read_live("working-memory", run) is not None
        redis.append(time.perf_counter() - start)
    await store.close()
    params = StdioServerParameters(command=AGENTLEDGER, args=["mcp"], env=_env(web, web.token_a))
    figures = {"Redis view read (read_live)": redis}
    async with Client(params) as client:
        for name, args in (
            ("get_working_memory", {}),
            ("get_working_memory, min_seq reached", {"min_seq": 1}),
            ("get_next_turn", {}),
            ("get_timeline", {}),
        ):
            times = []
            for _ in range(READS):
                start = time.perf_counter()
                result = await client.call_tool(name.split(",")[0], {"run_id": run, **args})
                times.append(time.perf_counter() - start)
                assert not result.is_error
            figures[name] = times
    for name, times in figures.items():
        p50, p99 = _pct(times, 50) * 1000, _pct(times, 99) * 1000
        print(f"{name}: p50 {p50:.2f} ms, p99 {p99:.2f} ms (n={len(times)})")


def main() -> None:
    with provisioned() as services, web_deployment(services, Path(mkdtemp())) as web:
        asyncio.run(_measure(web))


if __name__ == "__main__":
    main()
