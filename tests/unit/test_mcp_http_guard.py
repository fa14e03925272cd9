"""The /mcp guard reads one Authorization header, as the server behind it does."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from consumers.mcp_http import TokenGuard
from infra.settings import Settings


async def test_several_authorization_headers_are_refused_before_any_lookup() -> None:
    """Before: the guard took the last of several headers and the MCP server the first, so a
    request could pass the guard with one token and be served under another's header."""
    reached: list[Any] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope)

    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    headers = [(b"authorization", b"Bearer alt_one"), (b"authorization", b"Bearer alt_two")]
    scope = {"type": "http", "headers": headers, "method": "POST", "path": "/mcp"}
    await TokenGuard(inner, Settings())(scope, receive, send)
    assert reached == [] and sent[0]["status"] == 401
