"""What ``timeline``, ``costs`` and ``failures`` read: the analytics projections of the live builds.

Roll-ups are SQL over the views of ``infra/migrations/005_analytics_views.sql`` (documented in
``docs/ANALYTICS.md``); a run's timeline joins three projections' documents in
:func:`assemble_timeline`, a pure function. ``--since`` filters on the entries' own times (a call's
``occurred_at``, a run's last entry), never on when a worker wrote a row; *stalled* is the one
wall-clock notion: an unfinished run no worker has written for ``stalled_after`` minutes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

import psycopg

from consumers.views import live_states
from infra.settings import Settings
from projectors.cost_metrics import (
    CALL_COUNTS,
    FIGURE_FIELDS,
    CostMetrics,
    calls_unknown,
    counts_unknown,
    known_figures,
    known_sum,
    partly_unknown,
)
from projectors.diff_timelines import (
    TIME_KEY,
    DiffTimeline,
    TimelineRow,
    untimed,
    with_all_rows,
)
from projectors.failure_classifications import RunDiagnosis
from projectors.pricing import usd_text
from projectors.registry import projection
from projectors.stores import postgres_ops as ops
from schemas.errors import AgentLedgerError, NotFoundError
from schemas.times import parse_moment

Dimension = Literal["run", "fleet", "model", "purpose", "day", "day-model"]
DIMENSIONS: tuple[Dimension, ...] = ("run", "fleet", "model", "purpose", "day", "day-model")
ANALYTICS = ("diff-timelines", "cost-metrics", "failure-classifications")


class AnalyticsViewsMissingError(AgentLedgerError):
    """The analytics views are not in this database: ``agentledger infra up`` (or any worker
    start) applies the migrations that create them."""


# -- shared --------------------------------------------------------------------------------


def parse_since(text: str) -> datetime:
    """An ISO date (midnight UTC) or date-time (UTC when no offset is given)."""
    return parse_moment(text)


def usd(value: Decimal | None) -> str | None:
    """An exact amount as decimal text for JSON (None stays None)."""
    return None if value is None else usd_text(value)


@contextmanager
def _connect(settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    try:
        with ops.connect(settings.pg_address) as conn:
            yield conn
    except psycopg.errors.UndefinedTable as exc:
        raise AnalyticsViewsMissingError(
            f"{exc.diag.message_primary}: run `agentledger infra up` to apply the migrations"
        ) from None


def money(value: Decimal | str | None, places: int = 4) -> str:
    """An amount to ``places`` decimals; a known amount above 0 too small for them shows its
    first two significant digits ($0.000014), never $0.0000."""
    if value is None:
        return "-"
    amount = Decimal(value)
    if 0 < abs(amount) < Decimal(1).scaleb(-places):
        return f"${amount:.{max(places, 1 - amount.adjusted())}f}"
    return f"${amount:,.{places}f}"


# -- costs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostRow:
    """The calls sharing one value of the dimension (or all of them, in the total row)."""

    key: str
    calls: int
    failed_calls: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    avg_latency_ms: int | None
    cost_usd: Decimal
    unpriced_calls: int
    reported_calls: int
    provider_reported_cost_usd: Decimal
    cost_disagreements: int
    cache_write_input_tokens: int = 0  # part of input_tokens
    usage_unknown_calls: int = 0  # calls whose tokens the source did not report (not summed)
    latency_calls: int = 0  # calls with a known latency (avg_latency_ms is over these)
    # calls that leave one count unknown (see projectors.cost_metrics.CostTotals)
    cached_unknown_calls: int = 0
    output_unknown_calls: int = 0
    reasoning_unknown_calls: int = 0
    cache_write_unknown_calls: int = 0
    usage_partial_calls: int = 0  # of usage_unknown_calls, those whose input is known
    calls_unknown: bool = False  # --by run only: the run's log keeps no usage at all
    # runs whose log keeps no usage among the row's (a fleet's, the total's): their calls,
    # tokens and cost are unknown, so the row's counts and sums are lower bounds
    runs_left_out: int = 0
    fleet_id: str | None = None  # --by run only
    task_budget_usd: Decimal | None = None  # --by run only
    over_budget: bool | None = None  # --by run only
    # --by run only: the totals the agent reported for the whole run, beside the call sums
    reported_cost_usd: Decimal | None = None
    reported_input_tokens: int | None = None
    reported_output_tokens: int | None = None
    reported_disagrees: bool | None = None

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for name in ("cost_usd", "provider_reported_cost_usd", "task_budget_usd"):
            doc[name] = usd(doc[name])
        doc["reported_cost_usd"] = usd(self.reported_cost_usd)
        shown = doc | known_figures(self, doc)
        if self.calls_unknown:
            return counts_unknown(shown)
        if self.runs_left_out:  # their calls, tokens and cost are not in the sums
            bounded = {*CALL_COUNTS, *(n for names in FIGURE_FIELDS.values() for n in names)}
            shown["partly_unknown"] = sorted({*shown["partly_unknown"], *bounded})
            if not self.calls:  # no call known at all: how many is unknown
                return counts_unknown(shown)
        return shown


@dataclass(frozen=True)
class CostReport:
    by: Dimension
    rows: list[CostRow]
    total: CostRow

    @property
    def runs_calls_unknown(self) -> int:
        """Runs whose log keeps no usage: the total leaves them out (a lower bound)."""
        return self.total.runs_left_out

    def as_json(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "rows": [r.as_json() for r in self.rows],
            "total": self.total.as_json(),
        }


def cost_report(
    settings: Settings,
    by: Dimension = "model",
    fleet: str | None = None,
    since: datetime | None = None,
    run_ids: Sequence[str] | None = None,
) -> CostReport:
    """Counted model calls of the live cost-metrics build rolled up by ``by``, with a total."""
    with _connect(settings) as conn:
        found = ops.cost_rollup(conn, by, fleet, since, run_ids)
        # runs whose agent reported only run totals (no call to roll up) are rows too
        only = ops.runs_reported_only(conn, fleet, run_ids) if by == "run" else []
        # and runs whose log keeps no usage: their calls unknown, never 0, and every sum that
        # would hold them a lower bound (the total's, their fleet's)
        unmetered = ops.runs_calls_unknown(conn, fleet, since, run_ids)
        left_out = {run for run, _ in unmetered}
        if by == "run":
            only += [run for run, _ in unmetered if run not in only]
        keys = [str(r[0]) for r in found if not r[-1]] + only
        budgets = _budgets(conn, keys) if by == "run" else {}
    no_calls = (0, 0, 0, 0, 0, 0, None, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)  # latency unknown
    rows = [_cost_row(r, budgets.get(str(r[0]))) for r in found if not r[-1]]
    rows += [
        replace(_cost_row((run, *no_calls), budgets.get(run)), calls_unknown=run in left_out)
        for run in only
    ]
    if by == "fleet":
        per_fleet = Counter(f for _, f in unmetered)
        rows = [replace(r, runs_left_out=per_fleet.pop(r.key, 0)) for r in rows]
        rows += [  # a fleet none of whose runs keeps usage
            replace(_cost_row((f, *no_calls), None), runs_left_out=n) for f, n in per_fleet.items()
        ]
    rows.sort(key=lambda r: r.key)
    total = next(_cost_row(r, None, key="total") for r in found if r[-1])
    return CostReport(by, rows, replace(total, runs_left_out=len(unmetered)))


def failure_days(
    settings: Settings, fleet: str | None = None, since: datetime | None = None
) -> dict[str, Any]:
    """Runs by the day of their last entry (UTC) and failure class: ``{"days": [{"day",
    "failure_class", "runs"}], "runs_left_out"}``, by day then class; a run whose times are
    unknown has no day, so it is counted apart (``runs_left_out``), never dropped unsaid."""
    with _connect(settings) as conn:
        found = ops.failure_days(conn, fleet, since)
        left_out = ops.failures_untimed(conn, fleet, None)
    days = [{"day": d, "failure_class": c, "runs": n} for d, c, n in found]
    return {"days": days, "runs_left_out": left_out}


def _budgets(conn: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, tuple[Any, ...]]:
    return {str(row[0]): tuple(row[1:]) for row in ops.run_budgets(conn, run_ids)}


def _cost_row(r: Sequence[Any], budget: tuple[Any, ...] | None, key: str | None = None) -> CostRow:
    fleet, limit, over, r_cost, r_in, r_out, r_disagrees = (
        budget if budget is not None else (None,) * 7
    )
    return CostRow(
        key=key if key is not None else str(r[0]),
        calls=r[1],
        failed_calls=r[2],
        input_tokens=int(r[3]),
        cached_input_tokens=int(r[4]),
        output_tokens=int(r[5]),
        reasoning_tokens=int(r[6]),
        avg_latency_ms=None if r[7] is None else int(r[7]),
        cost_usd=Decimal(r[8]),
        unpriced_calls=r[9],
        reported_calls=r[10],
        provider_reported_cost_usd=Decimal(r[11]),
        cost_disagreements=r[12],
        cache_write_input_tokens=int(r[13]),
        usage_unknown_calls=r[14],
        latency_calls=r[15],
        cached_unknown_calls=r[16],
        output_unknown_calls=r[17],
        reasoning_unknown_calls=r[18],
        cache_write_unknown_calls=r[19],
        usage_partial_calls=r[20],
        fleet_id=fleet,
        task_budget_usd=limit,
        over_budget=over,
        reported_cost_usd=None if r_cost is None else Decimal(r_cost),
        reported_input_tokens=r_in,
        reported_output_tokens=r_out,
        reported_disagrees=r_disagrees,
    )


# -- failures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailureCount:
    """Runs of one fleet and class: finished (final), unfinished and recently written
    (provisional), unfinished and silent for ``stalled_after`` minutes (stalled)."""

    fleet_id: str
    failure_class: str
    final: int
    provisional: int
    stalled: int
    repair_loops: int
    runs: int


@dataclass(frozen=True)
class FailureReport:
    stalled_after_minutes: float
    rows: list[FailureCount]
    total: FailureCount
    runs_left_out: int = 0  # with a window: runs whose times are unknown (they may be in it)

    @property
    def by_class(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.failure_class] = out.get(r.failure_class, 0) + r.runs
        return dict(sorted(out.items()))

    def as_json(self) -> dict[str, Any]:
        return {
            "stalled_after_minutes": self.stalled_after_minutes,
            "rows": [asdict(r) for r in self.rows],
            "by_class": self.by_class,
            "total": asdict(self.total),
            "runs_left_out": self.runs_left_out,
        }


def failure_report(
    settings: Settings,
    fleet: str | None = None,
    since: datetime | None = None,
    stalled_after_minutes: float = 30.0,
    run_ids: Sequence[str] | None = None,
) -> FailureReport:
    """Runs of the live failure-classifications build by fleet and class (``since``: runs whose
    last entry is at or after it)."""
    with _connect(settings) as conn:
        found = ops.failure_rollup(conn, fleet, since, run_ids, _minutes(stalled_after_minutes))
        left_out = 0 if since is None else ops.failures_untimed(conn, fleet, run_ids)
    rows = [FailureCount(*r[:7]) for r in found if not r[-1]]
    total = next(FailureCount("total", "total", *r[2:7]) for r in found if r[-1])
    return FailureReport(stalled_after_minutes, rows, total, left_out)


def _minutes(minutes: float) -> timedelta:
    return timedelta(minutes=minutes)


@dataclass(frozen=True)
class RunFailure:
    diagnosis: RunDiagnosis  # classified by the configured taxonomy
    updated_at: datetime
    stalled: bool

    def as_json(self) -> dict[str, Any]:
        d = self.diagnosis
        return {
            "run_id": d.run_id,
            "fleet_id": d.fleet_id,
            "finished": d.finished,
            "status": d.status,
            "stalled": self.stalled,
            "updated_at": self.updated_at.isoformat(),
            "classification": d.classification.model_dump(mode="json"),
        }


def run_failure(settings: Settings, run_id: str, stalled_after_minutes: float = 30.0) -> RunFailure:
    """One run's diagnosis; raises NotFoundError when the live build has none."""
    with _connect(settings) as conn:
        row = ops.live_run_written(
            conn, "failure-classifications", run_id, _minutes(stalled_after_minutes)
        )
    found = live_states(settings, "failure-classifications", [run_id])
    if row is None or run_id not in found:
        raise NotFoundError(f"no failure-classifications for run {run_id} in the live build")
    diagnosis = projection("failure-classifications", settings).from_doc(found[run_id]["state"])
    assert isinstance(diagnosis, RunDiagnosis)
    return RunFailure(diagnosis, row[0], row[1] and not diagnosis.finished)


