"""Schema v3 beside v1 and v2: entries written by older writers read under v3 as they were (no
field unknown, no cache writes) and fold to the same results; a v3 entry's unknown fields reach
an old reader as the zeros it always saw."""

from __future__ import annotations

from typing import Any

from projectors.base import Projection, fold_all
from projectors.cost_metrics import CostMetricsProjection
from projectors.pricing import PriceTable
from projectors.run_stats import RunStatsProjection
from schemas.codec import LedgerCodec
from schemas.models import EntryKind, LedgerEntry, ModelUsagePart
from streams.simulate import simulate


def _runs() -> list[LedgerEntry]:
    return simulate(1, 4, seed=303, context_deltas=False)


def test_old_writers_entries_read_under_v3_and_fold_the_same() -> None:
    entries = _runs()
    v3 = LedgerCodec()
    assert v3.writer.version == 3
    cost = CostMetricsProjection(PriceTable.shipped())
    for version in (1, 2):
        old = LedgerCodec(writer_version=version)
        read = [v3.decode(old.encode(e)) for e in entries]
        usages = [p for e in read for p in e.parts if isinstance(p, ModelUsagePart)]
        assert usages and all(p.unknown_fields == () for p in usages)
        assert all(p.cache_write_input_tokens is None for p in usages)
        projections: tuple[Projection[Any], ...] = (cost, RunStatsProjection())
        for projection in projections:
            by_run: dict[str, list[tuple[LedgerEntry, LedgerEntry]]] = {}
            for e, r in zip(entries, read, strict=True):
                by_run.setdefault(e.run_id, []).append((e, r))
            for pairs in by_run.values():
                now = fold_all(projection, [e for e, _ in pairs])
                then = fold_all(projection, [r for _, r in pairs])
                assert now == then, (version, projection.name)


def test_a_v3_unknown_reaches_an_old_reader_as_zero() -> None:
    [entry] = [e for e in _runs() if e.kind is EntryKind.MODEL_CALL][:1]
    part = next(p for p in entry.parts if isinstance(p, ModelUsagePart))
    unknown = part.model_copy(update={"latency_ms": 0, "unknown_fields": ("latency_ms",)})
    entry = entry.model_copy(update={"parts": (unknown,)})
    data = LedgerCodec().encode(entry)
    old = LedgerCodec(reader_version=2).decode(data)
    [seen] = [p for p in old.parts if isinstance(p, ModelUsagePart)]
    assert seen.latency_ms == 0 and seen.unknown_fields == ()  # v2 has no such field
    again = LedgerCodec().decode(data)
    [known] = [p for p in again.parts if isinstance(p, ModelUsagePart)]
    assert known.unknown_fields == ("latency_ms",)
    state = fold_all(CostMetricsProjection(PriceTable.shipped()), [again])
    assert state is not None and state.totals.calls == 1 and state.totals.latency_calls == 0
