"""Cost metrics: the tokens, latency and cost of each run's model calls, a pure fold.

One state per run. Each ``ModelUsagePart`` of a ``MODEL_CALL`` entry is one call, counted once per
run under its provider response id (its entry id when it has none): runtimes that report one
response twice add nothing the second time. A counted call's tokens are normalized from the
provider's raw usage and priced at the price in effect at the entry's ``occurred_at``, both
versioned (see :mod:`projectors.pricing`). A model the table does not price is ``unpriced``: its
cost is None and the run's cost counts priced calls only.

When the provider reports its own cost it is kept beside ours; the two disagree when they differ
by more than both ``rel_tolerance`` of the reported cost and ``abs_tolerance_usd``.

**Unknown is not zero** (schema v3 ``unknown_fields``): a call whose latency is unknown adds
nothing to ``latency_ms_sum`` and is not in ``latency_calls`` (the average is over the calls that
report one); a call whose token counts are unknown is counted in ``usage_unknown_calls``, adds no
tokens and has no cost (``cost_usd`` None, not $0), so the run's cost is then a lower bound. A
call whose log kept some counts but not enough to price it (the input, not the output) is of
unknown usage too (no cost), and adds the counts it has (``usage_partial_calls``: its input is
known).

**Reported run totals**: an agent that accounts only per run (SWE-agent's ``model_stats``) sends a
``JsonPart`` with ``schema_ref`` :data:`RUN_TOTALS_REF` (``{"cost_usd": "1.26719",
"input_tokens": 122612, "output_tokens": 1369, "calls": 2}``, each key optional). They are kept
beside the per-call sums (``reported_totals``), never added to them, and ``reported_disagrees``
flags a difference (cost beyond the tolerances, or any token or call count that differs) when
the run has per-call figures to compare.

The task budget comes from the ``task_budget_usd`` metadata of ``RUN_STARTED``; the run is
``over_budget`` once its cost exceeds it, or, when its calls are unpriced, once the provider's
reported cost does (the budget check never treats an unpriced call as free).

Every counted call leaves one flat history row (kind ``model_call``), the rows SQL roll-ups by
fleet, model, purpose and day read; :func:`rollup` is the same roll-up in Python. USD amounts are
exact decimals, written as decimal text (``"0.0123"``) in documents.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, PlainSerializer

from projectors.base import BIGINT_MAX, HistoryRow, ModelProjection, QuickCopy, new_calls
from projectors.pricing import (
    ENTRY_FIELDS,
    NORMALIZER_VERSION,
    LayeredPrices,
    PriceSource,
    normalize_usage,
    usd_text,
)
from schemas.models import (
    EntryKind,
    JsonPart,
    LedgerEntry,
    ModelCallStatus,
    ModelUsagePart,
    UsageField,
    UtcDatetime,
)

HISTORY_KIND = "model_call"
BUDGET_KEY = "task_budget_usd"
# RUN_STARTED metadata of a run whose log keeps no usage at all (a Codex rollout without
# token counts): how many model calls it made is unknown, never 0
CALLS_KEY, CALLS_UNKNOWN = "model_calls", "unknown"
# the counts of calls (of CostTotals, a cost row, a run's header): all unknown (None, never 0)
# for a run whose calls are unknown; its sums are unknown by known_sum already (no call)
CALL_COUNTS = (
    "calls",
    "failed_calls",
    "latency_calls",
    "usage_unknown_calls",
    "usage_partial_calls",
    "unpriced_calls",
    "reported_calls",
    "cost_disagreements",
    "cached_unknown_calls",
    "output_unknown_calls",
    "reasoning_unknown_calls",
    "cache_write_unknown_calls",
)
_ZERO = Decimal(0)
_BUDGET_DIGITS = 28  # the decimal context's precision: a budget's magnitude stays within it
_ACCEPTED = frozenset({EntryKind.MODEL_CALL, EntryKind.RUN_STARTED})


def _sorted_ids(ids: frozenset[str]) -> list[str]:
    return sorted(ids)  # a stable document whatever the process's hash seed


UsdAmount = Annotated[Decimal, PlainSerializer(usd_text, return_type=str, when_used="json")]
IdSet = Annotated[frozenset[str], PlainSerializer(_sorted_ids, return_type=list, when_used="json")]
Dimension = Literal["run", "fleet", "model", "purpose", "day"]


class _Frozen(QuickCopy, BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CallCost(_Frozen):
    """One counted model call: normalized usage, latency and cost."""

    key: str  # the provider response id, else the entry id
    response_id: str | None
    entry_id: str
    seq: int
    occurred_at: UtcDatetime
    provider: str
    model: str
    purpose: str
    status: str
    input_tokens: int | None  # None: the source did not report the call's usage (then all four)
    cached_input_tokens: int | None
    output_tokens: int | None
    reasoning_tokens: int | None
    cache_write_input_tokens: int | None = None  # None: not reported
    latency_ms: int | None  # None: unknown
    cost_usd: UsdAmount | None  # None: unpriced, or usage unknown
    provider_reported_cost_usd: UsdAmount | None
    cost_disagreement: bool
    unpriced: bool
    price_effective_from: date | None
    normalizer: str  # which provider's raw shape was read, or "entry-fields"
    usage_mismatch: bool  # the raw usage says other than the entry's own normalized fields


class CostTotals(_Frozen):
    """Sums over counted calls (``cost_usd`` over priced calls only)."""

    calls: int = 0
    failed_calls: int = 0  # status other than OK
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_input_tokens: int = 0  # over the calls that report cache writes
    latency_ms_sum: int = 0  # over the calls with a known latency
    latency_calls: int = 0
    usage_unknown_calls: int = 0  # calls whose token counts the source did not report (no cost)
    cost_usd: UsdAmount = _ZERO
    unpriced_calls: int = 0
    reported_calls: int = 0
    provider_reported_cost_usd: UsdAmount = _ZERO  # over the calls that report one
    unpriced_reported_cost_usd: UsdAmount = _ZERO  # the reported cost of unpriced calls
    cost_disagreements: int = 0
    # calls that leave one count unknown (the source did not report it: Claude Code's reasoning,
    # an output a log lost), usage_unknown_calls among them: its sum covers the others only
    cached_unknown_calls: int = 0
    output_unknown_calls: int = 0
    reasoning_unknown_calls: int = 0
    cache_write_unknown_calls: int = 0
    # of the usage_unknown_calls, those whose input count is known (the log lost another count,
    # e.g. the output): their input is in its sum (0 in a build before this count existed)
    usage_partial_calls: int = 0

    @property
    def avg_latency_ms(self) -> float | None:
        return self.latency_ms_sum / self.latency_calls if self.latency_calls else None

    def plus(self, call: CallCost) -> CostTotals:
        return self.added(_added_by(call))

    def added(self, more: dict[str, Any]) -> CostTotals:
        """These totals (of a CostTotals, not a subclass) with one more call, which adds
        ``more`` (:func:`_added_by`, every field in order) to each sum; token sums stop at a
        bigint."""
        old = self.__dict__
        new = {name: old[name] + value for name, value in more.items()}
        for name in _TOKEN_SUMS:
            if new[name] > BIGINT_MAX:
                new[name] = BIGINT_MAX
        return CostTotals.made(**new)


def _added_by(call: CallCost) -> dict[str, Any]:
    """What one counted call adds to each sum of :class:`CostTotals`, in its field order (an
    unknown adds nothing)."""
    reported = call.provider_reported_cost_usd
    return {
        "calls": 1,
        "failed_calls": call.status != ModelCallStatus.OK,
        "input_tokens": call.input_tokens or 0,
        "cached_input_tokens": call.cached_input_tokens or 0,
        "output_tokens": call.output_tokens or 0,
        "reasoning_tokens": call.reasoning_tokens or 0,
        "cache_write_input_tokens": call.cache_write_input_tokens or 0,
        "latency_ms_sum": call.latency_ms or 0,
        "latency_calls": call.latency_ms is not None,
        "usage_unknown_calls": call.cost_usd is None and not call.unpriced,
        "cost_usd": call.cost_usd or _ZERO,
        "unpriced_calls": call.unpriced,
        "reported_calls": reported is not None,
        "provider_reported_cost_usd": reported or _ZERO,
        "unpriced_reported_cost_usd": (reported or _ZERO) if call.cost_usd is None else _ZERO,
        "cost_disagreements": call.cost_disagreement,
        "cached_unknown_calls": call.cached_input_tokens is None,
        "output_unknown_calls": call.output_tokens is None,
        "reasoning_unknown_calls": call.reasoning_tokens is None,
        "cache_write_unknown_calls": call.cache_write_input_tokens is None,
        "usage_partial_calls": (
            call.cost_usd is None and not call.unpriced and call.input_tokens is not None
        ),
    }


_TOKEN_SUMS = (
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cache_write_input_tokens",
    "latency_ms_sum",
)


class ReportedTotals(_Frozen):
    """A run's totals as its agent reported them (not summed from calls); None: not reported."""

    cost_usd: UsdAmount | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    calls: int | None = None


