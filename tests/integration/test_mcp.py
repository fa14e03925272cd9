"""``agentledger mcp`` on the real stack: runs published through the publisher to Kafka and
projected by the engine into PostgreSQL (and Redis), read by the official SDK's stdio client,
which spawns ``agentledger mcp`` as a process of its own, against the CLI's ``--json`` for the
same runs; tokens and their fleets, entries that are not for a model, hostile text,
read-your-writes, prompts and the audit of the reads."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types import ResourceUpdatedNotification, TextContent, TextResourceContents
from typer.testing import CliRunner

from consumers.access import create_token
from consumers.examples.resume_agent import RunIdentity, resume
from infra.main import app
from infra.settings import Settings
from schemas.json_form import from_json, to_json
from schemas.models import ArtifactRef, LedgerEntry
from schemas.topics import ledger_topic
from streams.artifacts import FileArtifactStore
from streams.builds import live_targets
from streams.changes import ChangeRelay, stream_projections
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine
from streams.publisher import AsyncPublisher
from streams.simulate import simulate
from streams.source import drain
from tests.integration.web_support import FLEETS, HOSTILE_TOOL, Web, free_port, web_deployment

pytestmark = pytest.mark.integration

AGENTLEDGER = str(Path(sys.executable).with_name("agentledger"))
TOOLS = {
    "get_working_memory",
    "get_next_turn",
    "get_timeline",
    "find_runs",
    "get_costs",
    "explain_failure",
    "get_diff",
    "get_artifact",
}
RESOURCES = ("working-memory", "next-turn", "timeline", "costs", "failure", "diff")
DATA_TAGS = ("untrusted_data", "tool_data", "repository_data", "network_data")


@pytest.fixture(scope="module")
def web(services: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    with web_deployment(services, tmp_path_factory.mktemp("mcp")) as found:
        yield found


def _env(web: Web, token: str) -> dict[str, str]:
    s = web.settings
    return {
        "AGENTLEDGER_KAFKA_BOOTSTRAP": s.kafka_address,
        "AGENTLEDGER_PG_DSN": s.pg_address,
        "AGENTLEDGER_REDIS_URL": s.redis_address,
        "AGENTLEDGER_REDIS_PREFIX": s.redis_prefix,
        "AGENTLEDGER_TOPIC_PREFIX": s.topic_prefix,
        "AGENTLEDGER_ARTIFACT_DIR": str(s.resolved_artifact_dir),
        "AGENTLEDGER_TOKEN": token,
    }


@asynccontextmanager
async def _client(web: Web, token: str) -> AsyncIterator[Client]:
    """The SDK's client, talking to ``agentledger mcp`` spawned as a process over stdio."""
    params = StdioServerParameters(command=AGENTLEDGER, args=["mcp"], env=_env(web, token))
    async with Client(params, read_timeout_seconds=30) as client:
        yield client


def _cli(web: Web, *args: str) -> Any:
    env = {
        "AGENTLEDGER_PG_DSN": web.settings.pg_address,
        "AGENTLEDGER_TOPIC_PREFIX": web.settings.topic_prefix,
        "COLUMNS": "200",
    }
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.stdout if "--render" in args else json.loads(result.stdout)


def _hidden(web: Web, run_id: str | None = None) -> set[str]:
    """Entry ids that are not MODEL_VISIBLE (from what was published, not from the server)."""
    return {
        e.entry_id
        for e in web.sent
        if e.visibility.value != "MODEL_VISIBLE" and run_id in (None, e.run_id)
    }


def _names(doc: Any) -> set[str]:
    """Every entry id a row, snapshot or piece of evidence names."""
    found = set()
    if isinstance(doc, dict):
        for key in ("entry_id", "entry"):
            if isinstance(doc.get(key), str):
                found.add(doc[key])
        refs = doc.get("refs")
        if isinstance(refs, dict):
            found |= {v for v in refs.values() if isinstance(v, str)}
    return found


def _visible_timeline(doc: dict[str, Any], hidden: set[str]) -> dict[str, Any]:
    """The CLI's timeline document less what comes from hidden entries."""
    rows = [r for r in doc["rows"] if not _names(r) & hidden]
    failure = doc.get("failure")
    if isinstance(failure, dict) and isinstance(failure.get("evidence"), list):
        failure = {
            **failure,
            "evidence": [e for e in failure["evidence"] if not _names(e) & hidden],
        }
    return {**doc, "rows": rows, "failure": failure}


def _visible_failure(doc: dict[str, Any], hidden: set[str]) -> dict[str, Any]:
    c = doc["classification"]
    if c is None:
        return doc
    evidence = [e for e in c["evidence"] if not _names(e) & hidden]
    return {**doc, "classification": {**c, "evidence": evidence}}


def _memory(web: Web, run_id: str) -> dict[str, Any]:
    """``agentledger memory RUN --json`` with its evidence index put back from ``memory
    --index PART`` (--json counts its members only; the MCP answer carries it while it fits)."""
    doc: dict[str, Any] = _cli(web, "memory", run_id, "--json")
    counts = doc.pop("index")
    doc["state"]["index"] = {
        part: _cli(web, "memory", run_id, "--index", part, "--limit", "10000")["members"]
        for part in counts
    }
    return doc


def _visible_memory(doc: dict[str, Any], hidden: set[str]) -> dict[str, Any]:
    state = doc["state"]
    entries = {k: v for k, v in state["index"]["entries"].items() if k not in hidden}
    return {**doc, "state": {**state, "index": {**state["index"], "entries": entries}}}


