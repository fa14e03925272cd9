"""The MCP server over streamable HTTP at ``/mcp`` of ``agentledger serve`` (the composition
root mounts it on the web app): the same tools, resources and prompts as ``agentledger mcp``,
each request read as the token of its ``Authorization: Bearer`` header."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette

from consumers.mcp_server import create_server
from infra.settings import Settings

PATH = "/mcp"


def mount(app: Starlette, settings: Settings, host: str = "127.0.0.1") -> None:
    """Add ``/mcp`` to ``app`` and run the MCP session manager for as long as ``app`` runs.
    (On a loopback ``host`` the SDK also refuses requests whose Host or Origin header names
    another host: DNS rebinding.)"""
    server = create_server(settings, token=None)
    mcp_app = server.streamable_http_app(streamable_http_path=PATH, host=host)
    app.router.routes[0:0] = list(mcp_app.routes)
    outer = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(served: Any) -> AsyncIterator[Any]:
        async with server.session_manager.run(), outer(served) as state:
            yield state

    app.router.lifespan_context = lifespan