# -- timeline ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallCostRef:
    """What the timeline needs of a counted call: which row it is and its cost."""

    call_key: str
    response_id: str | None
    entry_id: str
    cost_usd: Decimal | None
    unpriced: bool


def run_timeline(settings: Settings, run_id: str) -> dict[str, Any]:
    """The run's timeline document; raises NotFoundError when the live build has no timeline."""
    found = []
    for name in ANALYTICS:
        view = live_states(settings, name, [run_id]).get(run_id)
        # a projection that has taken none of the run's entries yet (a young run) holds an
        # empty document: as if it had none
        if view is not None and view["state"]:
            found.append((name, view["state"], view["applied_seq"], view["gaps"]))
    with _connect(settings) as conn:
        calls = ops.run_cost_calls(conn, run_id)
    states = {str(r[0]): r[1:] for r in found}
    if "diff-timelines" not in states:
        raise NotFoundError(f"no diff-timelines for run {run_id} in the live build")
    timeline_doc, applied_seq, gaps = states["diff-timelines"]
    cost = states.get("cost-metrics")
    diagnosis = None
    if "failure-classifications" in states:
        found_diagnosis = projection("failure-classifications", settings).from_doc(
            states["failure-classifications"][0]
        )
        assert isinstance(found_diagnosis, RunDiagnosis)
        diagnosis = found_diagnosis
    with _connect(settings) as conn:
        final = ops.live_history_rows(conn, "diff-timelines", run_id, "row")
    timeline = with_all_rows(
        DiffTimeline.model_validate(timeline_doc), [(int(k), d) for k, d in final]
    )
    doc = assemble_timeline(
        timeline,
        [CallCostRef(*c) for c in calls],
        CostMetrics.model_validate(cost[0]) if cost is not None else None,
        diagnosis,
    )
    doc.update(applied_seq=applied_seq, gaps=gaps)
    return doc


