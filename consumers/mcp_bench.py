"""The bench's MCP reader (``agentledger bench``, :func:`streams.bench.hot_path`): the SDK's
client over stdio, talking to ``agentledger mcp`` spawned as a process of its own with a token
of the bench deployment's fleets, as an agent runtime would. Handed to the bench by the
composition root (the write side does not import the read side)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from mcp import Client, StdioServerParameters

from consumers.access import create_token
from consumers.mcp_ledger import MAX_WAIT_S
from infra.settings import Settings


@dataclass(frozen=True)
class McpRead:
    reached: bool  # the answer's _meta.reached (True when no min_seq was asked)
    waited_ms: float  # how long the server waited for min_seq (_meta.waited_ms)
    served_ms: float  # the server's handler, from the call to the answer (_meta.served_ms)


class McpReader:
    """``get_working_memory`` through a real MCP client session."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def working_memory(self, run_id: str, min_seq: int | None) -> McpRead:
        args: dict[str, object] = {"run_id": run_id}
        if min_seq is not None:  # as long as the server waits: the bench times the worker's lag
            args.update(min_seq=min_seq, timeout_s=MAX_WAIT_S)
        result = await self.client.call_tool("get_working_memory", args)
        if result.is_error:
            raise RuntimeError(f"get_working_memory {run_id}: {result.content}")
        meta = result.meta or {}
        return McpRead(
            bool(meta.get("reached")),
            float(meta.get("waited_ms") or 0.0),
            float(meta.get("served_ms") or 0.0),
        )


def server_env(settings: Settings, token: str) -> dict[str, str]:
    """What ``agentledger mcp`` needs to read ``settings``' deployment as ``token``."""
    return {
        "AGENTLEDGER_PG_DSN": settings.pg_address,
        "AGENTLEDGER_REDIS_URL": settings.redis_address,
        "AGENTLEDGER_REDIS_PREFIX": settings.redis_prefix,
        "AGENTLEDGER_TOPIC_PREFIX": settings.topic_prefix,
        "AGENTLEDGER_TOKEN": token,
    }


@asynccontextmanager
async def mcp_reader(settings: Settings) -> AsyncIterator[McpReader]:
    """A reader of ``settings``' fleets through ``agentledger mcp`` on stdio (a new token)."""
    token = create_token(settings, settings.fleet_ids)["token"]
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "infra.main", "mcp"], env=server_env(settings, token)
    )
    async with Client(params, read_timeout_seconds=30) as client:
        yield McpReader(client)
