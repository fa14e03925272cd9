"""The proving projection folds a run's entries; a fold is a pure function a list can drive."""

from __future__ import annotations

import json

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


def test_a_later_versions_state_subclass_keeps_its_type_and_fields_through_the_fold() -> None:
    """A v2 projection subclasses the state (the rebuild drill's schema change): the fold must
    not rebuild it as the v1 class, dropping the new field."""
    from projectors.run_stats import RunStats, RunStatsProjection

    class RunStatsV2(RunStats):
        cost_center: str | None = None

    projection = RunStatsProjection()
    run = next(iter(simulate_runs(1, 1, seed=3)))
    state: RunStats = RunStatsV2(
        run_id=run[0].run_id, fleet_id=run[0].fleet_id, cost_center="unassigned"
    )
    for entry in run:
        state = projection.fold(state, entry)
    assert type(state) is RunStatsV2 and state.cost_center == "unassigned"
    assert state.entries == len(run)
    assert json.loads(projection.to_json(state))["cost_center"] == "unassigned"
