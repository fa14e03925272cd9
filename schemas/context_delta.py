"""Context manifests as deltas (schema v2): "the manifest of entry X, plus these items, minus
these". A long run's model calls each see the history since the last compaction; listing it in
full every call makes the ledger grow with the square of the run's length, a delta with it.

Pure functions, shared by the publisher SDK and the simulator (which write deltas) and the
context-manifests projection (which resolves them): a delta resolves to exactly the full
manifest it stands for, so both kinds fold to the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from schemas.models import ContextItem, ContextItemsPart

T = TypeVar("T")

# The run's previous manifest: (its CONTEXT_PROJECTED entry id, its whole item list).
Previous = tuple[str, tuple[ContextItem, ...]]


def positions_delta(base: Sequence[T], items: Sequence[T]) -> tuple[list[int], int]:
    """The positions of ``base`` that ``items`` drops, and how many of ``items`` are ``base``'s
    kept ones in order (the rest are added after them)."""
    removed: list[int] = []
    kept = 0
    for n, item in enumerate(base):
        if kept < len(items) and (items[kept] is item or items[kept] == item):
            kept += 1
        else:
            removed.append(n)
    return removed, kept


def delta_part(
    base_entry_id: str, base: Sequence[ContextItem], items: Sequence[ContextItem]
) -> ContextItemsPart:
    """``items`` (a whole manifest) as a delta of ``base`` (the manifest of ``base_entry_id``):
    the base's items it no longer has, then what it appends. Falls back to the whole list
    when that is no longer (the items were reordered, say)."""
    removed, kept = positions_delta(base, items)
    appended = tuple(items[kept:])
    if kept == 0:  # nothing shared: the whole list is no longer
        return ContextItemsPart(items=tuple(items))
    return ContextItemsPart(
        items=appended, base_entry_id=base_entry_id, removed_items=tuple(removed)
    )


def resolve(
    previous: Previous | None, parts: Sequence[ContextItemsPart]
) -> tuple[tuple[ContextItem, ...], str | None]:
    """The whole item list ``parts`` stand for, and what was wrong with a delta (None: nothing):
    a delta resolves only against the run's previous manifest (``previous``); otherwise its
    own items are all that is known."""
    out: list[ContextItem] = []
    problem = None
    for part in parts:
        if part.base_entry_id is None:
            out.extend(part.items)
            continue
        if previous is None or previous[0] != part.base_entry_id:
            problem = f"a delta of {part.base_entry_id}, which is not the run's previous context"
            out.extend(part.items)
            continue
        base = previous[1]
        drop = set(part.removed_items)
        if any(i >= len(base) for i in drop):
            problem = f"removed_items beyond the {len(base)} items of the base manifest"
        if drop:
            out.extend(item for i, item in enumerate(base) if i not in drop)
        else:  # (what a run's deltas mostly are: the base as it is, and more)
            out.extend(base)
        out.extend(part.items)
    return tuple(out), problem