def assemble_timeline(
    timeline: DiffTimeline,
    calls: Sequence[CallCostRef],
    cost: CostMetrics | None,
    diagnosis: RunDiagnosis | None,
) -> dict[str, Any]:
    """The timeline document: header (status, cost, failure class, diff) and rows, each row
    with its time, drill-down references and the run's cost so far; pure."""
    by_response = {c.response_id: c for c in calls if c.response_id is not None}
    by_key = {c.call_key: c for c in calls}
    evidence = {r.entry_id for r in diagnosis.classification.evidence} if diagnosis else set()
    seen_in_entry: dict[str, int] = {}
    so_far = _SoFar()
    rows: list[dict[str, Any]] = []
    for row in timeline.rows:
        call = None
        if row.kind == "model-call":
            call = _call_of(row, by_response, by_key, seen_in_entry)
            so_far.add(call)
        rows.append(_row_doc(row, call, so_far, evidence))
    if diagnosis is not None and diagnosis.finished_ref is not None:
        rows.append(_failure_row(timeline, diagnosis, so_far))
    started = next((r for r in timeline.rows if r.kind == "lifecycle"), None)
    detail = started.detail if started is not None else {}
    # an imported log that keeps no times: its entries' stand-in time is no fact to show
    time_note = detail.get(TIME_KEY)
    no_times = untimed(time_note)
    times = [] if no_times else [row.occurred_at for row in timeline.rows]
    if no_times:
        for doc in rows:
            doc["occurred_at"] = None
    return {
        "run_id": timeline.run_id,
        "fleet_id": timeline.fleet_id,
        "status": timeline.status.value if timeline.status is not None else "RUNNING",
        "repository": detail.get("repository"),
        "base_sha": detail.get("base_sha"),
        "scope": list(timeline.scope),
        "started_at": min(times).isoformat() if times else None,
        "last_at": max(times).isoformat() if times else None,
        "duration_s": (max(times) - min(times)).total_seconds() if times else None,
        "time_unknown": time_note if no_times else None,
        "cost": _cost_header(cost),
        "failure": _failure_header(diagnosis),
        "diff": {
            "summary": timeline.summary.model_dump(mode="json"),
            "flags": [
                {
                    "kind": f.kind,
                    "path": f.path,
                    "reason": f.reason,
                    "raised_at_seq": f.raised_at_seq,
                    "evidence_entry_ids": [e.entry_id for e in f.evidence],
                }
                for f in timeline.flags
            ],
        },
        "rows": rows,
    }


