"""The example agent loop (consumers/examples/resume_agent.py) numbers its replies after what
the ledger applied and after its own last reply, with a client whose worker lags (unit: a fake
MCP client; the loop against the real stack is tests/integration/test_mcp.py)."""

from __future__ import annotations

from typing import Any

from mcp_types import CallToolResult, TextContent

from consumers.examples.resume_agent import RunIdentity, resume
from schemas.models import LedgerEntry


class LaggingLedger:
    """An MCP client whose worker never applies anything past ``applied``."""

    def __init__(self, applied: int) -> None:
        self.applied = applied
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(self, tool: str, args: dict[str, Any]) -> CallToolResult:
        self.asked.append((tool, args))
        meta = {
            "applied_seqs": {"working-memory": self.applied, "context-manifests": self.applied},
            "applied_seq": self.applied,
            "reached": self.applied >= args.get("min_seq", 0),
        }
        return CallToolResult(
            content=[TextContent(type="text", text="the next turn")],
            structured_content={"state": {"current_plan": []}},
            _meta=meta,
        )


async def test_a_reply_is_numbered_after_the_loops_own_last_one_when_the_worker_lags() -> None:
    client = LaggingLedger(applied=7)
    published: list[LedgerEntry] = []

    async def publish(entries: list[LedgerEntry]) -> None:
        published.extend(entries)

    async def model(context: str) -> str:
        return f"reply to {context}"

    run = RunIdentity("run-lagging-1", "fleet-01", "s-1", "a-1")
    turns = await resume(client, run, model, publish, turns=3)  # type: ignore[arg-type]
    assert [e.sequence_no for e in published] == [8, 9, 10]  # never 8 again
    assert [t.seq for t in turns] == [8, 9, 10]
    assert [t.reached for t in turns] == [False, False, False]  # and it says so
