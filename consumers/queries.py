"""The read side's one query layer: the documents ``agentledger runs|timeline|memory|context|
failures --json`` print are the documents the HTTP API answers (``agentledger serve``), built by
the functions here, so the two cannot disagree. Each returns plain data; :func:`jsonable` is the
one way both turn it into JSON (Decimals and times as strings, as the CLI has always printed)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from consumers.analytics import (
    ANALYTICS,
    DIMENSIONS,
    cost_report,
    failure_days,
    failure_report,
    money,
    parse_since,
    run_failure,
    run_timeline,
)
from consumers.views import (
    OUTCOMES as VIEW_OUTCOMES,
)
from consumers.views import (
    find_runs,
    history_at,
    history_row,
    live_state,
    outcome_filter,
    run_outcome,
)
from infra.settings import Settings
from projectors.context_manifests import ContextManifest, resolve_manifest
from projectors.context_render import render
from projectors.stores import postgres_ops as ops
from schemas.errors import BadArgumentError, NotFoundError
from schemas.models import RunStatus
from schemas.shown import CONTROL_RE


def jsonable(doc: Any) -> Any:
    """``doc`` as the CLI prints it with ``--json``: Decimals, times and other non-JSON values
    as their ``str``."""
    return json.loads(json.dumps(doc, default=str))


@dataclass(frozen=True)
class RunFilters:
    """The filters of ``agentledger runs`` (and of ``GET /api/v1/runs`` and ``/runs``)."""

    fleet: str | None = None
    status: str | None = None  # RUNNING or a final status
    failure_class: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    cost_above: Decimal | None = None
    text: str | None = None
    sort: str = "last"
    model: str | None = None  # a run with a counted call of this model (provider/model or model)
    outcome: str | None = None  # one of consumers.views.OUTCOMES
    repository: str | None = None  # as the run's run-started entry names it


def runs(
    settings: Settings,
    filters: RunFilters,
    limit: int = 50,
    after: tuple[Any, str] | None = None,
    fleets: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Runs of the live builds, filtered and sorted, each with its outcome in words; ``status``
    RUNNING for a run not finished. ``fleets``: only the runs of these fleets; ``after``: the
    page starts right after the run of this :func:`run_key` (a keyset cursor)."""
    status, evaluation = filters.status, None
    if filters.outcome is not None:
        outcome_status, evaluation = outcome_filter(filters.outcome)
        if status is not None and status != outcome_status:
            return []  # a status and an outcome that cannot both hold
        status = outcome_status
    found = find_runs(
        settings,
        fleet=filters.fleet,
        status=status,
        evaluation=evaluation,
        failure_class=filters.failure_class,
        since=filters.since,
        until=filters.until,
        cost_above=filters.cost_above,
        text=filters.text,
        sort=filters.sort,
        limit=limit,
        after=after,
        fleets=fleets,
        model=filters.model,
        repository=filters.repository,
    )
    for run in found:
        run["status"] = run["status"] or "RUNNING"
    return found


def run_key(sort: str, run: dict[str, Any]) -> tuple[Any, str]:
    """Where a run stands in the runs list sorted by ``sort``: (its sort value, its run id);
    the next page starts right after it (``runs(..., after=)``)."""
    return ops.run_key(sort, run)


def key_from_text(sort: str, value: str | None, run_id: str) -> tuple[Any, str]:
    """:func:`run_key` back from its text (a cursor's): the sort value typed as the sort's
    column is (BadArgumentError when it is not one)."""
    if value is None or sort == "id":
        return (None if sort != "id" else run_id), run_id
    try:
        if sort in ("last", "first"):
            return datetime.fromisoformat(value), run_id
        if sort == "entries":
            return int(value), run_id
        return Decimal(value), run_id
    except (ValueError, InvalidOperation):
        raise BadArgumentError("cursor: not a cursor this server gave") from None