class CostMetrics(_Frozen):
    """A run's model-call usage and cost, with the price table and normalizer versions used."""

    run_id: str
    fleet_id: str
    price_version: str
    normalizer_version: int
    totals: CostTotals = CostTotals()
    by_model: dict[str, CostTotals] = {}  # "provider/model"
    by_purpose: dict[str, CostTotals] = {}
    task_budget_usd: UsdAmount | None = None
    over_budget: bool = False
    reported_totals: ReportedTotals | None = None
    reported_disagrees: bool = False
    duplicate_reports: int = 0
    seen_keys: IdSet = frozenset()  # response ids, or entry ids of calls without one
    first_at: UtcDatetime | None = None  # the run's start (or first counted call)
    last_at: UtcDatetime | None = None  # the last counted call
    latest: tuple[CallCost, ...] = ()  # the calls the last counting entry added
    calls_unknown: bool = False  # the run's log keeps no usage: its calls are not counted


class CostMetricsProjection(ModelProjection[CostMetrics]):
    name = "cost-metrics"
    # 3: a token count a call leaves unknown is counted apart (output, reasoning...); a run
    # whose log keeps no usage (RUN_STARTED metadata) has its calls unknown, not 0
    # 4: a call whose log lost a count it needs to be priced (the output) keeps the counts it
    # has (its input), not all unknown (usage_partial_calls)
    version = 4
    hot = False
    state_type = CostMetrics
    unbounded = ("seen_keys",)  # one per counted call; the calls themselves are history rows

    def __init__(
        self,
        prices: PriceSource | None = None,
        *,
        rel_tolerance: Decimal = Decimal("0.01"),
        abs_tolerance_usd: Decimal = Decimal("0.000001"),
    ) -> None:
        # default: the maintained price database (genai-prices); a table given over it
        self.prices: PriceSource = prices if prices is not None else LayeredPrices()
        self.rel_tolerance = rel_tolerance
        self.abs_tolerance_usd = abs_tolerance_usd

    def accepts(self, entry: LedgerEntry) -> bool:
        return entry.kind in _ACCEPTED or (
            entry.kind in _TOTALS_KINDS and _reported_totals(entry) is not None
        )

    def initial(self, entry: LedgerEntry) -> CostMetrics:
        return CostMetrics(
            run_id=entry.run_id,
            fleet_id=entry.fleet_id,
            price_version=self.prices.version,
            normalizer_version=NORMALIZER_VERSION,
        )

    def fold(self, state: CostMetrics, entry: LedgerEntry) -> CostMetrics:
        if entry.kind is EntryKind.MODEL_CALL:
            return self._model_call(state, entry)
        if entry.kind is EntryKind.RUN_STARTED:
            return _started(state, entry)
        totals = _reported_totals(entry)
        if totals is not None:
            return self._judged(state, {"reported_totals": totals})
        return state

    def _judged(self, state: CostMetrics, update: dict[str, Any]) -> CostMetrics:
        """``state`` updated, with the budget and reported-totals flags of its new sums."""
        t = update.get("totals", state.totals)
        r = update.get("reported_totals", state.reported_totals)
        disagrees = False
        if r is not None and t.calls:
            disagrees = (
                (r.calls is not None and r.calls != t.calls)
                or (r.input_tokens is not None and r.input_tokens != t.input_tokens)
                or (r.output_tokens is not None and r.output_tokens != t.output_tokens)
                or (
                    r.cost_usd is not None
                    and not t.unpriced_calls
                    and self._disagree(t.cost_usd, r.cost_usd)
                )
            )
        update["over_budget"] = _over(state.task_budget_usd, t)
        update["reported_disagrees"] = disagrees
        return state.model_copy(update=update)

    def history(
        self, before: CostMetrics | None, after: CostMetrics, entry: LedgerEntry
    ) -> list[HistoryRow]:
        """One row per newly counted call; a duplicate report leaves none."""
        added = after.totals.calls - (before.totals.calls if before is not None else 0)
        if added <= 0:
            return []
        return [
            HistoryRow(HISTORY_KIND, call.key, entry.sequence_no, call_doc(after, call))
            for call in after.latest[-added:]
        ]

    def _model_call(self, state: CostMetrics, entry: LedgerEntry) -> CostMetrics:
        seen = state.seen_keys
        fresh = new_calls(entry, seen)
        usages = sum(1 for p in entry.parts if isinstance(p, ModelUsagePart))
        duplicates = usages - len(fresh)
        calls = [self._call(part, entry, key) for key, part in fresh]
        if not calls:
            if not duplicates:
                return state
            return state.model_copy(
                update={"duplicate_reports": state.duplicate_reports + duplicates}
            )
        update = _counted(state, calls, duplicates, entry.occurred_at)
        update["seen_keys"] = seen | {key for key, _ in fresh}
        return self._judged(state, update)

    def _call(self, part: ModelUsagePart, entry: LedgerEntry, key: str) -> CallCost:
        usage = normalize_usage(part)
        price = (
            self.prices.price_call(part.provider, part.model, entry.occurred_at, usage)
            if usage is not None
            else None
        )
        cost = price.cost if price is not None else None
        reported = _usd(part.provider_reported_cost_usd)
        own = (
            part.input_tokens,
            part.cached_input_tokens,
            part.output_tokens,
            part.reasoning_tokens,
        )
        if usage is None:  # too little to price it; a known input keeps the counts it has
            counts: tuple[int | None, ...] = (
                tuple(
                    count if part.known(name) else None
                    for name, count in zip(_COUNT_FIELDS, own, strict=True)
                )
                if part.known("input_tokens")
                else (None, None, None, None)
            )
            mismatch = False
        else:
            counts = (
                usage.input,
                # a count the entry says is unknown stays so, whatever normalizer reads the
                # raw usage (they read a missing cached or reasoning count as 0 to price it)
                None if not part.known("cached_input_tokens") else usage.cached_input,
                usage.output,
                # a usage with no reasoning count (Anthropic's: thinking is inside the output;
                # completion_tokens_details of null) is read as 0 by the normalizers, which
                # price the output whole: the entry's unknown stays unknown (never 0)
                None if not part.known("reasoning_tokens") else usage.reasoning,
            )
            mismatch = (
                usage.normalizer != ENTRY_FIELDS and not part.unknown_fields and counts != own
            )
        return CallCost.made(
            key=key,
            response_id=part.provider_response_id,
            entry_id=entry.entry_id,
            seq=entry.sequence_no,
            occurred_at=entry.occurred_at,
            provider=part.provider,
            model=part.model,
            purpose=part.purpose,
            status=_STATUS_TEXT[part.status],
            input_tokens=counts[0],
            cached_input_tokens=counts[1],
            output_tokens=counts[2],
            reasoning_tokens=counts[3],
            cache_write_input_tokens=usage.cache_write if usage is not None else None,
            latency_ms=part.latency_ms if part.known("latency_ms") else None,
            cost_usd=cost,
            provider_reported_cost_usd=reported,
            cost_disagreement=self._disagree(cost, reported),
            unpriced=usage is not None and price is None,
            price_effective_from=price.effective_from if price is not None else None,
            normalizer=usage.normalizer if usage is not None else "unknown",
            usage_mismatch=mismatch,
        )

    def _disagree(self, ours: Decimal | None, reported: Decimal | None) -> bool:
        if ours is None or reported is None:
            return False
        gap = abs(ours - reported)
        return gap > self.abs_tolerance_usd and gap > self.rel_tolerance * reported


