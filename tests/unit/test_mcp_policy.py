"""The MCP server's policy helpers without services: what is withheld, the size bound, the
resource URIs (the real stack's tests are tests/integration/test_mcp.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from consumers.mcp_ledger import (
    MAX_CHARS,
    OFFERED_LEVELS,
    WITHHELD,
    Answer,
    _artifact_page,
    _drop_hidden_evidence,
    _drop_hidden_index,
    _fit_items,
    _hidden_of,
    _page_items,
    _sweep,
    artifact_sha,
    artifact_source,
    audit_key,
    cut_text,
)
from consumers.mcp_server import PROMPTS, TOOLS, _query, _read_uri
from schemas.errors import BadArgumentError, NotFoundError

HIDDEN = "0755468a-c192-4829-aea5-fc79029ccc84"
SHOWN = "50d9cc70-4d45-4af0-b3ec-dea39f7658e1"


def test_the_hidden_entries_are_those_the_memory_index_marks() -> None:
    memory = {"state": {"index": {"entries": {HIDDEN: "hidden", SHOWN: "read"}}}}
    assert _hidden_of(memory) == {HIDDEN}
    assert _hidden_of(None) == set() and _hidden_of({"state": {}}) == set()
    assert _drop_hidden_index(memory, {HIDDEN}) == 1
    assert memory["state"]["index"]["entries"] == {SHOWN: "read"}


def test_evidence_from_a_hidden_entry_is_left_out() -> None:
    doc: dict[str, Any] = {
        "classification": {"evidence": [{"entry_id": HIDDEN}, {"entry_id": SHOWN, "seq": 3}]}
    }
    assert _drop_hidden_evidence(doc, {HIDDEN}) == 1
    assert doc["classification"]["evidence"] == [{"entry_id": SHOWN, "seq": 3}]
    header = {"evidence": [{"entry_id": HIDDEN}]}  # the timeline header's failure
    assert _drop_hidden_evidence(header, {HIDDEN}) == 1 and header["evidence"] == []
    assert _drop_hidden_evidence(None, {HIDDEN}) == 0


def test_the_last_sweep_leaves_out_or_replaces_whatever_names_a_hidden_entry() -> None:
    doc: dict[str, Any] = {
        "finalized": [[3, {"entry_id": HIDDEN}]],
        "rows": [{"refs": {"entry": SHOWN}}, {"refs": {"context_entry": HIDDEN}}],
        "detail": {"context_entry_id": HIDDEN, "note": f"made by {HIDDEN} and {SHOWN}."},
        "ids": [HIDDEN, SHOWN],
        "kept": SHOWN,
    }
    assert _sweep(doc, {HIDDEN}) == 5
    assert HIDDEN not in json.dumps(doc)
    assert doc["rows"] == [{"refs": {"entry": SHOWN}}]
    assert doc["finalized"] == [[3]]
    assert doc["detail"] == {
        "context_entry_id": WITHHELD,
        "note": f"made by {WITHHELD} and {SHOWN}.",  # the words stay, the id goes
    }
    assert doc["ids"] == [WITHHELD, SHOWN] and doc["kept"] == SHOWN
    assert _sweep(doc, set()) == 0


def test_a_manifest_too_big_loses_its_biggest_texts_first() -> None:
    items = [
        {"text": "x" * (MAX_CHARS // 2), "sha256": "a", "source_entry_id": "e1"},
        {"text": "small", "sha256": "b", "source_entry_id": "e2"},
        {"text": "y" * (MAX_CHARS // 2 + 10), "sha256": "c", "source_entry_id": "e3"},
    ]
    doc = {"items": items}
    truncated = _fit_items(doc)
    assert len(json.dumps(doc)) <= MAX_CHARS
    assert [t["sha256"] for t in truncated] == ["c"]
    assert truncated[0]["chars"] == MAX_CHARS // 2 + 10 and truncated[0]["source_entry_id"] == "e3"
    assert truncated[0]["artifact"] == "sha256:c"  # the handle get_artifact reads it back by
    assert items[2]["text"] == cut_text(MAX_CHARS // 2 + 10, "c") and items[1]["text"] == "small"
    assert "get_artifact" in items[2]["text"] and "artifact=sha256:c" in items[2]["text"]
    assert _fit_items({"items": [{"text": "fits"}]}) == []


def test_a_handle_names_what_a_next_turn_offers_and_nothing_else() -> None:
    cut, offered, restricted = "a" * 64, "b" * 64, "c" * 64
    items: list[dict[str, Any]] = [
        {"sha256": cut, "text": "the whole text", "source_entry_id": "e1"},
        {
            "sha256": "d" * 64,
            "text": "[tool output: see artifact]",
            "artifact_refs": [
                {"sha256": offered, "redaction_level": "REVIEW"},
                {"sha256": restricted, "redaction_level": "RESTRICTED"},
            ],
        },
    ]
    assert artifact_source(items, cut) == (items[0], None)
    assert artifact_source(items, offered) == (items[1], items[1]["artifact_refs"][0])
    assert artifact_source(items, "e" * 64) is None
    assert "RESTRICTED" not in OFFERED_LEVELS and "REVIEW" in OFFERED_LEVELS
    assert artifact_sha(f"sha256:{cut.upper()}") == cut == artifact_sha(cut)
    for bad in ("sha256:abc", "../../etc/passwd", ""):
        with pytest.raises(BadArgumentError):
            artifact_sha(bad)
    page = _artifact_page("r", "sha256:x", "artifact", "text/plain", "x" * (3 * MAX_CHARS), 5, 10)
    assert page["text"] == "x" * 10 and page["next_offset"] == 15
    big = _artifact_page("r", "sha256:x", "artifact", "text/plain", '"' * MAX_CHARS, 0, MAX_CHARS)
    assert len(json.dumps(big)) <= MAX_CHARS and big["next_offset"] == len(big["text"])


def test_a_resource_query_takes_only_the_tools_arguments() -> None:
    assert _query("min_seq=5&timeout_s=0.5", ("min_seq", "timeout_s")) == {
        "min_seq": "5",
        "timeout_s": "0.5",
    }
    with pytest.raises(BadArgumentError, match="password"):
        _query("password=1", ("min_seq",))
    with pytest.raises(NotFoundError):
        _read_uri(None, "ledger://runs/r1/secrets")  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        _read_uri(None, "file:///etc/passwd")  # type: ignore[arg-type]


def test_every_tool_is_described_and_takes_what_it_says() -> None:
    for tool in TOOLS:
        schema = tool.args.model_json_schema()
        assert schema["type"] == "object" and tool.description
        assert {"run_id", "min_seq", "timeout_s"} <= set(schema["properties"])  # every read
        if tool.name == "get_artifact":
            assert sorted(schema["required"]) == ["artifact", "run_id"]
        elif tool.name != "find_runs":
            assert schema["required"] == ["run_id"]
        assert schema.get("additionalProperties") is False


def test_the_readme_and_docs_list_exactly_the_tools() -> None:
    """How to add the server names the tools there are (the issue's must-show), no others."""
    root = Path(__file__).resolve().parents[2]
    readme = root.joinpath("README.md").read_text()
    section = readme[readme.index("## Agents read their own ledger (MCP)") :]
    section = section[: section.index("\n## ", 1)]
    assert "claude mcp add agentledger" in section and '"mcpServers"' in section
    named = set(re.findall(r"`((?:get|find|explain)_\w+)`", section))
    assert named == {t.name for t in TOOLS}
    assert all(f"`{p}`" in section for p in PROMPTS)
    table = root.joinpath("docs", "mcp.md").read_text().split("## Tools", 1)[1]
    table = table.split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `(\w+)` \|", table, re.M)) == {t.name for t in TOOLS}


@pytest.mark.parametrize(
    ("tool", "field", "value"),
    [
        ("get_working_memory", "run_id", "run\x00"),
        ("get_working_memory", "run_id", "r" * 1_000_000),
        ("get_next_turn", "call", "call\x00"),
        ("get_next_turn", "call", "c" * 100_000),
        ("get_artifact", "call", "\x00"),
        ("get_artifact", "artifact", "sha256:" + "a" * 64 + "\x00"),
        ("find_runs", "search", "a\x00b"),
        ("find_runs", "search", "x" * 1_000_000),
        ("find_runs", "failure_class", "\x00"),
        ("find_runs", "fleet", "fleet\x00"),
        ("find_runs", "run_id", "\x00"),
    ],
)
def test_text_a_database_cannot_take_is_a_bad_argument(tool: str, field: str, value: str) -> None:
    """A NUL (PostgreSQL refuses it in text) or a megabyte where an id goes (past its index's
    row size) is refused by the argument's schema, before any read: it reached PostgreSQL and
    came back as a JSON-RPC internal error with the database's words and a traceback."""
    spec = next(t for t in TOOLS if t.name == tool)
    args: dict[str, Any] = {"run_id": "r1"} if tool != "find_runs" else {}
    if tool == "get_artifact":
        args["artifact"] = "sha256:" + "a" * 64
    args[field] = value
    with pytest.raises(ValidationError) as caught:
        spec.args.model_validate(args)
    assert {e["loc"][0] for e in caught.value.errors()} == {field}


def test_a_resource_query_s_bad_argument_is_named_as_a_tool_s_is() -> None:
    """A resource's bad argument says which, in one line, as a tool's does (it was pydantic's
    multi-line report with its documentation link)."""
    for uri, field in (
        ("ledger://runs/r1/working-memory?min_seq=-1", "min_seq"),
        ("ledger://runs/r1/timeline?limit=0", "limit"),
        ("ledger://runs/r1/costs?min_seq=abc", "min_seq"),
        ("ledger://runs/r%00/costs", "run_id"),
        ("ledger://runs?limit=-1", "limit"),
        ("ledger://runs?search=%00", "search"),
    ):
        with pytest.raises(BadArgumentError) as caught:
            _read_uri(None, uri)  # type: ignore[arg-type]
        assert str(caught.value) == f"bad arguments: {field}", uri


def test_a_refused_read_of_what_no_run_id_can_be_is_counted_under_what_it_said() -> None:
    """The audit counts a refused read under the run id asked for; a NUL or a megabyte made
    that count fail in PostgreSQL (the read was not counted). Now it is counted under the
    text its error shows."""
    assert audit_key("run-1") == "run-1" and audit_key("") == ""
    assert audit_key("run\x00") == "run\\x00"
    assert len(audit_key("r" * 1_000_000)) < 120


def test_the_json_an_answer_serves_is_the_json_its_bound_was_measured_on() -> None:
    """The size bound was measured on compact JSON but the text block was served indented: a
    real codex run's next turn (1,325 entries) came to 309,922 characters of text and its
    memory to 208,630, over the documented 200,000. A fitted document's served text is now
    within the bound, and is the same JSON."""
    items = [
        {"section": "recent", "item_kind": "TOOL_OUTPUT", "flags": [], "sha256": f"{i:064x}"}
        | {"source_entry_id": f"e{i}", "text": "t" * 40, "tokens": 12}
        for i in range(750)
    ]
    items[0]["text"] = "x" * (MAX_CHARS // 2)
    doc: dict[str, Any] = {"items": items}
    _fit_items(doc)
    served = Answer(doc, {}).json()
    assert len(served) <= MAX_CHARS and json.loads(served) == doc


def _small_items(count: int) -> list[dict[str, Any]]:
    """Items whose texts are shorter than a handle: cutting them saves nothing."""
    return [
        {"section": "recent", "item_kind": "TOOL_OUTPUT", "flags": ["instruction-like"]}
        | {"sha256": f"{i:064x}", "source_entry_id": f"{i:08x}-0000-4000-8000-000000000000"}
        | {"trust_level": "TOOL_OUTPUT", "visibility": "MODEL_VISIBLE", "tokens": 12}
        | {"text": f"ok {i}", "sequence_no": i}
        for i in range(count)
    ]


def test_a_next_turn_of_many_small_items_comes_a_page_of_items_at_a_time() -> None:
    """A real codex run's next turn (369 items) was 256,724 characters after its texts were
    cut: the items' own fields are never cut. Its items are now paged: each page fits, the
    pages together are every item once, in order, and each says where the next begins."""
    items = _small_items(2_000)
    assert len(json.dumps({"items": items})) > MAX_CHARS  # over, with nothing to cut
    served: list[dict[str, Any]] = []
    start: int | None = 0
    pages = 0
    while start is not None:
        doc: dict[str, Any] = {"id": "m1", "items": [dict(i) for i in items[start:]]}
        assert _fit_items(doc) == []  # nothing worth cutting
        page = _page_items(doc, start, len(items))
        assert page is not None and page["from"] == start and page["of"] == len(items)
        assert len(json.dumps(doc)) <= MAX_CHARS and page["served"] == len(doc["items"]) >= 1
        served += doc["items"]
        start, pages = page["next_item_from"], pages + 1
        # as many as fit: one more would not (the last page excepted)
        if start is not None:
            more = {**doc, "items": doc["items"] + [items[start]]}
            assert len(json.dumps(more)) > MAX_CHARS
    assert served == items and pages >= 2


def test_get_next_turn_pages_its_items_and_numbers_them_as_the_whole_turn_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ledger.next_turn's own steps (the stores stubbed: the real stack's reads are
    tests/integration/test_mcp.py): the page's items, their _meta indexes and the cut texts
    named by their index in the whole next turn, and item_from past the end refused."""
    from consumers import mcp_ledger, queries
    from consumers.mcp_ledger import Ledger

    items = _small_items(2_000)
    items[1_500]["text"] = "y" * 150_000  # on a later page: cut there, not on the first
    monkeypatch.setattr(queries, "manifest", lambda *_a: {"id": "m", "items": items})
    monkeypatch.setattr(queries, "render_manifest", lambda doc: f"{len(doc['items'])} items")

    def read(self: Any, via: str, run_id: str, proj: str, *_a: Any) -> Answer:
        doc, meta = _a[-1](run_id, set(), None)  # the build step, as _read_one calls it
        return Answer(doc, meta)

    monkeypatch.setattr(Ledger, "_read", read)
    ledger = object.__new__(Ledger)
    ledger.settings = None  # type: ignore[assignment]
    first = ledger.next_turn("r1")
    page = first.meta["items_page"]
    assert page["from"] == 0 and page["next_item_from"] == page["served"] < 2_000
    assert "truncated" not in first.meta and first.text == f"{page['served']} items"
    assert [m["index"] for m in first.meta["items"]] == list(range(page["served"]))
    start = page["next_item_from"]
    while start is not None and start <= 1_500:
        later = ledger.next_turn("r1", item_from=start)
        assert later.meta["items"][0]["index"] == start
        start = later.meta["items_page"]["next_item_from"]
    assert [t["index"] for t in later.meta["truncated"]] == [1_500]  # its index in the turn
    with pytest.raises(BadArgumentError, match="item_from"):
        ledger.next_turn("r1", item_from=2_000)
    assert mcp_ledger.MAX_CHARS == MAX_CHARS


def test_a_next_turn_that_fits_is_served_whole_and_says_nothing_of_pages() -> None:
    doc: dict[str, Any] = {"items": _small_items(10)}
    assert _page_items(doc, 0, 10) is None and len(doc["items"]) == 10
    rest: dict[str, Any] = {"items": _small_items(10)[4:]}  # from item 4: the last page
    assert _page_items(rest, 4, 10) == {"from": 4, "served": 6, "of": 10, "next_item_from": None}


def test_the_server_says_at_once_when_postgresql_is_not_there() -> None:
    """``agentledger mcp`` with PostgreSQL not reachable (a runtime that passed only
    AGENTLEDGER_TOKEN, so the server looked at the default port) waited 30 s for its pool,
    printed 24 lines of the pool's retries, then "unexpected PoolTimeout". Now it refuses at
    start in one line naming PostgreSQL and the settings that find it."""
    import socket
    import time

    from consumers.mcp_server import check_token
    from infra.settings import load_settings
    from schemas.errors import AgentLedgerError

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    settings = load_settings(pg_dsn=f"postgresql://postgres@127.0.0.1:{port}/agentledger")
    started = time.monotonic()
    with pytest.raises(AgentLedgerError) as caught:
        check_token(settings, "alt_x_y")
    assert time.monotonic() - started < 5
    said = str(caught.value)
    assert "PostgreSQL" in said and "AGENTLEDGER_PG_DSN" in said and "\n" not in said


async def test_a_read_while_postgresql_is_away_is_a_tool_error_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL stopped under a running server: a read came back as a JSON-RPC internal
    error in the pool's words ("terminating connection due to administrator command"), with
    a traceback on stderr. Now it is a tool result with is_error, saying PostgreSQL is not
    reachable and that the read can be asked again (in process: the SDK's client on the
    server object, the read made to fail as psycopg fails)."""
    import dataclasses

    from mcp import Client
    from psycopg import OperationalError

    from consumers.mcp_server import TOOL_BY_NAME, create_server
    from infra.settings import load_settings

    def away(*_: Any) -> Any:
        raise OperationalError("terminating connection due to administrator command")

    for name in ("get_costs", "find_runs"):
        monkeypatch.setitem(TOOL_BY_NAME, name, dataclasses.replace(TOOL_BY_NAME[name], read=away))
    server = create_server(load_settings(), "alt_x_y")
    async with Client(server) as client:
        for name, args in (("get_costs", {"run_id": "r1"}), ("find_runs", {})):
            result = await client.call_tool(name, args)
            said = result.content[0].text  # type: ignore[union-attr]
            assert result.is_error and said.startswith("PostgreSQL is not reachable"), said
            assert "administrator command" in said and "again" in said


def test_only_a_postgresql_that_is_away_is_said_to_be_unreachable() -> None:
    """psycopg raises OperationalError for a deadlock, a cancelled statement or a full disk
    too: those are PostgreSQL not answering this read, not PostgreSQL gone."""
    from psycopg import OperationalError, errors

    from consumers.mcp_ledger import away

    assert away(OperationalError("connection refused")).startswith("PostgreSQL is not reachable")
    assert away(errors.AdminShutdown("terminating")).startswith("PostgreSQL is not reachable")
    assert away(errors.DeadlockDetected("deadlock detected")).startswith(
        "PostgreSQL could not answer this read"
    )
    assert "deadlock detected" in away(errors.DeadlockDetected("deadlock detected"))


def test_what_was_asked_is_said_back_on_one_line_with_nothing_reordered() -> None:
    from schemas.shown import asked

    said = asked("abc\u202etxt.exe\x85x\u2028y\u2029z\x00\x9b")
    assert said == "abc[U+202E]txt.exe\\x85x[U+2028]y[U+2029]z\\x00\\x9b"
    assert len(asked("r" * 10_000)) < 120 and "10,000 characters" in asked("r" * 10_000)


def test_the_resume_prompt_says_when_it_holds_one_page_of_the_next_turn() -> None:
    from consumers.mcp_server import _more_items

    page = {"manifest_id": "m-7", "as_of_sequence_no": 90, "from": 0, "served": 280, "of": 369}
    said = _more_items("run-1", {"items_page": {**page, "next_item_from": 280}})
    assert "items 0-279 of the 369" in said and "item_from=280" in said and "m-7" in said
    last = {**page, "from": 280, "served": 89, "next_item_from": None}
    assert _more_items("run-1", {"items_page": last}) == ""  # the last page: nothing to add
    assert _more_items("run-1", {}) == ""  # the whole turn