def _text(block: Any) -> str:
    assert isinstance(block, TextContent | TextResourceContents), block
    return block.text


async def _tool(client: Client, name: str, **args: Any) -> Any:
    result = await client.call_tool(name, args)
    assert not result.is_error, result.content
    return result


async def test_every_tool_and_resource_answers_as_the_cli_does(web: Web) -> None:
    async with _client(web, web.token_a) as client:
        tools = (await client.list_tools()).tools
        assert {t.name for t in tools} == TOOLS
        assert all(t.annotations and t.annotations.read_only_hint for t in tools)
        listed = (await client.list_resources()).resources
        assert [str(r.uri) for r in listed] == ["ledger://runs"]
        templates = (await client.list_resource_templates()).resource_templates
        assert {t.uri_template for t in templates} >= {
            f"ledger://runs/{{run_id}}/{what}{{?min_seq}}" for what in RESOURCES
        }
        assert all(t.annotations and t.annotations.audience for t in templates)

        found = await _tool(client, "find_runs")
        cli_runs = [r for r in _cli(web, "runs", "--json") if r["fleet_id"] == FLEETS[0]]
        assert found.structured_content == {"runs": cli_runs}
        listing = await client.read_resource("ledger://runs")
        assert json.loads(_text(listing.contents[0])) == {"runs": cli_runs}
        failed = await client.read_resource("ledger://runs?status=FAILED&sort=cost")
        cli_failed = _cli(web, "runs", "--json", "--status", "FAILED", "--sort", "cost")
        assert json.loads(_text(failed.contents[0]))["runs"] == [
            r for r in cli_failed if r["fleet_id"] == FLEETS[0]
        ]

        for run_id in web.runs_of(FLEETS[0]):
            hidden = _hidden(web, run_id)
            timeline = _cli(web, "timeline", run_id, "--json")
            expected = {
                "get_working_memory": _visible_memory(_memory(web, run_id), hidden),
                "get_next_turn": _cli(web, "context", run_id, "--json"),
                "get_timeline": _visible_timeline(timeline, hidden),
                "get_costs": timeline["cost"],
                "explain_failure": _visible_failure(
                    _cli(web, "failures", run_id, "--json"), hidden
                ),
            }
            answers: dict[str, Any] = {}
            for name, doc in expected.items():
                answers[name] = await _tool(client, name, run_id=run_id)
                assert answers[name].structured_content == doc, name
                assert json.loads(_text(answers[name].content[-1])) == doc
            diff = await _tool(client, "get_diff", run_id=run_id)
            assert diff.structured_content["run_id"] == run_id

            # what the model gets, trust wrappers included, is `context --render`
            turn = answers["get_next_turn"]
            assert _text(turn.content[0]) + "\n" == _cli(web, "context", run_id, "--render")
            meta = turn.meta or {}
            assert [i["sha256"] for i in meta["items"]] == [
                i["sha256"] for i in expected["get_next_turn"]["items"]
            ]
            assert all(
                i["trust_level"] and i["visibility"] == "MODEL_VISIBLE" for i in meta["items"]
            )
            for answer in answers.values():
                m = answer.meta or {}
                assert m["run_id"] == run_id and m["reached"] is True
                assert isinstance(m["applied_seq"], int) and m["applied_seq"] > 0
                assert m["build"]["build"] and isinstance(m["build"]["version"], int)
                assert m["server"].startswith("agentledger ")
            memory = answers["get_working_memory"].structured_content
            assert (answers["get_working_memory"].meta or {})["applied_seq"] == memory[
                "applied_seq"
            ]

            # each resource is its tool's answer
            for what in RESOURCES:
                read = await client.read_resource(f"ledger://runs/{run_id}/{what}")
                doc = json.loads(_text(read.contents[-1]))
                assert read.contents[-1].meta and read.contents[-1].meta["run_id"] == run_id
                tool = {
                    "working-memory": "get_working_memory",
                    "next-turn": "get_next_turn",
                    "timeline": "get_timeline",
                    "costs": "get_costs",
                    "failure": "explain_failure",
                    "diff": "get_diff",
                }[what]
                mirror = answers.get(tool) or diff
                assert doc == mirror.structured_content, what
            memory_at = await client.read_resource(
                f"ledger://runs/{run_id}/working-memory?at_seq=9"
            )
            assert json.loads(_text(memory_at.contents[-1])) == _cli(
                web, "memory", run_id, "--at", "9", "--json"
            )