# the diff-timelines state without its rows (the timeline serves those)
DIFF_KEYS = (
    "run_id",
    "fleet_id",
    "status",
    "scope",
    "summary",
    "files",
    "flags",
    "snapshots",
    "failing_check",
    "last_seq",
)


def diff(settings: Settings, run_id: str) -> dict[str, Any]:
    """The run's diff: what it changed, file by file, the totals, flags, the snapshots and the
    failing check (the diff-timelines projection's state without its rows) and where it
    stands (``applied_seq``). JSON-ready."""
    view = jsonable(live_state(settings, "diff-timelines", run_id))
    state = view["state"]
    doc = {k: state.get(k) for k in DIFF_KEYS}
    doc["applied_seq"] = view["applied_seq"]
    return doc


def cost_text(run: dict[str, Any]) -> str:
    """A run's cost in words: ``unknown`` (or ``unpriced``) when no call has a cost of ours,
    never $0; ``>= $x`` when only some calls do."""
    if run["cost_usd"] is None:
        return "unpriced" if run["unpriced_calls"] else "unknown"
    bound = ">= " if run["cost_partly_unknown"] else ""
    text = f"{bound}{money(run['cost_usd'])}"
    if run["unpriced_calls"]:
        text += f" + {run['unpriced_calls']} unpriced"
    if run["usage_unknown_calls"]:
        text += f" + {run['usage_unknown_calls']} of unknown usage"
    return text


def run_fleet(settings: Settings, run_id: str) -> str | None:
    """The fleet of a run of the live builds (None: no such run)."""
    with ops.connect(settings.pg_address) as conn:
        return ops.live_fleet_of(conn, run_id)


TIMELINE_SOURCES = ("run-stats", "diff-timelines", "cost-metrics", "failure-classifications")


def applied(settings: Settings, run_id: str) -> int:
    """Where the run stands in the projections its timeline is built from (the sum of their
    applied sequence numbers): it grows when a new entry of the run lands in any of them."""
    with ops.connect(settings.pg_address) as conn:
        return sum(seq for _, seq in ops.live_applied(conn, TIMELINE_SOURCES, [run_id]))


# The timelines assembled last, by (database, run): a run's timeline is rebuilt only when a
# row it is made of has been written since (its version in each projection's live build), so
# a page of a 10,000-entry run, its next page, its header and its costs share one assembly.
# Bounded by rows: the runs assembled last, up to TIMELINE_CACHE_ROWS rows in all.
TIMELINE_CACHE_ROWS = 60_000
_timelines: OrderedDict[tuple[str, str], tuple[object, dict[str, Any]]] = OrderedDict()
_timelines_lock = threading.Lock()


def timeline(settings: Settings, run_id: str) -> dict[str, Any]:
    """The run's header and timeline rows (``agentledger timeline --json``). One connection
    for the whole read (the row versions, each projection's document, the call costs and the
    re-check): on the CLI's path each statement opened its own."""
    with ops.one_connection(settings.pg_address):
        return _timeline(settings, run_id)


def _timeline(settings: Settings, run_id: str) -> dict[str, Any]:
    with ops.connect(settings.pg_address) as conn:
        version = ops.live_versions(conn, ANALYTICS, run_id)
    key = (settings.pg_address, run_id)
    with _timelines_lock:
        kept = _timelines.get(key)
        if kept is not None and kept[0] == version:
            _timelines.move_to_end(key)
            return _copy(kept[1])
    doc = run_timeline(settings, run_id)
    # kept only when no write landed while it was assembled (else the next read assembles it)
    with ops.connect(settings.pg_address) as conn:
        if ops.live_versions(conn, ANALYTICS, run_id) != version:
            return doc
    with _timelines_lock:
        _timelines[key] = (version, doc)
        _timelines.move_to_end(key)
        rows = sum(len(d["rows"]) for _, d in _timelines.values())
        while rows > TIMELINE_CACHE_ROWS and len(_timelines) > 1:
            _, (_, dropped) = _timelines.popitem(last=False)
            rows -= len(dropped["rows"])
    return _copy(doc)


