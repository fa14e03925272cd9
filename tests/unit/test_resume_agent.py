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


async def test_a_later_call_numbers_after_the_reply_of_the_call_before() -> None:
    """One resume() per turn, as a runtime calls it, with the worker lagging: the second call
    is told the first's last reply (after_seq) and numbers after it."""
    client = LaggingLedger(applied=7)
    published: list[LedgerEntry] = []

    async def publish(entries: list[LedgerEntry]) -> None:
        published.extend(entries)

    async def model(context: str) -> str:
        return "ok"

    run = RunIdentity("run-lagging-2", "fleet-01", "s-1", "a-1")
    first = await resume(client, run, model, publish)  # type: ignore[arg-type]
    await resume(client, run, model, publish, after_seq=first[-1].seq)  # type: ignore[arg-type]
    assert [e.sequence_no for e in published] == [8, 9]
    waited = {"run_id": run.run_id, "min_seq": 8, "timeout_s": 5}
    assert client.asked[2] == ("get_next_turn", waited)  # and reads what follows it


class PagedLedger(LaggingLedger):
    """A next turn of five items served two at a time; with ``moves``, it moves on (another
    manifest) after its first two pages were read, before the third."""

    def __init__(self, moves: bool = False) -> None:
        super().__init__(applied=3)
        self.moves = moves

    async def call_tool(self, tool: str, args: dict[str, Any]) -> CallToolResult:
        result = await super().call_tool(tool, args)
        if tool != "get_next_turn":
            return result
        start = args.get("item_from", 0)
        manifest = "m2" if self.moves and len(self.asked) > 2 else "m1"  # after two reads
        end = min(start + 2, 5)
        page = {"manifest_id": manifest, "from": start, "served": end - start, "of": 5}
        page["next_item_from"] = end if end < 5 else None
        text = " ".join(f"{manifest}:item{n}" for n in range(start, end))
        return CallToolResult(
            content=[TextContent(type="text", text=text)],
            structured_content={},
            _meta={**(result.meta or {}), "items_page": page},
        )


async def test_the_model_gets_every_page_of_a_next_turn_too_big_for_one_answer() -> None:
    seen: list[str] = []

    async def model(context: str) -> str:
        seen.append(context)
        return "ok"

    async def publish(entries: list[LedgerEntry]) -> None:
        return None

    run = RunIdentity("run-paged-1", "fleet-01", "s-1", "a-1")
    await resume(PagedLedger(), run, model, publish)  # type: ignore[arg-type]
    assert seen == ["m1:item0 m1:item1\nm1:item2 m1:item3\nm1:item4"]
    # the next turn moved on before its last page: read again from its first item, all of m2
    seen.clear()
    await resume(PagedLedger(moves=True), run, model, publish)  # type: ignore[arg-type]
    assert seen == ["m2:item0 m2:item1\nm2:item2 m2:item3\nm2:item4"]