async def test_a_token_reads_only_its_fleets_runs(web: Web) -> None:
    other = web.runs_of(FLEETS[1])[0]
    async with _client(web, web.token_a) as client:
        for name in TOOLS - {"find_runs"}:
            handle = {"artifact": f"sha256:{'0' * 64}"} if name == "get_artifact" else {}
            refused = await client.call_tool(name, {"run_id": other, **handle})
            assert refused.is_error and _text(refused.content[0]) == f"no run {other}"
            unknown = await client.call_tool(name, {"run_id": "no-such-run", **handle})
            assert unknown.is_error and _text(unknown.content[0]) == "no run no-such-run"
        for what in RESOURCES:
            with pytest.raises(MCPError, match=f"no run {other}"):
                await client.read_resource(f"ledger://runs/{other}/{what}")
        refused = await client.call_tool("find_runs", {"fleet": FLEETS[1]})
        assert refused.is_error
        runs = (await _tool(client, "find_runs", limit=200)).structured_content["runs"]
        assert {r["fleet_id"] for r in runs} == {FLEETS[0]}
    async with _client(web, web.token_b) as client:
        assert not (await client.call_tool("get_timeline", {"run_id": other})).is_error
    # a revoked, expired or missing token: the server does not start, and says why
    for token in (web.revoked, web.expired, ""):
        done = subprocess.run(
            [AGENTLEDGER, "mcp"],
            env={**os.environ, **_env(web, token)},
            input=b"",
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 1
        assert b"a valid API token is needed" in done.stderr
        assert done.stdout == b""


def _hidden_texts(web: Web, run_id: str, hidden: set[str]) -> set[str]:
    """Long strings of the run's hidden entries that no MODEL_VISIBLE entry of it holds."""

    def strings(node: Any) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict | list):
            for value in node.values() if isinstance(node, dict) else node:
                yield from strings(value)

    entries = [e for e in web.sent if e.run_id == run_id]
    shown = "\n".join(json.dumps(to_json(e)) for e in entries if e.entry_id not in hidden)
    return {
        text
        for e in entries
        if e.entry_id in hidden
        for text in strings(to_json(e))
        if len(text) >= 40 and json.dumps(text)[1:-1] not in shown
    }


async def _served(client: Client, run_id: str) -> dict[str, str]:
    """Everything the server serves of a run: every tool (get_artifact with the handle of
    every item of the next turn), resource and prompt, as text (content and ``_meta``)."""
    served: dict[str, str] = {}
    for name in sorted(TOOLS - {"find_runs", "get_artifact"}):
        more = {"limit": 1000} if name == "get_timeline" else {}
        answer = await _tool(client, name, run_id=run_id, **more)
        served[name] = "\n".join([*(_text(c) for c in answer.content), json.dumps(answer.meta)])
        assert all(i["visibility"] == "MODEL_VISIBLE" for i in (answer.meta or {}).get("items", []))
    turn = await _tool(client, "get_next_turn", run_id=run_id)
    for item in turn.structured_content["items"]:
        handle = f"sha256:{item['sha256']}"
        answer = await _tool(client, "get_artifact", run_id=run_id, artifact=handle)
        served[handle] = answer.structured_content["text"] + json.dumps(answer.meta)
    for what in RESOURCES:
        read = await client.read_resource(f"ledger://runs/{run_id}/{what}")
        served[what] = "\n".join(_text(c) for c in read.contents) + json.dumps(read.meta)
    for prompt in ("resume_run", "explain_failure", "review_diff"):
        got = await client.get_prompt(prompt, {"run_id": run_id})
        served[prompt] = "\n".join(_text(m.content) for m in got.messages)
    return served


def _leaks(served: dict[str, str], hidden: set[str]) -> None:
    for name, text in served.items():
        leaked = [h for h in hidden if h in text]
        assert not leaked, (name, leaked, text[text.find(leaked[0]) - 600 :][:900])


async def test_nothing_of_a_hidden_entry_is_served(web: Web) -> None:
    """Every tool (get_artifact with the handle of every item of the next turn), resource and
    prompt, for every run of the token's fleet: no id and no text of an entry that is not
    MODEL_VISIBLE (here AUDIT_ONLY, INTERNAL_ONLY, HUMAN_VISIBLE)."""
    async with _client(web, web.token_a) as client:
        for run_id in web.runs_of(FLEETS[0]):
            hidden = _hidden(web, run_id)
            assert hidden  # the simulator's run starts, model calls, contexts are audit-only
            _leaks(await _served(client, run_id), hidden | _hidden_texts(web, run_id, hidden))
            # the CLI (an operator's) shows them: the check above could fail
            assert [h for h in hidden if h in json.dumps(_cli(web, "timeline", run_id, "--json"))]
            # what a hidden model call saw is not served either
            call = next(
                e.entry_id
                for e in web.sent
                if e.entry_id in hidden and e.run_id == run_id and e.kind.value == "MODEL_CALL"
            )
            refused = await client.call_tool("get_next_turn", {"run_id": run_id, "call": call})
            assert refused.is_error


async def test_no_token_kind_is_served_what_is_not_for_a_model(web: Web) -> None:
    """Entries made REDACTED, INTERNAL_ONLY and AUDIT_ONLY, each with a canary in its text,
    in a new run: an admin token of the fleet is served nothing of them either, through every
    tool, resource and prompt (the policy does not depend on the token's kind)."""
    new = simulate(1, 1, seed=6262)
    canaries: dict[str, str] = {}
    levels = iter(("REDACTED", "INTERNAL_ONLY", "AUDIT_ONLY"))
    for n, entry in enumerate(new):
        doc = to_json(entry)
        texts = [p for p in doc["parts"] if {"text", "summary", "message"} & set(p)]
        if entry.sequence_no < 5 or entry.visibility.value != "MODEL_VISIBLE" or not texts:
            continue
        level = next(levels, None)
        if level is None:
            break
        canary = f"CANARY-{level}-{uuid.uuid4().hex[:8]}"
        for part in texts:
            key = next(k for k in ("text", "summary", "message") if k in part)
            part[key] = f"{canary} {part[key]}"
        doc["visibility"] = level
        new[n] = from_json(doc)
        canaries[entry.entry_id] = canary
    assert len(canaries) == 3
    async with AsyncPublisher(web.settings) as publisher:
        await publisher.publish_batch(new)
    await _project(web.settings)
    admin = create_token(web.settings, [FLEETS[0]], admin=True)["token"]
    async with _client(web, admin) as client:
        served = await _served(client, new[0].run_id)
    _leaks(served, set(canaries) | set(canaries.values()))
    # the CLI (an operator's) shows them: the check above could fail
    shown = json.dumps(_cli(web, "timeline", new[0].run_id, "--json"))
    assert [e for e in canaries if e in shown]


