"""The MCP server over streamable HTTP at ``/mcp`` of ``agentledger serve`` (the composition
root mounts it on the web app): the same tools, resources and prompts as ``agentledger mcp``,
each request read as the token of its ``Authorization: Bearer`` header.

Every request to ``/mcp`` needs a valid token, ``initialize`` included: without one it is a
``401`` with ``WWW-Authenticate: Bearer error="invalid_token"`` before the MCP server sees it.
That is the MCP specification's rule for HTTP (authorization, "Access Token Usage": the token
is sent with every request, even within a session, and an invalid or expired one gets 401) and
what the SDK's own ``RequireAuthMiddleware`` does for a server with a token verifier; this
server's tokens are its own (not OAuth), so the guard is ours."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from consumers.access import authenticate
from consumers.mcp_server import create_server
from infra.settings import Settings

PATH = "/mcp"


class TokenGuard:
    """Passes a request on only with a valid ``Authorization: Bearer`` token (else 401)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = [v for k, v in scope.get("headers") or () if k == b"authorization"]
            # one Authorization header, as the server behind reads it (Starlette takes the
            # first of several; this took the last): several are refused
            header = given[0].decode("latin-1") if len(given) == 1 else ""
            token = header[7:].strip() if header.lower().startswith("bearer ") else None
            if await anyio.to_thread.run_sync(authenticate, self.settings, token) is None:
                await _unauthorized(send)
                return
        await self.app(scope, receive, send)


async def _unauthorized(send: Send) -> None:
    reason = (
        "a valid API token is needed in Authorization: Bearer (agentledger tokens create): "
        "this one is missing, unknown, revoked or expired"
    )
    body = json.dumps({"error": "invalid_token", "error_description": reason}).encode()
    challenge = f'Bearer error="invalid_token", error_description="{reason}"'
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", challenge.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def mount(app: Starlette, settings: Settings, host: str = "127.0.0.1") -> None:
    """Add ``/mcp`` to ``app`` and run the MCP session manager for as long as ``app`` runs.
    (On a loopback ``host`` the SDK also refuses requests whose Host or Origin header names
    another host: DNS rebinding.)"""
    server = create_server(settings, token=None)
    mcp_app = server.streamable_http_app(streamable_http_path=PATH, host=host)
    routes = [
        Route(PATH, endpoint=TokenGuard(r.endpoint, settings))
        if isinstance(r, Route) and r.path == PATH
        else r
        for r in mcp_app.routes
    ]
    app.router.routes[0:0] = routes
    outer = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(served: Any) -> AsyncIterator[Any]:
        async with server.session_manager.run(), outer(served) as state:
            yield state

    app.router.lifespan_context = lifespan
