"""Bounded checkpoint rows (issue 25): what grows with a run leaves its checkpoint in pages.

A projection's checkpoint is its whole state, and some of a state grows with the run: the
working memory's evidence index holds every entry id (480 KB of a 10,000-entry run's 834 KB),
and the context manifests carry a copy of it. Stored as one document, the row of a long run
grows without bound. :func:`split` takes the members a projection names (``paged``) of more
than ``PAGE_ITEMS`` members out of a large checkpoint into pages of ``PAGE_ITEMS`` consecutive
members, each named by the hash of its content, leaves ``{"$al_pages": [ids], "$al_kind":
"object"|"array"}`` in their place and lists their paths at the document's top level;
:func:`join` puts them back. Members only ever appended (an index) fill the same pages again
and again, so a later checkpoint names the pages of the one before and adds the last; a store
keeps the pages a checkpoint names and drops the rest.

Pure functions on JSON; the store does the I/O. The document :func:`join` gives equals the
one :func:`split` was given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

PAGE_ITEMS = 512
PAGE_BYTES = 64 * 1024  # an array's page holds at most this much (but for one larger member)
PAGED_ARRAY_BYTES = 16 * 1024  # an array at a paged path this large is paged
# Checkpoints smaller than this are stored whole (most of them: no parse, no page lookups);
# with a head of at most ~100 KiB their row stays within 256 KiB.
PAGED_FROM_BYTES = 128 * 1024
MARK = "$al_pages"
KIND = "$al_kind"
# a document left by split lists the paths it took pages from (its top level is a state's
# fields, never content, so no member of an agent's can be read as a reference)
PAGED = "$al_paged"


def split(doc: bytes, paths: Sequence[str]) -> tuple[bytes, dict[str, bytes]]:
    """A checkpoint as (the document left, its pages by id): the members at ``paths`` (dotted,
    e.g. ``index.entries``: the parts that grow with the run) of more than ``PAGE_ITEMS``
    members, or arrays of more than ``PAGED_ARRAY_BYTES`` bytes, go into pages. A document of fewer
    than ``PAGED_FROM_BYTES`` bytes, or with nothing that large at ``paths``, is left whole."""
    if not paths or len(doc) < PAGED_FROM_BYTES:
        return doc, {}
    tree = orjson.loads(doc)
    pages: dict[str, bytes] = {}
    paged: list[str] = []
    for path in paths:
        *parents, last = path.split(".")
        node: Any = tree
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        member = node.get(last)
        if isinstance(member, dict) and len(member) > PAGE_ITEMS:
            items = list(member.items())
            chunks: list[Any] = [
                dict(items[i : i + PAGE_ITEMS]) for i in range(0, len(items), PAGE_ITEMS)
            ]
            node[last] = {MARK: [_store(c, pages) for c in chunks], KIND: "object"}
            paged.append(path)
        elif isinstance(member, list) and len(member) > 1:
            encoded = [orjson.dumps(m) for m in member]
            if _pages_list(len(encoded), map(len, encoded)):
                node[last] = {MARK: _array_pages(encoded, pages), KIND: "array"}
                paged.append(path)
    if not pages:
        return doc, {}
    tree[PAGED] = paged
    return orjson.dumps(tree), pages


def pages_member(member: Mapping[Any, Any] | Sequence[Any]) -> bool:
    """Whether :func:`split` pages this member of a state (a map, or a list of JSON values)
    at a paged path: its rule, on the values before they are JSON."""
    if isinstance(member, Mapping):
        return len(member) > PAGE_ITEMS
    return _pages_list(len(member), (len(orjson.dumps(m)) for m in member))


def _pages_list(members: int, json_sizes: Iterable[int]) -> bool:
    """The rule for a list at a paged path: more than one member, and more than PAGE_ITEMS of
    them or more than PAGED_ARRAY_BYTES of JSON (the members' sizes, summed only when that
    decides)."""
    return members > 1 and (members > PAGE_ITEMS or sum(json_sizes) > PAGED_ARRAY_BYTES)


def splice(bare: bytes, lists: Sequence[tuple[tuple[bytes, bytes], Sequence[bytes]]]) -> bytes:
    """``bare`` (JSON with an empty list at each mark: ``(opening, closing)``, the text just
    before its ``]`` and from it, in the order the marks come) with each list's JSON pieces
    as its members."""
    return _replaced(bare, [(mark, (b"[", b",".join(pieces), b"]")) for mark, pieces in lists])


def split_lists(
    bare: bytes,
    lists: Sequence[tuple[str, tuple[bytes, bytes], Sequence[bytes]]],
    paths: Sequence[str],
) -> tuple[bytes, tuple[bytes, dict[str, bytes]]]:
    """A checkpoint made of pieces, whole and as :func:`split` leaves it, without parsing it:
    ``bare`` with each list ``(path, mark, pieces)`` spliced in at its mark (see
    :func:`splice`), and the same with the lists :func:`split` would page (its rule, on the
    pieces' bytes) as references to their pages. For a projection whose other paged paths
    hold nothing large enough to page: a large checkpoint was otherwise parsed again only to
    be split (issue 25). ``paths`` are the projection's paged paths (split's order of them)."""
    members = [(b"[", b",".join(pieces), b"]") for _path, _mark, pieces in lists]
    whole = _replaced(
        bare, [(mark, m) for (_path, mark, _pieces), m in zip(lists, members, strict=True)]
    )
    if len(whole) < PAGED_FROM_BYTES:
        return whole, (whole, {})
    pages: dict[str, bytes] = {}
    paged: list[str] = []
    values: list[tuple[tuple[bytes, bytes], tuple[bytes, ...]]] = []
    for (path, mark, pieces), listed in zip(lists, members, strict=True):
        if _pages_list(len(pieces), map(len, pieces)):
            ref = {MARK: _array_pages(list(pieces), pages), KIND: "array"}
            values.append((mark, (orjson.dumps(ref),)))
            paged.append(path)
        else:
            values.append((mark, listed))  # (joined once, for both documents)
    if not pages:
        return whole, (whole, {})
    left = _replaced(bare, values)
    paged.sort(key=paths.index)
    return whole, (b"%b,%b:%b}" % (left[:-1], orjson.dumps(PAGED), orjson.dumps(paged)), pages)


def _replaced(
    bare: bytes, values: Sequence[tuple[tuple[bytes, bytes], tuple[bytes, ...]]]
) -> bytes:
    """``bare`` with the empty list at each mark replaced by the value given as its parts."""
    out: list[bytes] = []
    start = 0
    for (opening, closing), parts in values:
        at = bare.index(opening + closing, start) + len(opening) - 1  # at the list's '['
        out.append(bare[start:at])
        out += parts
        start = at + 2  # past its '[]'
    out.append(bare[start:])
    return b"".join(out)


def join(doc: Any, pages: Mapping[str, Any]) -> Any:
    """The document :func:`split` was given, from what it left and the pages (parsed)."""
    if not isinstance(doc, dict) or PAGED not in doc:
        return doc
    whole = dict(doc)
    for path in whole.pop(PAGED):
        *parents, last = path.split(".")
        node = whole
        for name in parents:  # copied on the way down: the given document stays as it was
            node[name] = dict(node[name])
            node = node[name]
        ref = node[last]
        if ref[KIND] == "object":
            members: dict[str, Any] = {}
            for page_id in ref[MARK]:
                members.update(_page(pages, page_id))
            node[last] = members
        else:
            node[last] = [m for page_id in ref[MARK] for m in _page(pages, page_id)]
    return whole


def _page(pages: Mapping[str, Any], page_id: str) -> Any:
    try:
        return pages[page_id]
    except KeyError:
        raise LookupError(f"checkpoint page {page_id} is missing") from None


def _array_pages(encoded: list[bytes], pages: dict[str, bytes]) -> list[str]:
    """Consecutive members in pages of at most ``PAGE_ITEMS`` members and, but for a single
    member that large, ``PAGE_BYTES`` bytes."""
    ids: list[str] = []
    start = size = 0
    for n, data in enumerate(encoded):
        if n > start and (n - start == PAGE_ITEMS or size + len(data) > PAGE_BYTES):
            ids.append(_stored(b"[" + b",".join(encoded[start:n]) + b"]", pages))
            start, size = n, 0
        size += len(data) + 1
    ids.append(_stored(b"[" + b",".join(encoded[start:]) + b"]", pages))
    return ids


def _stored(data: bytes, pages: dict[str, bytes]) -> str:
    page_id = hashlib.sha256(data).hexdigest()[:32]
    pages[page_id] = data
    return page_id


def _store(chunk: dict[str, Any], pages: dict[str, bytes]) -> str:
    return _stored(orjson.dumps(chunk), pages)