def call_doc(state: CostMetrics, call: CallCost) -> dict[str, Any]:
    """The flat history document of a counted call (stable keys for SQL roll-ups)."""
    doc = call.model_dump(mode="json", exclude={"key"})
    doc["run_id"] = state.run_id
    doc["fleet_id"] = state.fleet_id
    doc["day"] = doc["occurred_at"][:10]
    doc["price_version"] = state.price_version
    doc["normalizer_version"] = state.normalizer_version
    return doc


class CostRollup(CostTotals):
    """The totals of the history rows sharing one value of a dimension."""

    by: Dimension
    key: str


def rollup(rows: Iterable[Mapping[str, Any]], by: Dimension) -> list[CostRollup]:
    """Sum history documents (:func:`call_doc`) by run, fleet, model, purpose or day; by key."""
    groups: dict[str, CostTotals] = {}
    for row in rows:
        key = _group_key(row, by)
        groups[key] = groups.get(key, CostTotals()).plus(_call_from_doc(row))
    return [CostRollup(by=by, key=key, **groups[key].model_dump()) for key in sorted(groups)]


def _group_key(row: Mapping[str, Any], by: Dimension) -> str:
    if by == "model":
        return f"{row['provider']}/{row['model']}"
    field = {"run": "run_id", "fleet": "fleet_id", "purpose": "purpose", "day": "day"}[by]
    return str(row[field])


