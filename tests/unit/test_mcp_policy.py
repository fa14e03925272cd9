"""The MCP server's policy helpers without services: what is withheld, the size bound, the
resource URIs (the real stack's tests are tests/integration/test_mcp.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from consumers.mcp_ledger import (
    MAX_CHARS,
    WITHHELD,
    _drop_hidden_evidence,
    _drop_hidden_index,
    _fit_items,
    _hidden_of,
    _sweep,
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
        "detail": {"context_entry_id": HIDDEN, "note": f"made by {HIDDEN}."},
        "ids": [HIDDEN, SHOWN],
        "kept": SHOWN,
    }
    assert _sweep(doc, {HIDDEN}) == 5
    assert HIDDEN not in json.dumps(doc)
    assert doc["rows"] == [{"refs": {"entry": SHOWN}}]
    assert doc["finalized"] == [[3]]
    assert doc["detail"] == {"context_entry_id": WITHHELD, "note": WITHHELD}
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
    assert items[2]["text"] is None and items[1]["text"] == "small"
    assert _fit_items({"items": [{"text": "fits"}]}) == []


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
        if tool.name != "find_runs":
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
