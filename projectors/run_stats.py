"""The engine's proving projection: per run, how many entries of which kind, and where it stands."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from projectors.base import ModelProjection, QuickCopy
from projectors.diff_timelines import TIME_KEY, untimed
from schemas.models import EntryKind, LedgerEntry, RunStatus


class RunStats(QuickCopy, BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    fleet_id: str
    entries: int = 0
    last_sequence_no: int = 0
    first_at: datetime | None = None
    last_at: datetime | None = None
    by_kind: dict[str, int] = {}
    status: str | None = None
    # the run's log keeps no times (its RUN_STARTED says import.time: unknown...): its entries
    # carry a stand-in time (a file's modification time), so first_at and last_at are unknown
    time_unknown: bool = False


class RunStatsProjection(ModelProjection[RunStats]):
    name = "run-stats"
    # 2: a run whose log keeps no times has no first_at and last_at (the runs list's times),
    # not its stand-in time (a file's modification time, the moment of the import)
    version = 2
    hot = True
    state_type = RunStats
    keeps_entry_ids = True  # the engine's guard against conflicting duplicates

    def accepts(self, entry: LedgerEntry) -> bool:
        return True

    def initial(self, entry: LedgerEntry) -> RunStats:
        return RunStats(run_id=entry.run_id, fleet_id=entry.fleet_id)

    def fold(self, state: RunStats, entry: LedgerEntry) -> RunStats:
        kind = entry.kind
        text = _KIND[kind]
        by_kind = dict(state.by_kind)
        by_kind[text] = by_kind.get(text, 0) + 1
        status = (
            _STATUS[entry.run_status]
            if kind is _FINISHED and entry.run_status is not None
            else state.status
        )
        no_times = state.time_unknown or (
            kind is _STARTED and untimed(entry.metadata.get(TIME_KEY))
        )
        first_at = None if no_times else state.first_at or entry.occurred_at
        last_at = None if no_times else entry.occurred_at
        if type(state) is not RunStats:  # a subclass (a later version) keeps its own fields
            return state.model_copy(
                update={
                    "entries": state.entries + 1,
                    "last_sequence_no": entry.sequence_no,
                    "first_at": first_at,
                    "last_at": last_at,
                    "by_kind": by_kind,
                    "status": status,
                    "time_unknown": no_times,
                }
            )
        return RunStats.made(
            run_id=state.run_id,
            fleet_id=state.fleet_id,
            entries=state.entries + 1,
            last_sequence_no=entry.sequence_no,
            first_at=first_at,
            last_at=last_at,
            by_kind=by_kind,
            status=status,
            time_unknown=no_times,
        )


# Each member's text (``.value`` costs ~5x a look-up).
_KIND = {k: k.value for k in EntryKind}
_FINISHED = EntryKind.RUN_FINISHED  # a global: an enum class's attribute costs ~2x
_STARTED = EntryKind.RUN_STARTED
_STATUS = {s: s.value for s in RunStatus}
