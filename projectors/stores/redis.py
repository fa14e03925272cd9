"""Redis side: hot views that never move backwards, and their refill from PostgreSQL.

A view is a hash ``{prefix}:{projection}:{build}:run:{run_id}`` with ``seq`` (the run's applied
sequence number it reflects), ``ver`` (see :func:`view_version`) and ``doc`` (the view as JSON).
Writes go through a Lua compare-and-set on ``ver``, so a repeated or late write changes nothing.
A build's ``ready`` key says its views are complete; when Redis loses it (flush, restart without
persistence), the engine refills the build from PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from projectors.stores.contract import RunView, view_doc, view_version

__all__ = ["RedisViewStore", "RunView", "view_version"]

CAS_SCRIPT = """
local cur = redis.call('HGET', KEYS[1], 'ver')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'ver', ARGV[1], 'seq', ARGV[2], 'doc', ARGV[3])
return 1
"""


def delete_matching(client: SyncRedis, pattern: str, chunk: int = 1000) -> int:
    """Delete every key matching ``pattern`` (SCAN, then DEL in chunks); how many there were."""
    keys = list(client.scan_iter(match=pattern, count=chunk))
    for start in range(0, len(keys), chunk):
        client.delete(*keys[start : start + chunk])
    return len(keys)


def view_key(prefix: str, projection: str, build: str, run_id: str) -> str:
    return f"{prefix}:{projection}:{build}:run:{run_id}"


def ready_key(prefix: str, projection: str, build: str) -> str:
    return f"{prefix}:{projection}:{build}:ready"


def live_key(prefix: str, projection: str) -> str:
    return f"{prefix}:live:{projection}"


class RedisViewStore:
    """CAS writes of run views for one key prefix."""

    def __init__(self, client: Redis, prefix: str = "al") -> None:
        self.client = client
        self.prefix = prefix
        self._cas = client.register_script(CAS_SCRIPT)

    @classmethod
    def connect(cls, url: str, prefix: str = "al") -> RedisViewStore:
        """A store on its own client (closed by :meth:`close`)."""
        return cls(Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5), prefix)

    async def close(self) -> None:
        await self.client.aclose()

    async def write(self, projection: str, build: str, views: Iterable[RunView]) -> int:
        """CAS-write views in one pipeline; returns how many moved forward."""
        _, moved = await self._write([(projection, build, views)])
        return moved

    async def write_builds(
        self, batches: Iterable[tuple[str, str, Iterable[RunView]]]
    ) -> set[tuple[str, str]]:
        """CAS-write the views of several builds in one round trip; returns the builds that
        were marked ready (complete) at the time: the others need a refill."""
        ready, _ = await self._write(batches)
        return ready

    async def _write(
        self, batches: Iterable[tuple[str, str, Iterable[RunView]]]
    ) -> tuple[set[tuple[str, str]], int]:
        builds: list[tuple[str, str, int]] = []  # each build and the index of its EXISTS reply
        commands: list[tuple[Any, ...]] = []
        for projection, build, views in batches:
            builds.append((projection, build, len(commands)))
            commands.append(("EXISTS", ready_key(self.prefix, projection, build)))
            for v in views:
                key = view_key(self.prefix, projection, build, v.run_id)
                version = view_version(v.applied_seq, v.held)
                commands.append(
                    ("EVALSHA", self._cas.sha, 1, key, version, v.applied_seq, view_doc(v))
                )
        if not builds:
            return set(), 0
        results = await self._run(commands)
        ready = {(proj, build) for proj, build, at in builds if results[at]}
        moved = sum(int(r) for r in results) - sum(int(results[at]) for _, _, at in builds)
        return ready, moved

    async def _run(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The commands in one pipeline, one round trip: the CAS script by its SHA (redis-py's
        script objects ask ``SCRIPT EXISTS`` first, a second round trip every batch); a Redis
        that lost its scripts (a restart) gets it loaded and the pipeline again (a CAS write
        that did run, had another client loaded the script meanwhile, is a no-op repeated)."""
        try:
            return await self._pipeline(commands)
        except NoScriptError:
            await self.client.script_load(CAS_SCRIPT)
            return await self._pipeline(commands)

    async def _pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute())

    async def ready_builds(self, builds: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of these builds have their ready key (one round trip)."""
        wanted = list(builds)
        pipe = self.client.pipeline(transaction=False)
        for projection, build in wanted:
            pipe.exists(ready_key(self.prefix, projection, build))
        found = await pipe.execute()
        return {b for b, present in zip(wanted, found, strict=True) if present}

    async def is_ready(self, projection: str, build: str) -> bool:
        return bool(await self.client.exists(ready_key(self.prefix, projection, build)))

    async def mark_ready(self, projection: str, build: str) -> None:
        await self.client.set(ready_key(self.prefix, projection, build), "1")

    async def set_live(self, projection: str, build: str) -> None:
        await self.client.set(live_key(self.prefix, projection), build)

    async def read(self, projection: str, build: str, run_id: str) -> tuple[int, Any] | None:
        raw = await self.client.hgetall(view_key(self.prefix, projection, build, run_id))
        if not raw:
            return None
        return int(raw[b"seq"]), json.loads(raw[b"doc"])

    async def read_live(self, projection: str, run_id: str) -> tuple[int, Any] | None:
        build = await self.client.get(live_key(self.prefix, projection))
        if build is None:
            return None
        name = build.decode() if isinstance(build, bytes) else str(build)
        return await self.read(projection, name, run_id)

    async def drop_build(self, projection: str, build: str, chunk: int = 1000) -> int:
        """Delete the build's views (SCAN, then DEL in chunks) and its ready key."""
        views = [
            key
            async for key in self.client.scan_iter(
                match=view_key(self.prefix, projection, build, "*"), count=chunk
            )
        ]
        for start in range(0, len(views), chunk):
            await self.client.delete(*views[start : start + chunk])
        await self.client.delete(ready_key(self.prefix, projection, build))
        return len(views)