def _copy(doc: dict[str, Any]) -> dict[str, Any]:
    """A kept timeline for a caller that may change its header or its list of rows (the rows
    themselves are not changed by any caller)."""
    return {**doc, "rows": list(doc["rows"])}


def run_for(settings: Settings, run_id: str, fleets: Sequence[str]) -> str:
    """The run a reader of ``fleets`` means by ``run_id``: its own run of that id, or the only
    one of its runs that id is the start of (``ops.run_of_fleets``, the MCP server's rule too):
    NotFoundError for none of its runs, AmbiguousRunError (a BadArgumentError) for several."""
    with ops.connect(settings.pg_address) as conn:
        return ops.run_of_fleets(conn, run_id, fleets)


def memory(settings: Settings, run_id: str, at: int | None = None) -> dict[str, Any]:
    """The run's working memory now (its whole state, the evidence index included: the MCP
    server reads which entries are hidden from it), or as it stood after sequence number
    ``at``: BadArgumentError when ``at`` is past the run's last applied sequence number (the
    one rule of ``memory --at``, ``/memory?at=`` and the memory page: refused, never
    clamped, so nobody reads "as it stood after seq 999999" of a run that ends at 10006)."""
    if at is None:
        return live_state(settings, "working-memory", run_id)
    with ops.connect(settings.pg_address) as conn:
        applied = [seq for _, seq in ops.live_applied(conn, ["working-memory"], [run_id])]
    if applied and at > applied[0]:
        raise BadArgumentError(
            f"at: run {run_id}'s working memory is applied through seq {applied[0]} (its last "
            f"entry so far); there is no seq {at} to read it after"
        )
    return history_at(settings, "working-memory", run_id, "snapshot", at)


INDEX_PARTS = (
    "entries",
    "tool_calls",
    "artifacts",
    "created_files",
    "changed_files",
    "recent_files",
    "file_changes",
)
# lists of paths (the others are maps): sorted, but recent_files (by last change, newest last)
_LIST_PARTS = ("created_files", "changed_files", "recent_files")
INDEX_PAGE = 1000  # index members a page of memory_index answers by default (and at most 10x)


def memory_doc(settings: Settings, run_id: str, at: int | None = None) -> dict[str, Any]:
    """``agentledger memory --json`` and ``GET /api/v1/runs/R/memory``: :func:`memory` with
    its size bounded. The current memory's evidence index (every entry id of the run, ~88 B
    an entry: most of a 10,000-entry run's 1 MB) leaves ``state``; ``index`` says how many
    members each of its parts has, and :func:`memory_index` pages through them. A memory
    ``at`` a sequence number never carries the index (its snapshots keep none)."""
    view = memory(settings, run_id, at)
    index = view["state"].pop("index", None) if at is None else None
    if isinstance(index, dict):
        view["index"] = {part: len(index.get(part) or ()) for part in INDEX_PARTS}
    return view


def memory_index(
    settings: Settings, run_id: str, part: str, offset: int = 0, limit: int = INDEX_PAGE
) -> dict[str, Any]:
    """A page of the current working memory's evidence index (``memory --index PART``, ``GET
    /api/v1/runs/R/memory/index?part=``): ``part``'s members in key order from ``offset``
    (``members``: a map, or a list of paths for ``created_files``, ``changed_files`` and
    ``recent_files``),
    ``total`` and ``next_offset`` (None: the last page), with the ``applied_seq`` it was read
    at (a running run's index grows between pages)."""
    if part not in INDEX_PARTS:
        raise BadArgumentError(f"part: one of {', '.join(INDEX_PARTS)}")
    if offset < 0 or not 1 <= limit <= 10 * INDEX_PAGE:
        raise BadArgumentError(f"offset: 0 or more; limit: 1 to {10 * INDEX_PAGE}")
    view = live_state(settings, "working-memory", run_id)
    found = (view["state"].get("index") or {}).get(part) or ([] if part in _LIST_PARTS else {})
    members: Any
    if isinstance(found, dict):
        keys = sorted(found)[offset : offset + limit]
        members = {k: found[k] for k in keys}
    else:
        members = list(found)[offset : offset + limit]
    more = len(found) > offset + limit
    return {
        "run_id": run_id,
        "applied_seq": view["applied_seq"],
        "part": part,
        "total": len(found),
        "offset": offset,
        "members": members,
        "next_offset": offset + limit if more else None,
    }