async def test_get_artifact_serves_by_handle_only_what_a_next_turn_offers(web: Web) -> None:
    """Large tool output the publisher moved into the artifact store is read back by its
    handle, a page at a time, as stored; output that held a secret (its artifact RESTRICTED,
    the secret replaced before it was stored) is refused; an item's own text by its sha256;
    nothing of another fleet's run, nor a handle the next turn does not offer."""
    new = simulate(1, 1, seed=5151)
    run_id = new[0].run_id
    clean = "".join(f"line {n}: 42 passed, 0 failed\n" for n in range(2000))  # ~60 KB
    secret = "ghp_" + "aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4"[:36]
    leaky = f"git clone https://x-access-token@github.com/o/r # {secret}\n" + clean
    # the last tool result (the run's next turn holds it): its output moved to the store by
    # the publisher, and a second artifact beside it that held a secret
    store = FileArtifactStore.from_settings(web.settings)
    restricted = store.put(leaky.encode(), "text/plain")
    result = [e for e in new if e.kind.value == "TOOL_CALL_RESULT"][-1]
    doc = to_json(result)
    doc["parts"][0].update(summary=clean, artifact_refs=[to_json_ref(restricted)])
    new[new.index(result)] = from_json(doc)
    small = web.settings.model_copy(update={"max_entry_bytes": 16 * 1024})  # moves the output
    async with AsyncPublisher(small) as publisher:
        await publisher.publish_batch(new)
    await _project(web.settings)

    async with _client(web, web.token_a) as client:
        turn = await _tool(client, "get_next_turn", run_id=run_id)
        items = turn.structured_content["items"]
        item = next(i for i in items if i["source_entry_id"] == result.entry_id)
        refs = {r["redaction_level"]: r for r in item["artifact_refs"]}
        offered, withheld = refs["REVIEW"], refs["RESTRICTED"]
        assert offered["redaction_level"] == "REVIEW"
        assert withheld["redaction_level"] == "RESTRICTED"
        assert secret not in json.dumps(turn.structured_content)

        got, offset = "", 0
        while offset is not None:  # pages of 25,000 characters, as stored
            page = await _tool(
                client,
                "get_artifact",
                run_id=run_id,
                artifact=offered["artifact_id"],
                offset=offset,
                limit=25_000,
            )
            doc = page.structured_content
            assert doc["kind"] == "artifact" and len(doc["text"]) <= 25_000
            assert (page.meta or {})["items"][0]["source_entry_id"] == result.entry_id
            got, offset = got + doc["text"], doc["next_offset"]
        assert got == clean

        refused = await client.call_tool(
            "get_artifact", {"run_id": run_id, "artifact": withheld["artifact_id"]}
        )
        assert refused.is_error and "withheld (RESTRICTED)" in _text(refused.content[0])
        item = next(i for i in items if i.get("text"))
        own = await _tool(
            client, "get_artifact", run_id=run_id, artifact=f"sha256:{item['sha256']}"
        )
        assert own.structured_content["kind"] == "item"
        assert own.structured_content["text"] == item["text"]

        other = web.runs_of(FLEETS[1])[0]
        for run, handle in (
            (other, offered["artifact_id"]),
            (web.live_run, offered["artifact_id"]),
        ):
            refused = await client.call_tool("get_artifact", {"run_id": run, "artifact": handle})
            assert refused.is_error, run
        assert _text(refused.content[0]).startswith("no artifact")
    # the store holds the secret's output redacted: the secret never reached it
    assert withheld["sha256"] == restricted.sha256
    assert secret.encode() not in store.get(restricted.sha256)
    assert b"[REDACTED:" in store.get(restricted.sha256)


def to_json_ref(ref: ArtifactRef) -> dict[str, Any]:
    return ref.model_dump(mode="json")


def _hostile_call(web: Web) -> list[LedgerEntry]:
    """The running run's next two entries: a tool call and its result, full of instructions
    and markup (made from the run's last tool call and result, as a new call's)."""
    seq = web.withheld[0].sequence_no
    made: list[LedgerEntry] = []
    for n, kind in enumerate(("TOOL_CALL_REQUEST", "TOOL_CALL_RESULT")):
        last = max(
            (e for e in web.sent if e.run_id == web.live_run and e.kind.value == kind),
            key=lambda e: e.sequence_no,
        )
        doc = to_json(last)
        doc.update(
            entry_id=str(uuid.uuid4()),
            sequence_no=seq + n,
            step_id=f"step-{seq + n}",
            occurred_at=to_json(web.withheld[0])["occurred_at"],
        )
        doc["causation"]["tool_call_id"] = "call_hostile"
        doc["parts"][0]["tool_call_id"] = "call_hostile"
        if made:
            doc["causation"]["parent_entry_id"] = made[0].entry_id
            doc["parts"][0].update(summary=HOSTILE_TOOL, artifact_refs=[])
        made.append(from_json(doc))
    return made