@dataclass
class _SoFar:
    """The run's cost up to a row: the sum of the priced calls, and how many calls there were
    and how many of them have no cost of ours (unpriced, unknown usage, or not found)."""

    cost_usd: Decimal = Decimal(0)
    calls: int = 0
    unpriced_calls: int = 0  # every call without a cost of ours
    usage_unknown_calls: int = 0
    reported_calls: int = 0  # (not summed here)

    def add(self, call: CallCostRef | None) -> None:
        self.calls += 1
        if call is None or call.cost_usd is None:
            self.unpriced_calls += 1
        else:
            self.cost_usd += call.cost_usd

    def doc(self) -> dict[str, Any]:
        """``cost_so_far_usd`` (None before the first call, or while no call has a known cost:
        never $0) and whether it is a lower bound."""
        return {
            "cost_so_far_usd": usd(known_sum(self, "cost", self.cost_usd)),
            "cost_so_far_lower_bound": "cost" in partly_unknown(self),
        }


def _call_of(
    row: TimelineRow,
    by_response: Mapping[str, CallCostRef],
    by_key: Mapping[str, CallCostRef],
    seen_in_entry: dict[str, int],
) -> CallCostRef | None:
    response = row.detail.get("provider_response_id")
    if isinstance(response, str):
        return by_response.get(response)
    n = seen_in_entry.get(row.entry_id, 0)  # the cost key of the entry's n-th call without an id
    seen_in_entry[row.entry_id] = n + 1
    return by_key.get(row.entry_id if n == 0 else f"{row.entry_id}#{n}")


