"""Reading projections as a user does: always through the live build."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.settings import Settings
from projectors import registry
from projectors.cost_metrics import (
    CostTotals,
    calls_unknown,
    counts_unknown,
    known_sum,
    partly_unknown,
)
from projectors.stores import postgres_ops as ops
from projectors.stores.postgres import current_documents
from schemas.errors import BadArgumentError, NotFoundError
from schemas.models import RunStatus


def find_runs(settings: Settings, **filters: Any) -> list[dict[str, Any]]:
    """Runs of the live builds (see :func:`projectors.stores.postgres_ops.find_runs`), each with
    its ``outcome``."""
    with ops.connect(settings.pg_address) as conn:
        found = ops.find_runs(conn, **filters)
    return [_shown(run) for run in found]


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    """A run row as shown: its cost unknown (None, never 0) when no call has a cost of ours (no
    call, or every one unpriced or of unknown usage), a lower bound when only some do."""
    priced = row.pop("priced_cost_usd")
    if row["calls"] is None:  # no cost-metrics state: no call seen
        counts = CostTotals()
    else:
        counts = CostTotals(
            calls=row["calls"],
            unpriced_calls=row["unpriced_calls"],
            usage_unknown_calls=row["usage_unknown_calls"],
            reported_calls=row["reported_calls"],
        )
    unmetered = calls_unknown(row.pop("calls_unknown"), counts.calls)
    run = {k: v for k, v in row.items() if k != "reported_calls"}
    run["cost_usd"] = known_sum(counts, "cost", priced)
    run["cost_partly_unknown"] = "cost" in partly_unknown(counts)
    run["outcome"] = run_outcome(run["status"], run["failure_class"])
    # a log that keeps no usage: how many calls the run made is unknown, never 0
    return counts_unknown(run) if unmetered else run


# A submission's outcome by what its evaluation said (failure-classifications' class).
_EVALUATED = {
    "submitted, evaluation passed": "passed",
    "submitted, not evaluated yet": "unevaluated",
    "submitted, evaluation failed": "failed",
}
OUTCOMES = (
    "running",
    *(s.value.lower().replace("_", " ") for s in RunStatus if s is not RunStatus.SUBMITTED),
    *_EVALUATED,
)


def outcome_filter(outcome: str) -> tuple[str, str | None]:
    """The ``(status, evaluation)`` filters of :func:`find_runs` that keep the runs whose
    :func:`run_outcome` is ``outcome`` (one of :data:`OUTCOMES`; "submitted, evaluation
    failed" whatever the class)."""
    if outcome not in OUTCOMES:
        raise BadArgumentError(f"outcome: one of {'; '.join(OUTCOMES)}")
    if outcome in _EVALUATED:
        return RunStatus.SUBMITTED.value, _EVALUATED[outcome]
    return outcome.upper().replace(" ", "_"), None


def run_outcome(status: str | None, failure_class: str | None) -> str:
    """How a run ended, in words: its final status, and for a submission what its evaluation
    (if any has arrived) said, as failure-classifications read it (taxonomy v2)."""
    if status is None:
        return "running"
    if status == "SUBMITTED":
        if failure_class == "none":
            return "submitted, evaluation passed"
        if failure_class in (None, "unevaluated"):
            return "submitted, not evaluated yet"
        return f"submitted, evaluation failed ({failure_class})"
    return status.lower().replace("_", " ")


def live_state(settings: Settings, projection: str, run_id: str) -> dict[str, Any]:
    """The run's whole current state document, with where it stands (``applied_seq``,
    ``gaps``): its checkpoint with the entries applied since folded on."""
    found = live_states(settings, projection, [run_id])
    if run_id not in found:
        raise NotFoundError(f"no {projection} for run {run_id} in the live build")
    return found[run_id]


def live_states(
    settings: Settings, projection: str, run_ids: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """:func:`live_state` of each of ``run_ids`` found in the live build."""
    with ops.connect(settings.pg_address) as conn:
        build = ops.live_build(conn, projection)
        if build is None:
            return {}
        folded = registry.projection(projection, settings)
        return {
            run: {"applied_seq": seq, "gaps": gaps, "state": doc}
            for run, seq, gaps, doc in current_documents(conn, folded, build, run_ids)
        }


def history_at(
    settings: Settings, projection: str, run_id: str, kind: str, seq: int
) -> dict[str, Any]:
    """The newest history row of ``kind`` at or before sequence ``seq``."""
    with ops.connect(settings.pg_address) as conn:
        row = ops.live_history_at(conn, projection, run_id, kind, seq)
    if row is None:
        raise NotFoundError(f"no {kind} of {projection} for run {run_id} at or before {seq}")
    # "asked_seq": the sequence asked for; "seq": the entry that last changed it, at or before.
    return {"seq": row[1], "asked_seq": seq, "key": row[2], "state": row[0]}


def history_row(
    settings: Settings, projection: str, run_id: str, kind: str, key: str
) -> dict[str, Any]:
    with ops.connect(settings.pg_address) as conn:
        row = ops.live_history_row(conn, projection, run_id, kind, key)
    if row is None:
        raise NotFoundError(f"no {kind} {key} of {projection} for run {run_id}")
    return {"seq": row[1], "key": key, "state": row[0]}


def resolve_run(settings: Settings, prefix: str) -> str:
    """The run id that is ``prefix`` or the only one starting with it (live builds)."""
    with ops.connect(settings.pg_address) as conn:
        return ops.resolve_run(conn, prefix)