async def _project(settings: Settings) -> None:
    """Apply what the topics hold past the stored positions, into PostgreSQL and Redis."""
    sink = KafkaDeadLetterSink(settings)
    engine = Engine(
        live_targets(settings.pg_address),
        settings.pg_address,
        settings.redis_address,
        sink,
        redis_prefix=settings.redis_prefix,
        change_streams=stream_projections(settings),  # the outbox the change relay sends
    )
    await engine.start()
    try:
        topics = [ledger_topic(settings.topic_prefix, f) for f in FLEETS]
        await drain(engine, settings.kafka_address, topics, batch_size=500)
    finally:
        await engine.close()
        await sink.close()


async def test_read_your_writes_and_hostile_text_stays_data(web: Web) -> None:
    """The running run gets its next entries, one of them a tool result full of instructions:
    a read with min_seq waits for the engine, then serves that text only as data."""
    batch = _hostile_call(web)
    target = batch[-1].sequence_no
    async with _client(web, web.token_a) as client:
        before = await _tool(client, "get_working_memory", run_id=web.live_run)
        assert before.structured_content["applied_seq"] < target
        # asked before the entry exists: the answer waits for it (bounded)
        reads = [
            asyncio.create_task(
                client.call_tool(name, {"run_id": web.live_run, "min_seq": target, "timeout_s": 10})
            )
            for name in ("get_working_memory", "get_next_turn", "get_timeline")
        ]
        await asyncio.sleep(0.2)
        assert not any(r.done() for r in reads)
        async with AsyncPublisher(web.settings) as publisher:
            await publisher.publish_batch(batch)
        published = time.monotonic()
        await _project(web.settings)
        memory, turn, timeline = await asyncio.gather(*reads)
        print(f"published to answered: {time.monotonic() - published:.3f} s (incl. projecting)")
        for answer in (memory, turn, timeline):
            assert not answer.is_error
            meta = answer.meta or {}
            assert meta["reached"] is True and meta["applied_seq"] >= target
        assert memory.structured_content["applied_seq"] >= target
        assert turn.structured_content["as_of_sequence_no"] >= target

        # the instructions are in the next turn only inside a data wrapper, flagged
        text = _text(turn.content[0])
        assert "IGNORE ALL PREVIOUS INSTRUCTIONS" in text, text[-3000:]
        at = text.index("IGNORE ALL PREVIOUS INSTRUCTIONS")
        opened = [m for m in re.finditer(r"<(\w+)([^>]*)>", text[:at])][-1]
        assert opened[1] in DATA_TAGS and f"</{opened[1]}>" not in text[opened.end() : at]
        assert 'flagged="instruction-like"' in opened[2]
        item = next(
            i for i in turn.structured_content["items"] if "IGNORE ALL" in (i["text"] or "")
        )
        assert item["trust_level"] != "PLATFORM_TRUSTED" and "instruction-like" in item["flags"]
        meta_item = next(i for i in (turn.meta or {})["items"] if i["sha256"] == item["sha256"])
        assert (
            meta_item["flags"] == item["flags"]
            and meta_item["source_entry_id"] == batch[-1].entry_id
        )
        assert _text(turn.content[0]) + "\n" == _cli(web, "context", web.live_run, "--render")

        # a sequence number that does not come: said plainly, after the wait asked for
        start = time.monotonic()
        late = await _tool(
            client, "get_working_memory", run_id=web.live_run, min_seq=target + 500, timeout_s=0.3
        )
        assert time.monotonic() - start >= 0.3
        meta = late.meta or {}
        assert meta["reached"] is False and meta["applied_seq"] == target
        assert meta["note"].startswith(f"not yet: working-memory has applied seq {target}")
        read = await client.read_resource(
            f"ledger://runs/{web.live_run}/timeline?min_seq={target + 500}&timeout_s=0.1"
        )
        assert (read.contents[-1].meta or {})["reached"] is False


async def test_prompts_and_the_audit_of_reads(web: Web) -> None:
    made = create_token(web.settings, [FLEETS[0]])
    run_id = web.runs_of(FLEETS[0])[0]
    other = web.runs_of(FLEETS[1])[0]
    async with _client(web, made["token"]) as client:
        prompts = (await client.list_prompts()).prompts
        assert {p.name for p in prompts} == {"resume_run", "explain_failure", "review_diff"}
        resume = await client.get_prompt("resume_run", {"run_id": run_id})
        rendered = _cli(web, "context", run_id, "--render")
        assert rendered.strip() in _text(resume.messages[0].content)
        for name in ("explain_failure", "review_diff"):
            assert (await client.get_prompt(name, {"run_id": run_id})).messages
        with pytest.raises(MCPError):
            await client.get_prompt("resume_run", {"run_id": other})
        await _tool(client, "get_costs", run_id=run_id)
        await _tool(client, "get_costs", run_id=run_id)
        await client.read_resource(f"ledger://runs/{run_id}/timeline")
        await client.call_tool("get_costs", {"run_id": other})
        await _tool(client, "find_runs")
    rows = _cli(web, "mcp-audit", "--token", made["token_id"], "--json")
    counts = {(r["tool"], r["run_id"]): (r["reads"], r["refused"]) for r in rows}
    assert counts == {
        ("get_costs", run_id): (2, 0),
        ("get_costs", other): (1, 1),
        ("resource:timeline", run_id): (1, 0),
        ("find_runs", ""): (1, 0),
        ("prompt:resume_run", run_id): (2, 0),
        ("prompt:resume_run", other): (1, 1),
        ("prompt:explain_failure", run_id): (2, 0),
        ("prompt:review_diff", run_id): (2, 0),
    }
    seq = _cli(web, "timeline", run_id, "--json")["applied_seq"]
    assert {r["last_seq"] for r in rows if r["run_id"] == run_id} == {seq}
    table = CliRunner().invoke(
        app,
        ["mcp-audit", "--run", run_id],
        env={"AGENTLEDGER_PG_DSN": web.settings.pg_address, "COLUMNS": "250"},
    )
    assert table.exit_code == 0 and "get_costs" in table.stdout
    # a run's reads by the start of its id, as other commands take a run
    start = _cli(web, "mcp-audit", "--token", made["token_id"], "--run", run_id[:10], "--json")
    assert all(r["run_id"].startswith(run_id[:10]) for r in start)
    lists = _cli(web, "mcp-audit", "--token", made["token_id"], "--run", "", "--json")
    assert {(r["tool"], r["run_id"]) for r in lists} == {("find_runs", "")}  # no run's reads
    assert {k for k in counts if k[1] == run_id} <= {(r["tool"], r["run_id"]) for r in start}