def _row_doc(
    row: TimelineRow, call: CallCostRef | None, so_far: _SoFar, evidence: set[str]
) -> dict[str, Any]:
    refs = {"entry": row.entry_id}
    if row.artifact_id is not None:
        refs["artifact"] = row.artifact_id
    for ref, key in (
        ("result_entry", "result_entry_id"),
        ("context_entry", "context_entry_id"),
        ("parent_entry", "parent_entry_id"),
        ("approval", "approval_id"),
    ):
        value = row.detail.get(key)
        if isinstance(value, str):
            refs[ref] = value
    doc: dict[str, Any] = {
        "seq": row.seq,
        "occurred_at": row.occurred_at.isoformat(),
        "kind": row.kind,
        "status": row.status,
        "summary": row.summary,
        "text": row.text if row.text is not None else row.summary,  # never shortened
        "refs": refs,
        "evidence": bool(evidence & {row.entry_id, row.detail.get("result_entry_id")}),
        **so_far.doc(),
        "detail": row.detail,
    }
    if row.kind == "model-call":
        doc["cost_usd"] = usd(call.cost_usd) if call is not None else None
        doc["unpriced"] = call.unpriced if call is not None else None
        doc["detail"] = {**row.detail, "cost_usd": doc["cost_usd"]}
    return doc


