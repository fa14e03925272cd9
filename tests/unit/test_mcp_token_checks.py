"""An open MCP subscription's token checks (pure but for a fake reader): one lookup per token
per check interval, however many subscriptions ask; a store error keeps the last answer."""

from __future__ import annotations

import pytest

from consumers import mcp_server
from consumers.mcp_ledger import Unauthorized
from consumers.mcp_server import still_valid


class _Reader:
    def __init__(self) -> None:
        self.lookups = 0
        self.answer: Exception | None = None

    def principal(self) -> None:
        self.lookups += 1
        if self.answer is not None:
            raise self.answer


async def test_a_token_is_looked_up_once_per_interval_and_a_revocation_is_seen_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = _Reader()
    assert all([await still_valid(reader) for _ in range(50)])  # type: ignore[arg-type]
    assert reader.lookups == 1  # (before: one lookup per subscription and change)
    monkeypatch.setattr(mcp_server, "TOKEN_CHECK_S", 0.0)
    reader.answer = Unauthorized("revoked")
    assert await still_valid(reader) is False  # type: ignore[arg-type]
    reader.answer = RuntimeError("PostgreSQL went away")
    assert await still_valid(reader) is False  # type: ignore[arg-type]  # the last answer
    fresh = _Reader()
    fresh.answer = RuntimeError("PostgreSQL went away")
    assert await still_valid(fresh) is True  # type: ignore[arg-type]  # never checked: valid
