"""An agent loop that resumes a run from the ledger over MCP (``agentledger mcp``).

Each turn: read the run's next turn (``get_next_turn``: the context as the model gets it,
untrusted text in its data wrappers), ask the model, publish its reply as the run's next entry,
then read the working memory back with ``min_seq`` set to that entry's sequence number, so the
next turn starts from memory that holds the reply (read-your-writes). The model and the
publisher are the caller's: a real runtime passes its model client and its ledger publisher; the
test passes a scripted model and :class:`streams.publisher.AsyncPublisher`.

    settings = {k: v for k, v in os.environ.items() if k.startswith("AGENTLEDGER_")}
    params = StdioServerParameters(command="agentledger", args=["mcp"],
                                   env={**settings, "AGENTLEDGER_TOKEN": token})
    async with Client(params) as client:
        turns = await resume(client, run, model, publish, turns=3)

The SDK's stdio client starts the server with HOME, LOGNAME, PATH, SHELL, TERM and USER and the
``env`` given, nothing else of the caller's environment: the settings that find PostgreSQL,
Redis and Kafka (``AGENTLEDGER_PG_DSN``, ..., or the local stack's ``AGENTLEDGER_*_PORT``) go in
``env`` too, or the server looks at the default local stack (and says at once that PostgreSQL
is not there). A next turn too big for one answer is read a page of items at a time and given
to the model whole; a runtime calling ``resume`` once per turn passes its last reply's
sequence number as ``after_seq``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mcp import Client
from mcp_types import CallToolResult, TextContent

from schemas.models import (
    Actor,
    ActorType,
    Causation,
    EntryKind,
    LedgerEntry,
    TextPart,
    TrustLevel,
    Visibility,
)

Model = Callable[[str], Awaitable[str]]  # the next turn's text -> the model's reply
Publish = Callable[[list[LedgerEntry]], Awaitable[Any]]


@dataclass(frozen=True)
class RunIdentity:
    """What the runtime knows of the run it resumes."""

    run_id: str
    fleet_id: str
    session_id: str
    attempt_id: str


@dataclass(frozen=True)
class Turn:
    seq: int  # the reply's sequence number
    context_seq: int  # where the next turn the model read stood
    reply: str
    memory_seq: int  # where the working memory read back stood
    reached: bool  # whether it held the reply (memory_seq >= seq)
    plan: tuple[str, ...]  # the memory's current plan after the reply


class ResumeError(RuntimeError):
    pass


async def resume(
    client: Client,
    run: RunIdentity,
    model: Model,
    publish: Publish,
    turns: int = 1,
    after_seq: int = 0,
) -> list[Turn]:
    """Run ``turns`` turns of the loop; each reply is an ASSISTANT_RESPONSE whose text is also
    its plan (``metadata["plan"]``), which the working memory folds into ``current_plan``.
    ``after_seq``: the last sequence number this runtime published to the run before (the last
    :attr:`Turn.seq` of an earlier call), so a reply is numbered after it even when the worker
    has not applied it yet."""
    done: list[Turn] = []
    for _ in range(turns):
        mine = done[-1].seq if done else after_seq
        after = {"min_seq": mine, "timeout_s": 5} if mine else {}
        turn = await _call(client, "get_next_turn", run_id=run.run_id, **after)
        meta = turn.meta or {}
        context = await _whole_turn(client, run, turn)
        last = max(meta["applied_seqs"].values())  # the run's last entry the ledger applied
        reply = await model(context)
        # after what the ledger applied, and after this runtime's own last reply, which the
        # worker may not have applied yet (a read that timed out): a number is never reused
        seq = max(last, mine) + 1
        await publish([_reply(run, seq, reply)])
        memory = await _call(
            client, "get_working_memory", run_id=run.run_id, min_seq=seq, timeout_s=5
        )
        read = memory.meta or {}
        state = (memory.structured_content or {})["state"]
        done.append(
            Turn(
                seq=seq,
                context_seq=int(meta["applied_seq"]),
                reply=reply,
                memory_seq=int(read["applied_seq"]),
                reached=bool(read["reached"]),
                plan=tuple(state.get("current_plan") or ()),
            )
        )
    return done


async def _whole_turn(client: Client, run: RunIdentity, turn: CallToolResult) -> str:
    """The next turn's text, every page of it: a next turn too big for one answer comes a page
    of items at a time (``_meta.items_page``); if the run's next turn moved on between pages
    (another manifest), it is read again from its first item, at most three times."""
    for _ in range(3):
        texts = [_text(turn.content[0])]
        page = (turn.meta or {}).get("items_page")
        first = page
        while page and page["next_item_from"] is not None:
            more = await _call(
                client, "get_next_turn", run_id=run.run_id, item_from=page["next_item_from"]
            )
            page = (more.meta or {}).get("items_page")
            if page is None or first is None or page["manifest_id"] != first["manifest_id"]:
                break  # the next turn moved on: read it again
            texts.append(_text(more.content[0]))
        else:
            return "\n".join(texts)
        turn = await _call(client, "get_next_turn", run_id=run.run_id)
    raise ResumeError("the run's next turn kept moving on while its pages were read")


async def _call(client: Client, tool: str, **args: Any) -> CallToolResult:
    result = await client.call_tool(tool, args)
    if result.is_error:
        raise ResumeError(f"{tool}: {_text(result.content[0])}")
    return result


def _text(block: Any) -> str:
    if not isinstance(block, TextContent):
        raise ResumeError(f"expected text, got {type(block).__name__}")
    return block.text


def _reply(run: RunIdentity, seq: int, text: str) -> LedgerEntry:
    return LedgerEntry(
        entry_id=str(uuid.uuid4()),
        fleet_id=run.fleet_id,
        session_id=run.session_id,
        run_id=run.run_id,
        attempt_id=run.attempt_id,
        step_id=f"step-{seq}",
        sequence_no=seq,
        occurred_at=datetime.now(UTC),
        actor=Actor(type=ActorType.AGENT, id="resume-agent"),
        kind=EntryKind.ASSISTANT_RESPONSE,
        trust_level=TrustLevel.MODEL_GENERATED,
        visibility=Visibility.MODEL_VISIBLE,
        causation=Causation(),
        trace_id=uuid.uuid4().hex,
        span_id=uuid.uuid4().hex[:16],
        parts=(TextPart(text=text),),
        metadata={"plan": text},
    )