async def test_a_subscription_hears_of_a_new_entry_within_a_second(web: Web) -> None:
    """Both ways a client subscribes: ``subscriptions/listen`` (2026-07-28 sessions, the SDK's
    default) and ``resources/subscribe`` (2025-era sessions, which today's clients open)."""
    uri = f"ledger://runs/{web.live_run}/working-memory"
    by_prefix = f"ledger://runs/{web.live_run[:13]}/working-memory"  # resolved to the run
    other = f"ledger://runs/{web.runs_of(FLEETS[1])[0]}/working-memory"
    # the change streams: the engine writes the outbox in its commit, the relay sends it
    relay, stop = ChangeRelay(web.settings, idle_s=0.2), asyncio.Event()
    relaying = asyncio.create_task(relay.run(stop))
    try:
        with anyio.fail_after(30):
            await relay.active.wait()
        latency, legacy_latency = await _subscribe_both_ways(web, uri, by_prefix, other)
    finally:
        stop.set()
        await relaying
    print(f"commit to notification: listen {latency:.3f} s, subscribe {legacy_latency:.3f} s")
    assert latency <= 1.0 and legacy_latency <= 1.0


async def _subscribe_both_ways(
    web: Web, uri: str, by_prefix: str, other: str
) -> tuple[float, float]:
    heard: list[float] = []
    updated = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, ResourceUpdatedNotification) and message.params.uri == uri:
            heard.append(time.monotonic())
            updated.set()

    async def next_entry() -> float:
        applied = _cli(web, "memory", web.live_run, "--json")["applied_seq"]
        entry = next(e for e in web.withheld if e.sequence_no > applied)
        async with AsyncPublisher(web.settings) as publisher:
            await publisher.publish_batch([entry])
        await _project(web.settings)
        return time.monotonic()  # the engine's drain has returned: its transaction committed

    async with _client(web, web.token_a) as client:
        with pytest.raises(MCPError, match="no run"):
            async with client.listen(resource_subscriptions=[other]):
                pass
        async with client.listen(resource_subscriptions=[by_prefix]) as sub:
            committed = await next_entry()
            with anyio.fail_after(5):
                event = await sub.__anext__()
            latency = time.monotonic() - committed
        assert isinstance(event, ResourceUpdated) and event.uri == by_prefix

    params = StdioServerParameters(command=AGENTLEDGER, args=["mcp"], env=_env(web, web.token_a))
    async with Client(params, mode="legacy", message_handler=on_message) as legacy:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await legacy.subscribe_resource(uri)
            with pytest.raises(MCPError, match="no run"):
                await legacy.subscribe_resource(other)
        committed = await next_entry()
        with anyio.fail_after(5):
            await updated.wait()
        legacy_latency = heard[0] - committed
    return latency, legacy_latency


