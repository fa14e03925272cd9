"""The proving projection folds a run's entries; a fold is a pure function a list can drive."""

from __future__ import annotations

from projectors.base import fold_all
from projectors.run_stats import RunStatsProjection
from schemas.models import EntryKind
from streams.simulate import simulate_runs


def test_run_stats_counts_and_finishes() -> None:
    run = next(iter(simulate_runs(1, 1, seed=3)))
    state = fold_all(RunStatsProjection(), run)
    assert state is not None
    assert state.entries == len(run) and state.last_sequence_no == len(run)
    assert sum(state.by_kind.values()) == len(run)
    assert state.by_kind[EntryKind.RUN_STARTED.value] == 1
    assert state.status == run[-1].run_status
    assert state.first_at == run[0].occurred_at and state.last_at == run[-1].occurred_at


def test_doc_round_trip() -> None:
    projection = RunStatsProjection()
    run = next(iter(simulate_runs(1, 1, seed=4)))
    state = fold_all(projection, run)
    assert state is not None
    assert projection.from_doc(projection.to_doc(state)) == state
