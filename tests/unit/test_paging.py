"""Checkpoint pages: what a large checkpoint leaves and its pages give the document back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from projectors import paging
from projectors.base import fold_all
from projectors.registry import all_projections
from streams.simulate import simulate_runs

PATHS = ("index", "seen", "small", "nested.0.deep", "absent.x")


def _big(n: int) -> dict[str, Any]:
    return {
        "index": {f"e-{i:05d}": "ok" if i % 3 else "failed" for i in range(n)},
        "seen": [[i, f"k{i}"] for i in range(n)],
        "small": {"a": [1, 2, 3], "b": None},
        "nested": [{"deep": {f"x{i}": i for i in range(n)}}],
    }


def test_a_small_checkpoint_is_left_whole() -> None:
    doc = orjson.dumps({"index": {f"e{i}": "ok" for i in range(600)}})
    assert len(doc) < paging.PAGED_FROM_BYTES
    assert paging.split(doc, PATHS) == (doc, {})


def test_large_members_leave_in_pages_and_join_gives_the_document_back() -> None:
    original = _big(5_000)
    left, pages = paging.split(orjson.dumps(original), PATHS)
    assert pages
    kept = orjson.loads(left)
    assert kept["small"] == original["small"]
    assert set(kept["index"]) == {paging.MARK, paging.KIND}
    assert kept["nested"] == original["nested"]  # a list's members are not walked into
    assert kept[paging.PAGED] == ["index", "seen"]
    assert len(kept["index"][paging.MARK]) == -(-5_000 // paging.PAGE_ITEMS)
    assert len(left) < len(orjson.dumps(original["nested"])) + 4_096  # the rest names pages
    assert max(map(len, pages.values())) < 64 * 1024
    named = [i for path in kept[paging.PAGED] for i in kept[path][paging.MARK]]
    assert sorted(named) == sorted(pages)
    parsed = {k: orjson.loads(v) for k, v in pages.items()}
    assert paging.join(kept, parsed) == original
    joined: dict[str, dict[str, str]] = paging.join(kept, parsed)
    assert list(joined["index"]) == list(original["index"])  # (in order)


def test_a_grown_document_names_the_pages_it_had_and_adds_the_last() -> None:
    before = paging.split(orjson.dumps(_big(6_000)), PATHS)[1]
    after = paging.split(orjson.dumps(_big(6_300)), PATHS)[1]
    # members appended: every full page is the same page; only the partly filled ones change
    # (two members paged: "index" and "seen"; 6,000 members fill 11 pages of 512)
    assert before
    assert len(set(after) - set(before)) <= 2 * 2
    assert len(set(after) & set(before)) >= 2 * 11


def test_a_missing_page_is_an_error_not_an_empty_member() -> None:
    kept, pages = paging.split(orjson.dumps(_big(5_000)), PATHS)
    parsed = {k: orjson.loads(v) for k, v in pages.items()}
    parsed.pop(next(iter(parsed)))
    with pytest.raises(LookupError, match="missing"):
        paging.join(orjson.loads(kept), parsed)


def test_an_array_large_in_bytes_is_paged_by_bytes() -> None:
    """A bounded list of large members (the context window's pool) is paged by size: at most
    PAGE_BYTES a page, but a member larger than that alone in its page."""
    members = [{"text": "x" * (9_000 if n != 7 else 100_000), "n": n} for n in range(40)]
    original = {"pool": members, "other": 1}
    left, pages = paging.split(orjson.dumps(original), ("pool",))
    sizes = sorted(map(len, pages.values()))
    assert sizes[-1] > 100_000  # the one large member, alone
    assert all(n <= paging.PAGE_BYTES for n in sizes[:-1])
    assert len(left) < 1_024
    parsed = {k: orjson.loads(v) for k, v in pages.items()}
    assert paging.join(orjson.loads(left), parsed) == original


def test_members_shaped_like_references_elsewhere_are_content() -> None:
    """Only the paths a split lists are read as references: an agent's object shaped like one,
    anywhere else in the document, comes back as it was."""
    lookalike = {paging.MARK: ["0" * 32], paging.KIND: "object"}
    original = {**_big(5_000), "meta": lookalike, "small": {"a": lookalike}}
    left, pages = paging.split(orjson.dumps(original), PATHS)
    parsed = {k: orjson.loads(v) for k, v in pages.items()}
    kept = orjson.loads(left)
    assert paging.join(kept, parsed) == original
    assert kept == orjson.loads(left)  # join copies what it changes


def test_every_projection_checkpoint_of_a_long_run_round_trips() -> None:
    [run] = list(simulate_runs(1, 1, 7, entries_per_run=3_000))
    for p in all_projections():
        state = fold_all(p, run)
        assert state is not None
        doc = p.checkpoint_json(state)
        left, pages = paging.split(doc, p.paged)
        parsed = {k: orjson.loads(v) for k, v in pages.items()}
        back = paging.join(orjson.loads(left), parsed)
        assert back == orjson.loads(doc), p.name
        if p.name in ("working-memory", "context-manifests"):
            assert pages, p.name
        assert p.from_doc(back) == p.from_doc(orjson.loads(doc)), p.name


def test_a_checkpoint_split_from_its_pieces_is_the_split_of_its_document() -> None:
    """split_lists gives what split gives for the document the pieces make (same bytes, same
    pages), without parsing it; a small document stays whole."""
    bare = b'{"a":1,"big":[],"tail":"x","few":[],"end":true}'
    marks = ((b'"big":[', b'],"tail":'), (b'"few":[', b'],"end":'))
    big = [orjson.dumps({"n": i, "text": "y" * 90}) for i in range(1_500)]
    few = [b"1", b"2"]
    lists = [("big", marks[0], big), ("few", marks[1], few)]
    whole, (left, pages) = paging.split_lists(bare, lists, ("few", "big"))
    assert orjson.loads(whole) == {
        "a": 1,
        "big": [orjson.loads(b) for b in big],
        "tail": "x",
        "few": [1, 2],
        "end": True,
    }
    assert (left, pages) == paging.split(whole, ("few", "big"))
    assert len(pages) > 1 and len(left) < 1_024
    small = [("big", marks[0], big[:3]), ("few", marks[1], few)]
    whole, split = paging.split_lists(bare, small, ("big", "few"))
    assert len(whole) < paging.PAGED_FROM_BYTES and split == (whole, {})


def test_context_manifests_pages_its_checkpoint_from_pieces_as_split_would() -> None:
    """While the memory's index is small enough to stay in the row, the context manifests'
    checkpoint comes split from its pieces, the same bytes and pages split gives; beyond it,
    no split is given (the store splits the document)."""
    p = next(p for p in all_projections() if p.name == "context-manifests")
    [run] = list(simulate_runs(1, 1, 25, entries_per_run=700))
    given = 0
    for n in (60, 240, 300, 520, 700):
        state = fold_all(p, run[:n])
        assert state is not None
        whole, split = p.checkpoint_pages(state)
        assert whole == p.checkpoint_json(state)
        if n <= paging.PAGE_ITEMS:
            assert split == paging.split(whole, p.paged), n
            given += bool(split and split[1])
        else:
            assert split is None, n
    assert given >= 2  # some of them large enough to be paged


def _with_files(run: list[Any], files: int) -> list[Any]:
    """``run`` with a diff creating ``files`` files of long paths after its first half."""
    from schemas.models import DiffFile, DiffPart, FileChangeStatus, FileClassification

    half = len(run) // 2
    made = tuple(
        DiffFile(
            path=f"services/generated/client_sdk/resources/v2/endpoints/module_{i:05d}.py",
            status=FileChangeStatus.ADDED,
            lines_added=3,
            lines_deleted=0,
            classification=FileClassification.SOURCE,
        )
        for i in range(files)
    )
    template = next(e for e in run if any(isinstance(p, DiffPart) for p in e.parts))
    part = next(p for p in template.parts if isinstance(p, DiffPart))
    entry = template.model_copy(
        update={
            "entry_id": f"{template.entry_id}-many",
            "parts": (part.model_copy(update={"files": made}),),
        }
    )
    out = [*run[:half], entry, *run[half:]]
    return [e.model_copy(update={"sequence_no": i + 1}) for i, e in enumerate(out)]


@pytest.mark.parametrize("files", [300, 450, 3_000])
def test_a_run_s_file_lists_are_paged_as_split_pages_them(files: int) -> None:
    """The memory's index lists every file the run created and changed (paged, as its maps
    are): the context manifests' checkpoint made from its pieces is split's split of it or
    none (a list of fewer than PAGE_ITEMS paths but more than PAGED_ARRAY_BYTES is paged by
    split too), and the working memory's checkpoint row leaves the lists in pages."""
    [run] = list(simulate_runs(1, 1, 26, entries_per_run=300))
    run = _with_files(run, files)
    for p in all_projections():
        if p.name not in ("working-memory", "context-manifests"):
            continue
        state = fold_all(p, run)
        assert state is not None
        whole, split = p.checkpoint_pages(state)
        if split is not None:
            assert split == paging.split(whole, p.paged), p.name
        left, pages = split if split is not None else paging.split(whole, p.paged)
        if len(whole) >= paging.PAGED_FROM_BYTES:
            paged = orjson.loads(left)[paging.PAGED]
            prefix = "memory." if p.name == "context-manifests" else ""
            assert f"{prefix}index.created_files" in paged, p.name
            assert f"{prefix}index.changed_files" in paged, p.name
            if files > paging.PAGE_ITEMS:  # (each path's last change: a map, paged past 512)
                assert f"{prefix}index.file_changes" in paged, p.name
                assert b"module_00001.py" not in left, p.name
        back = paging.join(orjson.loads(left), {k: orjson.loads(v) for k, v in pages.items()})
        assert p.from_doc(back) == state, p.name