def manifest(settings: Settings, run_id: str, call: str | None = None) -> dict[str, Any] | None:
    """The run's next-turn context manifest (None: none yet), or what the model call whose
    entry id is ``call`` saw (NotFoundError: no manifest recorded for it)."""
    if call is None:
        doc: dict[str, Any] | None = live_state(settings, "context-manifests", run_id)["state"][
            "next_turn"
        ]
        return doc
    row = history_row(settings, "context-manifests", run_id, "manifest", call)["state"]

    def fetch(key: str) -> dict[str, Any] | None:
        try:
            found = history_row(settings, "context-manifests", run_id, "manifest", key)
        except NotFoundError:
            return None
        state: dict[str, Any] = found["state"]
        return state

    return resolve_manifest(row, fetch)


def render_manifest(doc: dict[str, Any]) -> str:
    """A manifest as the model gets it: sectioned, with the trust wrappers (``agentledger
    context --render``)."""
    return render(ContextManifest.model_validate(doc))


def compare(settings: Settings, run_ids: Sequence[str]) -> dict[str, Any]:
    """Runs side by side: each one's header (as ``timeline --json`` has it, with its outcome
    in words and ``row_count``), the files its working memory says it changed, and its
    timeline rows."""
    runs = []
    for run_id in run_ids:
        doc = timeline(settings, run_id)
        status = None if doc["status"] == "RUNNING" else doc["status"]
        failure_class = (doc["failure"] or {}).get("failure_class")
        try:
            state = memory(settings, run_id)["state"]
        except NotFoundError:
            state = {}
        files = state.get("changed_files") or []
        runs.append(
            {
                **doc,
                "outcome": run_outcome(status, failure_class),
                "changed_files": list(files),
                "changed_files_total": state.get("changed_files_total", len(files)),
                "row_count": len(doc["rows"]),
            }
        )
    return {"runs": runs}


def costs(
    settings: Settings, by: str = "model", fleet: str | None = None, since: datetime | None = None
) -> dict[str, Any]:
    """Model-call roll-ups by ``by`` with a total row (``agentledger costs --json``)."""
    dimension = next((d for d in DIMENSIONS if d == by), None)
    if dimension is None:
        raise BadArgumentError(f"by: one of {', '.join(DIMENSIONS)}")
    return cost_report(settings, dimension, fleet, since).as_json()


def failures(
    settings: Settings,
    fleet: str | None = None,
    since: datetime | None = None,
    stalled_after_minutes: float = 30.0,
) -> dict[str, Any]:
    """Runs by failure class and fleet: final, provisional, stalled (``agentledger failures
    --json``)."""
    return failure_report(settings, fleet, since, stalled_after_minutes).as_json()


def failures_by_day(
    settings: Settings, fleet: str | None = None, since: datetime | None = None
) -> dict[str, Any]:
    """Failure classes over time: runs by the day of their last entry and class (``days``),
    and how many runs have no entry time (``runs_left_out``)."""
    return failure_days(settings, fleet, since)


def failure(settings: Settings, run_id: str, stalled_after_minutes: float = 30.0) -> dict[str, Any]:
    """Why the run failed: class, rule, explanation, evidence (``agentledger failures RUN``)."""
    return run_failure(settings, run_id, stalled_after_minutes).as_json()