def _call_from_doc(row: Mapping[str, Any]) -> CallCost:
    fields = {name: row[name] for name in CallCost.model_fields if name in row}
    return CallCost.model_validate({**fields, "key": row.get("response_id") or row["entry_id"]})


def _started(state: CostMetrics, entry: LedgerEntry) -> CostMetrics:
    budget = _budget(entry.metadata.get(BUDGET_KEY))
    return state.model_copy(
        update={
            "task_budget_usd": budget,
            "first_at": state.first_at or entry.occurred_at,
            "over_budget": _over(budget, state.totals),
            "calls_unknown": entry.metadata.get(CALLS_KEY) == CALLS_UNKNOWN,
        }
    )


def _over(budget: Decimal | None, totals: CostTotals) -> bool:
    """Over the task budget by our priced cost plus the provider's reported cost of the calls we
    could not price (an unpriced call is never free to the budget)."""
    if budget is None:
        return False
    return totals.cost_usd + totals.unpriced_reported_cost_usd > budget


RUN_TOTALS_REF = "agentledger.run-totals@1"
_TOTALS_KINDS = frozenset({EntryKind.RUN_FINISHED, EntryKind.RUN_SUMMARY})


def _reported_totals(entry: LedgerEntry) -> ReportedTotals | None:
    """The run totals an entry reports (a JsonPart with schema_ref RUN_TOTALS_REF), if any; a
    malformed document is ignored rather than trusted."""
    for part in entry.parts:
        if isinstance(part, JsonPart) and part.schema_ref == RUN_TOTALS_REF:
            try:
                doc = json.loads(part.json_text)
                return ReportedTotals.model_validate(doc) if isinstance(doc, dict) else None
            except ValueError:
                return None
    return None


