"""projectors.layered: a Layered mapping is the dict it stands for, and never changes."""

from __future__ import annotations

import random

import orjson
import pytest

from projectors.layered import TOP_LIMIT, Layered
from projectors.working_memory import RunIndex, ToolCallStatus


def _steps(seed: int, count: int) -> list[dict[str, int]]:
    """Random changes: mostly new keys (as an index grows), some keys set again."""
    rng = random.Random(seed)
    out = []
    for n in range(count):
        change = {f"k{n}": n}
        for _ in range(rng.choice((0, 0, 1, 2))):
            change[f"k{rng.randrange(n + 1)}"] = -n
        out.append(change)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_every_version_reads_iterates_and_compares_as_its_dict(seed: int) -> None:
    layered: Layered[str, int] = Layered()
    plain: dict[str, int] = {}
    kept: list[tuple[Layered[str, int], dict[str, int]]] = []
    for change in _steps(seed, 3 * TOP_LIMIT + 17):
        layered = layered.updated(change)
        plain = {**plain, **change}
        kept.append((layered, plain))
    for version, expected in kept[:: TOP_LIMIT // 8] + kept[-3:]:  # each version as it was made
        assert list(version) == list(expected)  # first-insertion order, a key set again stays
        assert list(version.items()) == list(expected.items())
        assert version.as_dict() == expected and list(version.as_dict()) == list(expected)
        assert len(version) == len(expected)
        assert version == expected and version == Layered.of(expected)
        for key in ("k0", f"k{len(expected) - 1}", "missing"):
            assert (key in version) == (key in expected)
            assert version.get(key) == expected.get(key)
            assert version.get(key, 7) == expected.get(key, 7)
    assert kept[0][0] != kept[1][0] and kept[-1][0] != kept[-2][0]


def test_a_copy_with_a_change_shares_what_did_not_change() -> None:
    big: Layered[str, int] = Layered.of({f"k{n}": n for n in range(10_000)})
    one = big.updated({"new": 1})
    assert one._base is big._base and one._top == {"new": 1}
    assert big.updated({}) is big and "new" not in big and len(big) == 10_000
    grown = one
    for n in range(TOP_LIMIT):  # past TOP_LIMIT keys set, they fold into a new base
        grown = grown.updated({f"n{n}": n})
    assert grown._base is not big._base and not grown._top
    assert len(grown) == 10_000 + 1 + TOP_LIMIT and len(one) == 10_001


def test_a_run_index_validates_and_serializes_as_dicts() -> None:
    doc = {
        "entries": {"e1": "pending", "e2": "succeeded"},
        "tool_calls": {"c1": {"request_entry_id": "e1", "status": None, "read_only": False}},
        "artifacts": {"a1": "e2"},
        "created_files": ["x.py"],
    }
    index = RunIndex.model_validate(doc)
    assert isinstance(index.entries, Layered) and isinstance(index.tool_calls, Layered)
    assert index.tool_calls["c1"] == ToolCallStatus(request_entry_id="e1")
    grown = index.model_copy(update={"entries": index.entries.updated({"e3": "failed"})})
    dumped = grown.model_dump(mode="json")
    assert dumped["entries"] == {"e1": "pending", "e2": "succeeded", "e3": "failed"}
    assert list(dumped["entries"]) == ["e1", "e2", "e3"]
    assert dumped["tool_calls"]["c1"]["request_entry_id"] == "e1"
    assert orjson.loads(grown.__pydantic_serializer__.to_json(grown)) == dumped
    assert RunIndex.model_validate(dumped) == grown
    given = {"entries": grown.entries, "tool_calls": grown.tool_calls}  # Layered maps as input
    again = RunIndex.model_validate(given)
    assert again.entries == grown.entries and again.tool_calls == grown.tool_calls
    assert index.model_dump(mode="json")["entries"] == doc["entries"]  # the source unchanged
    with pytest.raises(ValueError, match="entries"):
        RunIndex.model_validate({**doc, "entries": {"e1": "not an outcome"}})