def entry(settings: Settings, run_id: str, seq: int) -> dict[str, Any]:
    """One timeline row's drill-down: the rows of sequence number ``seq`` (the entry with its
    detail, references and cost so far) and, for a model call, the manifest of what it saw."""
    every = timeline(settings, run_id)["rows"]
    rows = [row for row in every if row["seq"] == seq]
    shown = "row"
    if not rows:  # a tool result's own entry: the row of the call it answers
        rows = [row for row in every if (row.get("detail") or {}).get("result_seq") == seq]
        shown = "result"
    earlier = [row["seq"] for row in every if row["seq"] < seq]
    if not rows and earlier and seq <= max(row["seq"] for row in every):
        # an entry with no row of its own (folded into no row): the last row before it
        rows = [row for row in every if row["seq"] == max(earlier)]
        shown = "before"
    if not rows:
        last = max((row["seq"] for row in every), default=0)
        raise NotFoundError(f"run {run_id} has no seq {seq} (its timeline ends at seq {last})")
    manifests: dict[str, Any] = {}
    for row in rows:
        if row["kind"] != "model-call":
            continue
        for ref in ("entry", "context_entry"):
            key = row["refs"].get(ref)
            if key is None or key in manifests:
                continue
            try:
                manifests[key] = manifest(settings, run_id, key)
            except (NotFoundError, LookupError):
                continue
    # shown: "row" (the rows of seq), "result" (seq is the result of the call of these rows)
    # or "before" (seq has no row: the rows of the last sequence number before it)
    return {"run_id": run_id, "seq": seq, "shown": shown, "rows": rows, "manifests": manifests}


RUN_STATUSES = ("RUNNING", *(status.value for status in RunStatus))
OUTCOMES = VIEW_OUTCOMES  # the outcome filter's words (the runs' outcome column)
MAX_SEARCH = 1_000  # a text search's longest (a megabyte's ILIKE over every run took ~10 s)


def parse_run_filters(
    *,
    fleet: str | None = None,
    status: str | None = None,
    failure_class: str | None = None,
    since: str | None = None,
    until: str | None = None,
    cost_above: str | None = None,
    search: str | None = None,
    sort: str | None = None,
    model: str | None = None,
    outcome: str | None = None,
    repository: str | None = None,
) -> RunFilters:
    """:class:`RunFilters` from text (a query string's values; empty means not given), checked
    as ``agentledger runs`` checks its options (BadArgumentError names the bad one)."""
    texts = {"fleet": fleet, "failure_class": failure_class, "search": search, "model": model}
    for name, text in {**texts, "repository": repository}.items():
        if text and CONTROL_RE.search(text):
            raise BadArgumentError(f"{name}: text without control characters")
    if search and len(search) > MAX_SEARCH:
        raise BadArgumentError(f"search: at most {MAX_SEARCH:,} characters")
    if status and status.upper() not in RUN_STATUSES:
        raise BadArgumentError(f"status: one of {', '.join(RUN_STATUSES)}")
    if sort and sort not in ops.RUN_SORTS:
        raise BadArgumentError(f"sort: one of {', '.join(ops.RUN_SORTS)}")
    if outcome and outcome not in OUTCOMES:
        raise BadArgumentError(f"outcome: one of {'; '.join(OUTCOMES)}")
    cost = None
    if cost_above:
        try:
            cost = Decimal(cost_above)
        except InvalidOperation:
            raise BadArgumentError("cost_above: a number of USD") from None
    return RunFilters(
        fleet=fleet or None,
        status=status.upper() if status else None,
        failure_class=failure_class or None,
        since=moment("since", since),
        until=moment("until", until),
        cost_above=cost,
        text=search or None,
        sort=sort or "last",
        model=model or None,
        outcome=outcome or None,
        repository=repository or None,
    )


def moment(name: str, text: str | None) -> datetime | None:
    """An ISO date or date-time given as ``name`` (None: not given); BadArgumentError names
    it when it is not one."""
    if not text:
        return None
    try:
        return parse_since(text)
    except ValueError as exc:
        raise BadArgumentError(f"{name}: {exc}") from None