def _counted(
    state: CostMetrics, calls: list[CallCost], duplicates: int, at: datetime
) -> dict[str, Any]:
    """The state's update for newly counted ``calls``."""
    totals, by_model, by_purpose = state.totals, dict(state.by_model), dict(state.by_purpose)
    for call in calls:
        more = _added_by(call)
        totals = totals.added(more)
        model = f"{call.provider}/{call.model}"
        by_model[model] = by_model.get(model, _EMPTY).added(more)
        by_purpose[call.purpose] = by_purpose.get(call.purpose, _EMPTY).added(more)
    return {
        "totals": totals,
        "by_model": by_model,
        "by_purpose": by_purpose,
        "duplicate_reports": state.duplicate_reports + duplicates,
        "first_at": state.first_at or at,
        "last_at": at,
        "latest": tuple(calls),
    }


def _usd(value: float | None) -> Decimal | None:
    return Decimal(repr(value)) if value is not None else None  # the float's shortest decimal


def _budget(text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        return None
    if not value.is_finite() or value < 0:
        return None
    if value and not -_BUDGET_DIGITS <= value.adjusted() < _BUDGET_DIGITS:
        return None  # not an amount: usd_text could not write it (or only as ~1 MB of zeros)
    return value


_EMPTY = CostTotals()


# -- unknown is never zero: the one rule every output follows --------------------------------

Figure = Literal[
    "cost",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cache_write_input_tokens",
    "provider_reported_cost",
]
FIGURE_FIELDS: dict[Figure, tuple[str, ...]] = {
    "cost": ("cost_usd",),
    "input_tokens": ("input_tokens",),
    "cached_input_tokens": ("cached_input_tokens",),
    "output_tokens": ("output_tokens",),
    "reasoning_tokens": ("reasoning_tokens",),
    "cache_write_input_tokens": ("cache_write_input_tokens",),
    "provider_reported_cost": ("provider_reported_cost_usd",),
}
# the count of the calls that leave a token figure unknown, where counts keep it apart
_UNKNOWN_OF: dict[Figure, str] = {
    "cached_input_tokens": "cached_unknown_calls",
    "output_tokens": "output_unknown_calls",
    "reasoning_tokens": "reasoning_unknown_calls",
    "cache_write_input_tokens": "cache_write_unknown_calls",
}
_T = TypeVar("_T")


class CallCounts(Protocol):
    """What says how many of a sum's calls it covers (:class:`CostTotals`, a cost row). Counts
    that keep a token figure's own unknowns (``output_unknown_calls``...: CostTotals, cost rows)
    have them read; others (a sum of costs only) count a call of unknown usage as unknown in
    every token figure."""

    @property
    def calls(self) -> int: ...
    @property
    def unpriced_calls(self) -> int: ...
    @property
    def usage_unknown_calls(self) -> int: ...
    @property
    def reported_calls(self) -> int: ...


def unknown_calls(counts: CallCounts, figure: Figure) -> int:
    """How many of the calls add nothing to ``figure``'s sum because it is unknown for them: our
    cost of an unpriced call or of one of unknown usage, a token count the call's source did
    not report (all of them for a call of unknown usage, but the counts a partial one kept: its
    input and what else it knows), the provider's cost of one it reported none for."""
    if figure == "cost":
        return counts.unpriced_calls + counts.usage_unknown_calls
    if figure == "provider_reported_cost":
        return counts.calls - counts.reported_calls
    # the calls of unknown usage with every count unknown (a partial one kept its input)
    blank = counts.usage_unknown_calls - getattr(counts, "usage_partial_calls", 0)
    if figure == "input_tokens":
        return blank
    own = getattr(counts, _UNKNOWN_OF[figure], None) if figure in _UNKNOWN_OF else None
    return counts.usage_unknown_calls if own is None else max(own, blank)


def known_sum(counts: CallCounts, figure: Figure, total: _T) -> _T | None:
    """``total`` (a sum over the calls of ``figure``) as an output shows it: None (unknown, never
    0) when no call has the figure known, or there is no call; else the sum of the known ones,
    which is a lower bound when :func:`partly_unknown` says so."""
    return total if counts.calls > unknown_calls(counts, figure) else None


def calls_unknown(flag: object, calls: object) -> bool:
    """Whether a run's calls are unknown: its log keeps no usage (the state's ``calls_unknown``,
    from RUN_STARTED) and no call was counted. The one rule every reader applies (the SQL of
    ``postgres_ops.runs_calls_unknown`` says the same)."""
    return bool(flag) and not calls


def counts_unknown(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a cost row, a run's header or list row) of a run whose calls are unknown (its
    log keeps no usage): every count of calls it has (:data:`CALL_COUNTS`) None, never 0."""
    return doc | {name: None for name in CALL_COUNTS if name in doc}


def shown_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A cost-metrics state document as outputs show it (``subscribe --json``, a replay
    package's views): each sum of its totals, per model and per purpose, None when no call has
    it known (never 0) and named in ``partly_unknown`` when only some do; every count of calls
    None for a run whose calls are unknown."""
    doc = dict(state)
    totals = state.get("totals")
    if isinstance(totals, Mapping):
        shown = _shown_totals(totals)
        unmetered = calls_unknown(state.get("calls_unknown"), shown.get("calls"))
        doc["totals"] = counts_unknown(shown) if unmetered else shown
    for key in ("by_model", "by_purpose"):
        groups = state.get(key)
        if isinstance(groups, Mapping):
            doc[key] = {k: _shown_totals(v) for k, v in groups.items()}
    return doc


def _shown_totals(totals: Mapping[str, Any]) -> dict[str, Any]:
    return dict(totals) | known_figures(CostTotals.model_validate(totals), totals)


def known_figures(counts: CallCounts, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The sums of ``doc`` (a cost row, a run's header, stored totals) as shown: unknown never
    zero (None when no call has the figure, see :func:`known_sum`), and ``partly_unknown``
    naming the figures whose sums are lower bounds (some calls lack them)."""
    shown: dict[str, Any] = {
        name: known_sum(counts, figure, doc.get(name))
        for figure, names in FIGURE_FIELDS.items()
        for name in names
    }
    shown["partly_unknown"] = [
        name for figure in partly_unknown(counts) for name in FIGURE_FIELDS[figure]
    ]
    return shown


def partly_unknown(counts: CallCounts) -> list[Figure]:
    """The figures whose shown sums cover some of the calls but not all (lower bounds)."""
    return [f for f in FIGURE_FIELDS if 0 < unknown_calls(counts, f) < counts.calls]


_STATUS_TEXT = {s: s.value for s in ModelCallStatus}
_COUNT_FIELDS: tuple[UsageField, ...] = (
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_tokens",
)  # .value costs ~5x a look-up
