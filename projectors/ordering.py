"""Order inside a run: duplicates applied once, gaps held until they fill. Pure.

A run's cursor is the highest sequence number applied with no gap below it. An arriving entry
at or below it is a duplicate; the next one is applied, and so are held entries it unblocks; one
further ahead is held (stored durably by the engine) and the run reports its missing ranges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Plan(Generic[T]):
    """What to do with one run's arrivals, given what it had applied and held."""

    apply: list[T] = field(default_factory=list)  # in sequence order
    hold: dict[int, T] = field(default_factory=dict)  # newly held, by sequence number
    release: list[int] = field(default_factory=list)  # previously held, now applied
    duplicates: int = 0
    applied_seq: int = 0
    held: tuple[int, ...] = ()  # every sequence number still held after this plan
    # The duplicates themselves, in arrival order, and for each the one that keeps its number
    # when it is known here (held, or arrived earlier in this batch): the engine tells a
    # repeat of the same entry from a conflicting one.
    duplicate_items: list[tuple[int, T, T | None]] = field(default_factory=list)


def plan_run(applied_seq: int, held: Mapping[int, T], arriving: Iterable[tuple[int, T]]) -> Plan[T]:
    """Decide, for one run, which entries apply now, which wait and which are duplicates."""
    waiting: dict[int, T] = dict(held)
    fresh: dict[int, T] = {}
    duplicates: list[tuple[int, T, T | None]] = []
    for seq, item in arriving:
        if seq <= applied_seq or seq in waiting or seq in fresh:
            duplicates.append((seq, item, waiting.get(seq, fresh.get(seq))))
        else:
            fresh[seq] = item
    pool = {**waiting, **fresh}
    apply: list[T] = []
    release: list[int] = []
    cursor = applied_seq
    while cursor + 1 in pool:
        cursor += 1
        apply.append(pool.pop(cursor))
        if cursor in waiting:
            release.append(cursor)
    hold = {seq: item for seq, item in fresh.items() if seq in pool}
    return Plan(apply, hold, release, len(duplicates), cursor, tuple(sorted(pool)), duplicates)


def missing_ranges(applied_seq: int, held: Iterable[int]) -> list[tuple[int, int]]:
    """The gaps that keep held entries waiting, as inclusive ranges."""
    gaps: list[tuple[int, int]] = []
    expected = applied_seq + 1
    for seq in sorted(held):
        if seq > expected:
            gaps.append((expected, seq - 1))
        expected = max(expected, seq + 1)
    return gaps