@contextmanager
def _serve(web: Web) -> Iterator[str]:
    """``agentledger serve`` as a process (the composition root mounts /mcp); its base URL.
    It must stop on SIGTERM, MCP sessions open or not."""
    port = free_port()
    env = {**os.environ, **_env(web, "")}
    env.pop("AGENTLEDGER_TOKEN")
    server = subprocess.Popen(
        [AGENTLEDGER, "serve", "--port", str(port)], env=env, stderr=subprocess.DEVNULL
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx2.get(f"{base}/health").status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "serve did not start"
            time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        assert server.wait(20) in (0, -signal.SIGTERM)


async def test_streamable_http_at_mcp_of_serve(web: Web) -> None:
    run_id = web.runs_of(FLEETS[0])[0]
    other = web.runs_of(FLEETS[1])[0]
    memory = _memory(web, run_id)
    with _serve(web) as base:
        headers = {"Authorization": f"Bearer {web.token_a}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client,
        ):
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS
            answer = await _tool(client, "get_working_memory", run_id=run_id)
            assert answer.structured_content == _visible_memory(memory, _hidden(web, run_id))
            read = await client.read_resource(f"ledger://runs/{run_id}/costs")
            assert (
                json.loads(_text(read.contents[-1]))
                == _cli(web, "timeline", run_id, "--json")["cost"]
            )
            refused = await client.call_tool("get_costs", {"run_id": other})
            assert refused.is_error and _text(refused.content[0]) == f"no run {other}"
        # without a valid token nothing of /mcp answers, initialize included: 401 (before,
        # initialize answered 200 and only the tools refused)
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        accept = {"Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(timeout=30) as http:
            for token in (None, "alt_nope", web.revoked):
                auth = {"Authorization": f"Bearer {token}"} if token else {}
                answer = await http.post(f"{base}/mcp", json=initialize, headers=accept | auth)
                assert answer.status_code == 401, (token, answer.text)
                assert answer.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
            auth = {"Authorization": f"Bearer {web.token_a}"}
            answer = await http.post(f"{base}/mcp", json=initialize, headers=accept | auth)
            assert answer.status_code == 200
            assert (await http.get(f"{base}/health")).json() == {"status": "ok"}  # the web app


async def test_read_your_writes_of_a_new_run_and_run_id_prefixes(web: Web) -> None:
    """An agent that publishes the first entries of a new run and reads them with min_seq
    gets them (the run is unknown until the engine has projected it: the read waits for it);
    a run id prefix is resolved within the token's fleets, as the CLI resolves one."""
    new = simulate(1, 1, seed=4747)
    run_id, last = new[0].run_id, new[-1].sequence_no
    assert new[0].fleet_id == FLEETS[0] and run_id not in web.runs_of(FLEETS[0])
    async with _client(web, web.token_a) as client:
        read = asyncio.create_task(
            client.call_tool(
                "get_working_memory", {"run_id": run_id, "min_seq": last, "timeout_s": 10}
            )
        )
        await asyncio.sleep(0.2)
        assert not read.done()
        async with AsyncPublisher(web.settings) as publisher:
            await publisher.publish_batch(new)
        await _project(web.settings)
        answer = await read
        assert not answer.is_error, answer.content
        meta = answer.meta or {}
        assert meta["reached"] is True and meta["applied_seq"] >= last
        assert answer.structured_content == _visible_memory(
            _memory(web, run_id),
            {e.entry_id for e in new if e.visibility.value != "MODEL_VISIBLE"},
        )
        # an unknown run with min_seq: waited out, then "no run", like another fleet's
        for unknown in (str(uuid.uuid4()), web.runs_of(FLEETS[1])[0]):
            start = time.monotonic()
            refused = await client.call_tool(
                "get_costs", {"run_id": unknown, "min_seq": 1, "timeout_s": 0.3}
            )
            assert refused.is_error and _text(refused.content[0]) == f"no run {unknown}"
            assert time.monotonic() - start >= 0.3

        # find_runs with min_seq lists the new run once its entry is in the list's projections
        listed = await _tool(client, "find_runs", run_id=run_id, min_seq=last, limit=200)
        assert (listed.meta or {})["reached"] is True
        assert run_id in {r["run_id"] for r in listed.structured_content["runs"]}
        not_yet = await _tool(client, "find_runs", run_id=run_id, min_seq=last + 500, timeout_s=0.2)
        assert (not_yet.meta or {})["reached"] is False and "not yet" in (not_yet.meta or {})[
            "note"
        ]
        assert (await client.call_tool("find_runs", {"min_seq": 3})).is_error  # whose seq?

        # prefixes: a unique one is the run; one of another fleet's run is no run
        own = web.runs_of(FLEETS[0])[0]
        prefix = next(
            own[:n]
            for n in range(4, len(own))
            if sum(r.startswith(own[:n]) for r in [*web.runs_of(FLEETS[0]), run_id]) == 1
        )
        by_prefix = await _tool(client, "get_costs", run_id=prefix)
        assert (by_prefix.meta or {})["run_id"] == own
        assert (
            by_prefix.structured_content
            == (await _tool(client, "get_costs", run_id=own)).structured_content
        )
        read_uri = await client.read_resource(f"ledger://runs/{prefix}/costs")
        assert (read_uri.contents[-1].meta or {})["run_id"] == own
        other = web.runs_of(FLEETS[1])[0]
        refused = await client.call_tool("get_costs", {"run_id": other[:8]})
        assert refused.is_error and _text(refused.content[0]) == f"no run {other[:8]}"


async def test_an_agent_resumes_a_run_from_its_next_turn(web: Web) -> None:
    """The example agent loop (consumers/examples/resume_agent.py) with a scripted model: two
    turns on the running run, each reply published, projected by the engine in the
    background, and read back with min_seq. (Last in this file: it extends the running run.)"""
    first = next(e for e in web.sent if e.run_id == web.live_run)
    run = RunIdentity(web.live_run, first.fleet_id, first.session_id, first.attempt_id)
    contexts: list[str] = []
    projecting: list[asyncio.Task[None]] = []

    async def model(context: str) -> str:
        contexts.append(context)
        return f"Plan: 1. reread the failing test {len(contexts)} 2. fix it 3. run the tests"

    async with AsyncPublisher(web.settings) as publisher:

        async def publish(entries: list[LedgerEntry]) -> None:
            await publisher.publish_batch(entries)
            projecting.append(asyncio.create_task(_project(web.settings)))  # as a worker would

        async with _client(web, web.token_a) as client:
            turns = await resume(client, run, model, publish, turns=2)
    await asyncio.gather(*projecting)
    assert [t.reached for t in turns] == [True, True]
    assert turns[1].seq == turns[0].seq + 1 and turns[0].memory_seq >= turns[0].seq
    assert turns[1].plan == ("reread the failing test 2", "fix it", "run the tests")
    assert turns[1].context_seq >= turns[0].seq
    assert "reread the failing test 1" in contexts[1]  # the first reply is in the next turn
    assert _cli(web, "memory", web.live_run, "--json")["state"]["current_plan"][0] == (
        "reread the failing test 2"
    )


SLASHED = "team-a/run-1"


async def test_a_run_resource_takes_an_encoded_run_id(web: Web) -> None:
    """Before: ``ledger://runs/team-a%2Frun-1/costs`` (the template's ``{run_id}`` expanded,
    RFC 6570) was "no resource" while ``get_costs`` read the run. Now the resource decodes
    its segment."""
    entries = [from_json({**to_json(e), "run_id": SLASHED}) for e in simulate(1, 1, seed=7701)]
    async with AsyncPublisher(web.settings) as publisher:
        await publisher.publish_batch(entries)
    await _project(web.settings)
    async with _client(web, web.token_a) as client:
        tool = await _tool(client, "get_costs", run_id=SLASHED)
        read = await client.read_resource(f"ledger://runs/{quote(SLASHED, safe='')}/costs")
        assert json.loads(_text(read.contents[-1])) == tool.structured_content
        assert (read.contents[-1].meta or {})["run_id"] == SLASHED


async def test_text_no_database_takes_is_a_clear_error_and_counted(web: Web) -> None:
    """A NUL in a run id, a call or a search, and a megabyte where a run id goes, reached
    PostgreSQL: a JSON-RPC internal error in the database's words ("PostgreSQL text fields
    cannot contain NUL", "index row requires 11496 bytes"), a traceback on the server's
    stderr holding the whole megabyte, and the read not counted. Now each is a one-line
    error naming the argument (or "no run" for a prompt), the server stays up, and a refused
    prompt read is counted."""
    made = create_token(web.settings, [FLEETS[0]])
    run_id = web.runs_of(FLEETS[0])[0]
    huge = "r" * 1_000_000
    async with _client(web, made["token"]) as client:
        for name, args, field in (
            ("get_working_memory", {"run_id": "run\x00"}, "run_id"),
            ("get_costs", {"run_id": huge}, "run_id"),
            ("get_next_turn", {"run_id": run_id, "call": "\x00"}, "call"),
            ("find_runs", {"search": "a\x00b"}, "search"),
            ("find_runs", {"failure_class": "\x00"}, "failure_class"),
        ):
            result = await client.call_tool(name, args)
            assert result.is_error and _text(result.content[0]) == f"bad arguments: {field}"
        for uri in ("ledger://runs/run%00/costs", "ledger://runs?search=%00"):
            with pytest.raises(MCPError, match=r"^bad arguments: (run_id|search)$"):
                await client.read_resource(uri)
        with pytest.raises(MCPError, match=r"^no run run\\x00$"):
            await client.get_prompt("resume_run", {"run_id": "run\x00"})
        await _tool(client, "get_costs", run_id=run_id)  # the server is still up
    rows = _cli(web, "mcp-audit", "--token", made["token_id"], "--json")
    counts = {(r["tool"], r["run_id"]): (r["reads"], r["refused"]) for r in rows}
    assert counts == {("prompt:resume_run", "run\\x00"): (1, 1), ("get_costs", run_id): (1, 0)}


async def test_a_subscription_ends_when_its_token_is_revoked(web: Web) -> None:
    """Before: over HTTP, after ``tokens revoke`` the reads failed but an open
    ``subscriptions/listen`` stream still delivered ``notifications/resources/updated`` for new
    entries. Now the stream re-checks its token (before each event, and every second) and
    ends with an error; nothing published after the revocation reaches it."""
    entries = simulate(1, 1, seed=7801)
    run_id = entries[0].run_id

    async def publish(part: list[LedgerEntry]) -> None:
        async with AsyncPublisher(web.settings) as publisher:
            await publisher.publish_batch(part)
        await _project(web.settings)

    await publish(entries[:10])
    made = create_token(web.settings, [FLEETS[0]])
    uri = f"ledger://runs/{run_id}/working-memory"
    relay, stop = ChangeRelay(web.settings, idle_s=0.2), asyncio.Event()
    relaying = asyncio.create_task(relay.run(stop))
    heard_after: list[Any] = []
    try:
        with anyio.fail_after(30):
            await relay.active.wait()
        with _serve(web) as base:
            headers = {"Authorization": f"Bearer {made['token']}"}
            async with (
                httpx2.AsyncClient(headers=headers, timeout=30) as http,
                Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client,
            ):
                with pytest.raises(BaseException) as ended:  # the SDK raises it in a group
                    async with client.listen(resource_subscriptions=[uri]) as sub:
                        await publish(entries[10:20])
                        with anyio.fail_after(10):
                            assert isinstance(await sub.__anext__(), ResourceUpdated)
                        revoke = ["tokens", "revoke", made["token_id"]]
                        env = {"AGENTLEDGER_PG_DSN": web.settings.pg_address}
                        assert CliRunner().invoke(app, revoke, env=env).exit_code == 0
                        await publish(entries[20:])
                        with anyio.fail_after(15):
                            async for event in sub:
                                heard_after.append(event)
    finally:
        stop.set()
        await relaying
    assert heard_after == []
    assert any(
        isinstance(e, MCPError) and "no longer valid" in str(e) for e in _leaves(ended.value)
    ), ended.value


def _leaves(exc: BaseException) -> list[BaseException]:
    """An exception and, of a group, every exception in it (and their causes)."""
    found = [exc, *([exc.__cause__] if exc.__cause__ else [])]
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found += _leaves(inner)
    return found
