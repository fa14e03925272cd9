"""An open MCP subscription's token checks (a fake reader): at the moment of asking, each
distinct token once per fan-out, and a store error does not stop the other sessions."""

from __future__ import annotations

import pytest

from consumers.mcp_ledger import Unauthorized
from consumers.mcp_server import still_valid


class _Reader:
    def __init__(self, token: str) -> None:
        self.token = token
        self.lookups = 0
        self.answer: Exception | None = None

    def principal(self) -> None:
        self.lookups += 1
        if self.answer is not None:
            raise self.answer


async def test_each_distinct_token_is_asked_once_per_fan_out_and_a_revocation_at_once() -> None:
    readers = [_Reader("alt_same") for _ in range(50)]
    answers: dict[str | None, bool] = {}
    assert all([await still_valid(r, answers) for r in readers])  # type: ignore[arg-type]
    assert sum(r.lookups for r in readers) == 1  # (before: one lookup per session)
    readers[0].answer = Unauthorized("revoked")
    assert await still_valid(readers[0]) is False  # type: ignore[arg-type]  # at once


async def test_a_store_error_counts_as_valid_this_time() -> None:
    reader = _Reader("alt_x")
    reader.answer = RuntimeError("PostgreSQL went away")
    assert await still_valid(reader) is True  # type: ignore[arg-type]


async def test_listen_streams_are_capped_for_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each listen stream has a handler of its own (to check its token), so the SDK's cap of
    1,024 streams per handler no longer held: the process counts them."""
    from mcp.server.subscriptions import InMemorySubscriptionBus
    from mcp.shared.exceptions import MCPError

    from consumers import mcp_server

    monkeypatch.setattr(mcp_server, "MAX_LISTENS", 0)
    with pytest.raises(MCPError, match="Subscription limit reached"):
        await mcp_server.guarded_listen(
            InMemorySubscriptionBus(),
            _Reader("alt_x"),  # type: ignore[arg-type]
            None,
            None,  # type: ignore[arg-type]
        )