def _failure_row(timeline: DiffTimeline, diagnosis: RunDiagnosis, so_far: _SoFar) -> dict[str, Any]:
    c, ref = diagnosis.classification, diagnosis.finished_ref
    assert ref is not None
    finished = next((r for r in timeline.rows if r.entry_id == ref.entry_id), None)
    at = finished.occurred_at if finished is not None else max(r.occurred_at for r in timeline.rows)
    return {
        "seq": ref.seq,
        "occurred_at": at.isoformat(),
        "kind": "failure-class",
        "status": c.failure_class,
        "summary": f"class {c.failure_class}: {c.explanation}",
        "refs": {"entry": ref.entry_id},
        "evidence": True,
        **so_far.doc(),
        "detail": {"rule": c.rule, "taxonomy_version": c.taxonomy_version},
    }


def _cost_header(cost: CostMetrics | None) -> dict[str, Any] | None:
    if cost is None:
        return None
    t = cost.totals
    doc = {
        "cost_usd": usd(t.cost_usd),
        "task_budget_usd": usd(cost.task_budget_usd),
        "over_budget": cost.over_budget,
        "calls": t.calls,
        "unpriced_calls": t.unpriced_calls,
        "duplicate_reports": cost.duplicate_reports,
        "input_tokens": t.input_tokens,
        "cached_input_tokens": t.cached_input_tokens,
        "output_tokens": t.output_tokens,
        "reasoning_tokens": t.reasoning_tokens,
        "provider_reported_cost_usd": usd(t.provider_reported_cost_usd),
        "cost_disagreements": t.cost_disagreements,
        "price_version": cost.price_version,
        "cache_write_input_tokens": t.cache_write_input_tokens,
        "usage_unknown_calls": t.usage_unknown_calls,
        "latency_calls": t.latency_calls,
        # how many calls leave each count unknown (its sum covers the others)
        "usage_partial_calls": t.usage_partial_calls,
        "cached_unknown_calls": t.cached_unknown_calls,
        "output_unknown_calls": t.output_unknown_calls,
        "reasoning_unknown_calls": t.reasoning_unknown_calls,
        "cache_write_unknown_calls": t.cache_write_unknown_calls,
        # what the agent reported for the whole run (not summed from calls), and whether the
        # call sums disagree with it
        "reported_totals": (
            cost.reported_totals.model_dump(mode="json")
            if cost.reported_totals is not None
            else None
        ),
        "reported_disagrees": cost.reported_disagrees,
    }
    shown = doc | known_figures(t, doc)
    # the log keeps no usage: how many calls is unknown
    return counts_unknown(shown) if calls_unknown(cost.calls_unknown, t.calls) else shown


def _failure_header(diagnosis: RunDiagnosis | None) -> dict[str, Any] | None:
    if diagnosis is None:
        return None
    return diagnosis.classification.model_dump(mode="json")


# -- the demo's wait -----------------------------------------------------------------------


def runs_applied(
    settings: Settings, expected: Mapping[str, int], projections: Sequence[str] = ANALYTICS
) -> int:
    """How many runs every one of ``projections`` (live builds) has applied up to the
    expected sequence number."""
    with _connect(settings) as conn:
        rows = ops.live_applied(conn, projections, list(expected))
    done: dict[str, int] = {}
    for run_id, seq in rows:
        if seq >= expected[run_id]:
            done[run_id] = done.get(run_id, 0) + 1
    return sum(1 for n in done.values() if n == len(projections))
