"""Failure classifications: per run, one class from a versioned taxonomy, with its evidence. Pure.

The fold collects a run's *evidence* — small, bounded tallies that do not depend on any taxonomy —
and classifies it with the projection's :class:`Taxonomy`: rules kept as data
(``projectors/data/failure_taxonomy.v2.json``; v1 kept beside it), tried in order, the first
match naming the class.
A finished run gets its final class; an unfinished one a provisional class (``final`` is false),
which is what the CLI shows for a stalled run. A succeeded run is class ``none``. The RUN_FINISHED
entry contributes its ``run_status`` only: the outcome a producer may write into its metadata or
parts is never read, so the class always rests on evidence.

Evidence. Error events by category (count, first and last entry) and the latest category; tool
results per tool name (failures by status, a timed-out call counting as TIMED_OUT, the latest
status, failures before the run's first code change); model calls (non-OK calls by status, the
latest status; a provider response reported again, as runtimes do once per content block, is one
call, as in cost-metrics); verifier results per check (``verifier:check_id``, or
``verifier:profile``): latest status, failures, passes, failures before the first code change and
*flips* — a pass followed by a fail, or a fail by a pass, on the same code; approval decisions
(REJECTED when ``metadata["decision"]`` is REJECTED/DENIED or a JSON part says
``{"approved": false}``); signatures of repeated failures (an error's ``signature``, else its
category and message hash; a tool's name, status, exit code and summary hash; a failing check).
"The same code" means no DIFF_SNAPSHOT/DIFF_OBSERVATION with files in between, or one whose
``workspace_tree_hash`` equals the previous. A signature seen ``repair_loop.threshold`` times (3 in
v1) marks a *repair loop without progress*, whatever the class.

Taxonomy format (JSON)::

    {"version": "...", "classes": {"<class>": "<description>", ...},
     "sets": {"<name>": ["<glob>", ...]}, "repair_loop": {"threshold": 3},
     "rules": [{"id": "...", "class": "<class>", "explain": "<one line>", "when": <condition>}]}

A condition is an object; every key in it must hold (``{}`` always holds). Globs are fnmatch
patterns; ``"@name"`` in a list stands for the set ``name``. Keys:

- ``finished``: bool — the run has (not) finished.
- ``status``: [RunStatus] — the run finished with one of these.
- ``error``: {category: [glob] = ["*"], min_count = 1, last = false} — errors with a matching
  category occurred at least ``min_count`` times; with ``last``, the latest error's category must
  match (its count is that category's count).
- ``model_call``: {status: [ModelCallStatus], min_count = 1, last = false} — that many non-OK
  calls with one of these statuses; with ``last``, the latest call's status is one of them
  (``min_count`` is then ignored).
- ``tool``: {names: [glob] = ["*"], not_names: [glob] = [], status: [ToolResultStatus] = every
  failure, min_count = 1, last = false, before_diff = false} — over tools whose name matches:
  their failures with one of these statuses (only those before the first code change, with
  ``before_diff``) number at least ``min_count``; with ``last``, each counted tool's latest result
  has one of these statuses (and counts at least once).
- ``verifier``: {checks: [glob] = ["*"], last_status: [VerificationStatus] = any,
  failed_before_diff = false, min_flips = 0, min_failures = 0} — some check meets all of these.
- ``approval``: {decision: [str] = ["REJECTED"], last = false} — some (or the latest) approval
  decision is one of these.
- ``repair_loop``: bool — the repair-loop flag is (not) set.
- ``any`` / ``all``: [condition] — one / every sub-condition holds; ``not``: condition.

v2 adds ``step-limit`` (``STEP_LIMIT``), ``unevaluated`` (``SUBMITTED`` with no verdict yet) and
the class of a submission's *evaluation*: a ``VERIFIER_RESULT`` whose check id or profile names
an evaluation (``*eval*``, e.g. profile ``swe-bench-eval``), which a benchmark harness may send
after ``RUN_FINISHED``; it reclassifies the run (passed: ``none``, failed: ``verifier``). Its
error rules look at the run's latest error only (``last``), so an error the run recovered from
does not outrank the one that ended it.

A run no rule matches is ``unknown``. Classifying is a pure function of (evidence, taxonomy):
pass another taxonomy and re-fold (or :func:`reclassify`) to reclassify history; a stored
document whose taxonomy version differs is reclassified by :meth:`~FailureClassifications.from_doc`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from enum import StrEnum
from fnmatch import translate
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from projectors.base import HistoryRow, ModelProjection, QuickCopy, approval_decision, new_calls
from schemas.errors import AgentLedgerError
from schemas.models import (
    DiffPart,
    EntryKind,
    ErrorPart,
    LedgerEntry,
    ModelCallStatus,
    RunStatus,
    ToolCallPart,
    ToolResultPart,
    ToolResultStatus,
    VerificationPart,
    VerificationStatus,
)

DEFAULT_TAXONOMY = "failure_taxonomy.v2.json"
SUCCESS_CLASS = "none"
UNKNOWN_CLASS = "unknown"
_MAX_KEYS = 32  # distinct error categories, tools, checks, approval decisions kept per run
_MAX_SIGNATURES = 64
_MAX_PENDING = 64
_MAX_RESPONSES = 16  # recent provider response ids: a repeated report is one call
_MAX_REFS = 12
_OTHER = "(other)"


class TaxonomyError(AgentLedgerError):
    """A taxonomy file is not valid JSON or breaks the rule format; fix the file and reload."""


class _Frozen(QuickCopy, BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- taxonomy ------------------------------------------------------------------------------

# UNKNOWN is an outcome the log did not record: neither a failure nor a success.
_TOOL_FAILURES = tuple(
    s for s in ToolResultStatus if s not in (ToolResultStatus.SUCCEEDED, ToolResultStatus.UNKNOWN)
)


class ErrorCondition(_Frozen):
    category: tuple[str, ...] = ("*",)
    min_count: int = Field(default=1, ge=1)
    last: bool = False


class ModelCallCondition(_Frozen):
    status: tuple[ModelCallStatus, ...] = Field(min_length=1)
    min_count: int = Field(default=1, ge=1)
    last: bool = False


class ToolCondition(_Frozen):
    names: tuple[str, ...] = ("*",)
    not_names: tuple[str, ...] = ()
    status: tuple[ToolResultStatus, ...] = _TOOL_FAILURES
    min_count: int = Field(default=1, ge=1)
    last: bool = False
    before_diff: bool = False


class VerifierCondition(_Frozen):
    checks: tuple[str, ...] = ("*",)
    last_status: tuple[VerificationStatus, ...] = ()  # empty: any
    failed_before_diff: bool = False
    min_flips: int = Field(default=0, ge=0)
    min_failures: int = Field(default=0, ge=0)


class ApprovalCondition(_Frozen):
    decision: tuple[str, ...] = ("REJECTED",)
    last: bool = False


class Condition(_Frozen):
    """Every key given must hold; see the module docstring for the vocabulary."""

    finished: bool | None = None
    status: tuple[RunStatus, ...] | None = None
    error: ErrorCondition | None = None
    model_call: ModelCallCondition | None = None
    tool: ToolCondition | None = None
    verifier: VerifierCondition | None = None
    approval: ApprovalCondition | None = None
    repair_loop: bool | None = None
    any_of: tuple[Condition, ...] | None = Field(default=None, alias="any")
    all_of: tuple[Condition, ...] | None = Field(default=None, alias="all")
    not_: Condition | None = Field(default=None, alias="not")


class Rule(_Frozen):
    id: str = Field(min_length=1)
    failure_class: str = Field(alias="class", min_length=1)
    explain: str
    when: Condition


class RepairLoop(_Frozen):
    threshold: int = Field(default=3, ge=2)


class Taxonomy(_Frozen):
    """A versioned, ordered rule list; the first rule whose condition holds names the class."""

    version: str = Field(min_length=1)
    description: str = ""
    classes: dict[str, str]
    sets: dict[str, tuple[str, ...]] = {}
    repair_loop: RepairLoop = RepairLoop()
    rules: tuple[Rule, ...] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _expand_sets(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("sets", {}), dict):
            return {**data, "rules": _expand(data.get("rules"), data.get("sets", {}))}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Taxonomy:
        ids = [r.id for r in self.rules]
        if len(set(ids)) != len(ids):
            raise ValueError(f"rule ids must be unique: {ids}")
        if UNKNOWN_CLASS not in self.classes:
            raise ValueError(f"classes must include {UNKNOWN_CLASS!r} (the no-match class)")
        undeclared = sorted({r.failure_class for r in self.rules} - set(self.classes))
        if undeclared:
            raise ValueError(f"rules name classes missing from 'classes': {undeclared}")
        return self

    @classmethod
    def parse(cls, text: str | bytes, source: str = "<taxonomy>") -> Taxonomy:
        """A taxonomy from JSON text; raises TaxonomyError naming ``source``."""
        try:
            return cls.model_validate(json.loads(text))
        except (ValueError, ValidationError) as exc:
            raise TaxonomyError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> Taxonomy:
        """A user's taxonomy file; raises TaxonomyError."""
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise TaxonomyError(f"{path}: {exc}") from None
        return cls.parse(text, str(path))

    @classmethod
    def default(cls) -> Taxonomy:
        """The shipped taxonomy (``projectors/data/failure_taxonomy.v2.json``)."""
        return _shipped()


@cache
def _shipped() -> Taxonomy:
    data = resources.files("projectors").joinpath("data", DEFAULT_TAXONOMY).read_bytes()
    return Taxonomy.parse(data, DEFAULT_TAXONOMY)


def _expand(value: Any, sets: dict[str, Any]) -> Any:
    """Replace ``"@name"`` items of lists inside rules with the members of set ``name``."""
    if isinstance(value, dict):
        return {k: _expand(v, sets) for k, v in value.items()}
    if not isinstance(value, list):
        return value
    out: list[Any] = []
    for item in value:
        if isinstance(item, str) and item.startswith("@"):
            if item[1:] not in sets:
                raise ValueError(f"unknown set {item!r}; sets: {sorted(sets)}")
            out.extend(sets[item[1:]])
        else:
            out.append(_expand(item, sets))
    return out


@cache
def _matcher(globs: tuple[str, ...]) -> Callable[[str], object]:
    return re.compile("|".join(translate(g) for g in globs) or "(?!)").match


# -- state ---------------------------------------------------------------------------------


class Ref(_Frozen):
    """One evidence entry: its id, sequence number and what it showed."""

    entry_id: str
    seq: int
    note: str


class Tally(_Frozen):
    count: int
    first: Ref
    last: Ref


class ToolTally(_Frozen):
    failures: dict[str, Tally] = {}  # by ToolResultStatus other than SUCCEEDED
    before_diff: dict[str, Tally] = {}  # failures before the run's first code change
    last_status: ToolResultStatus
    last: Ref


class CheckHistory(_Frozen):
    """One verifier check's results; a flip is pass<->fail with no code change in between."""

    results: int = 0
    failures: int = 0
    passes: int = 0
    last_status: VerificationStatus
    last: Ref
    verdict: Literal["pass", "fail"] | None = None  # the latest pass/fail result
    verdict_tree: str | None = None  # the code it was on
    flips: int = 0
    flip_refs: tuple[Ref, ...] = ()  # the first flips, both ends
    failed_before_diff: Ref | None = None


class Evidence(_Frozen):
    """What the rules look at; bounded: at most a few dozen keys per map."""

    tree: str | None = None  # the current code: a tree hash or the last diff's entry id
    first_diff: Ref | None = None
    errors: dict[str, Tally] = {}
    last_error: str | None = None
    signatures: dict[str, Tally] = {}
    model_calls: dict[str, Tally] = {}  # by ModelCallStatus other than OK
    last_model_status: ModelCallStatus | None = None
    last_model_call: Ref | None = None
    recent_responses: tuple[str, ...] = ()  # the last provider response ids seen
    tools: dict[str, ToolTally] = {}
    pending_tools: dict[str, str] = {}  # tool call id -> tool name, until its result
    checks: dict[str, CheckHistory] = {}
    approvals: dict[str, Tally] = {}
    last_approval: str | None = None


class Classification(_Frozen):
    """The verdict: a class, the rule that gave it, why, and the entries that show it."""

    failure_class: str
    rule: str
    taxonomy_version: str
    final: bool  # false: provisional, the run has not finished
    explanation: str
    evidence: tuple[Ref, ...] = ()
    repair_loop: bool = False
    repair_signature: str | None = None  # the most repeated failure signature, if repeated
    repair_count: int = 0  # how often it was seen


class RunDiagnosis(_Frozen):
    """One run's failure evidence and its current classification."""

    run_id: str
    fleet_id: str
    last_sequence_no: int = 0
    finished: bool = False
    status: RunStatus | None = None
    finished_ref: Ref | None = None
    evidence: Evidence = Evidence()
    classification: Classification


# A check before its first result (what the first result updates).
_NO_RESULTS = CheckHistory(
    last_status=VerificationStatus.UNKNOWN, last=Ref(entry_id="-", seq=0, note="")
)
# The text of each status member (``.value`` costs ~5x a look-up).
_TEXT: dict[StrEnum, str] = {m: m.value for e in (ModelCallStatus, ToolResultStatus) for m in e}


# -- projection ----------------------------------------------------------------------------


class FailureClassifications(ModelProjection[RunDiagnosis]):
    """Per run, one failure class of ``taxonomy`` (default: the shipped v1) with its evidence."""

    name = "failure-classifications"
    version = 2  # 2: approvals and model calls read by the rules every projection shares
    hot = False
    state_type = RunDiagnosis

    def __init__(self, taxonomy: Taxonomy | None = None) -> None:
        self.taxonomy = taxonomy or Taxonomy.default()
        self._fresh = _classify(Evidence(), False, None, None, self.taxonomy)

    def accepts(self, entry: LedgerEntry) -> bool:
        return entry.kind in _OBSERVERS

    def initial(self, entry: LedgerEntry) -> RunDiagnosis:
        return RunDiagnosis(
            run_id=entry.run_id, fleet_id=entry.fleet_id, classification=self._fresh
        )

    def fold(self, state: RunDiagnosis, entry: LedgerEntry) -> RunDiagnosis:
        kind, seq = entry.kind, entry.sequence_no
        observe = _OBSERVERS.get(kind)
        if observe is None or entry.run_id != state.run_id:
            return state
        if seq <= state.last_sequence_no:
            return state
        update: dict[str, Any] = {"last_sequence_no": seq}
        before = state.evidence
        evidence, changed = observe(before, entry)
        if evidence is not before:
            update["evidence"] = evidence
        if kind is EntryKind.RUN_FINISHED:
            status = entry.run_status
            update.update(
                finished=True, status=status, finished_ref=_ref(entry, f"run finished {status}")
            )
            changed = True
        if changed:
            update["classification"] = _classify(
                evidence,
                update.get("finished", state.finished),
                update.get("status", state.status),
                update.get("finished_ref", state.finished_ref),
                self.taxonomy,
            )
        return state.model_copy(update=update)

    def history(
        self, before: RunDiagnosis | None, after: RunDiagnosis, entry: LedgerEntry
    ) -> list[HistoryRow]:
        """The final classification, once, when the run finishes."""
        if not after.finished or (before is not None and before.finished):
            return []
        doc = {"run_id": after.run_id, "fleet_id": after.fleet_id}
        doc.update(after.classification.model_dump(mode="json"))
        return [HistoryRow("classification", "final", entry.sequence_no, doc)]

    def from_doc(self, doc: dict[str, Any]) -> RunDiagnosis:
        """The stored state, reclassified when it was classified by another taxonomy version."""
        state = RunDiagnosis.model_validate(doc)
        if state.classification.taxonomy_version != self.taxonomy.version:
            return reclassify(state, self.taxonomy)
        return state


def reclassify(state: RunDiagnosis, taxonomy: Taxonomy) -> RunDiagnosis:
    """The same evidence classified by ``taxonomy``."""
    verdict = _classify(state.evidence, state.finished, state.status, state.finished_ref, taxonomy)
    return state.model_copy(update={"classification": verdict})


def counts(
    states: Iterable[RunDiagnosis], *, final_only: bool = False
) -> dict[tuple[str, str], int]:
    """Runs per (fleet, class); provisional classes count unless ``final_only``."""
    out: dict[tuple[str, str], int] = {}
    for s in states:
        if final_only and not s.finished:
            continue
        key = (s.fleet_id, s.classification.failure_class)
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def explain(state: RunDiagnosis) -> str:
    """A few lines for a human: the class, why, the repair-loop flag and the evidence."""
    c = state.classification
    where = f"finished {state.status}" if state.finished else "unfinished (provisional class)"
    loop = (
        f"yes: {c.repair_signature} seen {c.repair_count} times"
        if c.repair_loop
        else f"no (most repeated: {c.repair_signature} x{c.repair_count})"
        if c.repair_signature
        else "no"
    )
    lines = [
        f"run {state.run_id} (fleet {state.fleet_id}), {where}",
        f"class: {c.failure_class}  [rule {c.rule}, taxonomy {c.taxonomy_version}]",
        f"why: {c.explanation}",
        f"repair loop without progress: {loop}",
        "evidence:" if c.evidence else "evidence: none",
    ]
    lines += [f"  seq {r.seq:>5}  {r.entry_id}  {r.note}" for r in c.evidence]
    return "\n".join(lines)


# -- evidence ------------------------------------------------------------------------------


def _ref(entry: LedgerEntry, note: str) -> Ref:
    return Ref.made(entry_id=entry.entry_id, seq=entry.sequence_no, note=note)


def _tally(tally: Tally | None, ref: Ref) -> Tally:
    if tally is None:
        return Tally.made(count=1, first=ref, last=ref)
    return Tally.made(count=tally.count + 1, first=tally.first, last=ref)


def _bump(tallies: dict[str, Tally], key: str, ref: Ref, cap: int = _MAX_KEYS) -> dict[str, Tally]:
    """``tallies`` with one more ``key``; past ``cap`` keys new ones count as ``(other)``."""
    if key not in tallies and len(tallies) >= cap:
        key = _OTHER
    return {**tallies, key: _tally(tallies.get(key), ref)}


def _signed(signatures: dict[str, Tally], signature: str, ref: Ref) -> dict[str, Tally]:
    if signature not in signatures and len(signatures) >= _MAX_SIGNATURES:
        return signatures
    return {**signatures, signature: _tally(signatures.get(signature), ref)}


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


Observed = tuple[Evidence, bool]  # the new evidence, whether a rule could now decide otherwise


def _tool_request(ev: Evidence, entry: LedgerEntry) -> Observed:
    pending = ev.pending_tools
    for part in entry.parts:
        if isinstance(part, ToolCallPart):
            pending = {**pending, part.tool_call_id: part.tool_name}
            if len(pending) > _MAX_PENDING:  # results that never came
                pending.pop(next(iter(pending)))
    return ev.model_copy(update={"pending_tools": pending}), False


def _tool_result(ev: Evidence, entry: LedgerEntry) -> Observed:
    changed = False
    for part in entry.parts:
        if isinstance(part, ToolResultPart):
            ev, moved = _tool_outcome(ev, entry, part)
            changed = changed or moved
    return ev, changed


def _tool_outcome(ev: Evidence, entry: LedgerEntry, part: ToolResultPart) -> Observed:
    pending = dict(ev.pending_tools)
    name = pending.pop(part.tool_call_id, None) or "(unrequested)"
    status = ToolResultStatus.TIMED_OUT if part.timed_out else part.status
    if name not in ev.tools and len(ev.tools) >= _MAX_KEYS:
        name = _OTHER
    ref = _ref(entry, f"tool {name} {status}")
    before = ev.tools.get(name)
    update: dict[str, Any] = {"pending_tools": pending}
    if status in (ToolResultStatus.SUCCEEDED, ToolResultStatus.UNKNOWN):
        tally = (
            before.model_copy(update={"last_status": status, "last": ref})
            if before
            else ToolTally.made(failures={}, before_diff={}, last_status=status, last=ref)
        )
        update["tools"] = {**ev.tools, name: tally}
        moved = before is not None and before.last_status is not status
        return ev.model_copy(update=update), moved
    failures = before.failures if before else {}
    early = before.before_diff if before else {}
    if ev.first_diff is None:
        early = _bump(early, _TEXT[status], ref)
    tally = ToolTally.made(
        failures=_bump(failures, _TEXT[status], ref),
        before_diff=early,
        last_status=status,
        last=ref,
    )
    summary = _short_hash(part.summary)
    signature = f"tool:{name}:{status}:{part.exit_code}:{summary}"
    update.update(
        tools={**ev.tools, name: tally}, signatures=_signed(ev.signatures, signature, ref)
    )
    return ev.model_copy(update=update), True


def _error(ev: Evidence, entry: LedgerEntry) -> Observed:
    errors, signatures, last = ev.errors, ev.signatures, ev.last_error
    for part in entry.parts:
        if isinstance(part, ErrorPart):
            ref = _ref(entry, f"error {part.category}: {part.message[:80]}")
            errors = _bump(errors, part.category, ref)
            last = part.category if part.category in errors else _OTHER
            sig = part.signature or f"error:{part.category}:{_short_hash(part.message)}"
            signatures = _signed(signatures, sig, ref)
    update = {"errors": errors, "signatures": signatures, "last_error": last}
    return ev.model_copy(update=update), errors is not ev.errors


def _model_call(ev: Evidence, entry: LedgerEntry) -> Observed:
    fresh = new_calls(entry, ev.recent_responses)
    if not fresh:  # no model call, or only responses reported again
        return ev, False
    moved = False
    for _, usage in fresh:
        status = usage.status
        ref = _ref(entry, f"model call {usage.provider}/{usage.model} {status}")
        update: dict[str, Any] = {"last_model_status": status, "last_model_call": ref}
        response = usage.provider_response_id
        if response is not None:
            update["recent_responses"] = (*ev.recent_responses, response)[-_MAX_RESPONSES:]
        if status is not ModelCallStatus.OK:
            update["model_calls"] = _bump(ev.model_calls, _TEXT[status], ref)
        moved = (
            moved
            or status is not ModelCallStatus.OK
            or ev.last_model_status
            not in (
                None,
                ModelCallStatus.OK,
            )
        )
        ev = ev.model_copy(update=update)
    return ev, moved


def _verification(ev: Evidence, entry: LedgerEntry) -> Observed:
    changed = False
    for part in entry.parts:
        if isinstance(part, VerificationPart):
            ev = _check(ev, entry, part)
            changed = True
    return ev, changed


_VERDICTS: dict[VerificationStatus, Literal["pass", "fail"]] = {
    VerificationStatus.PASSED: "pass",
    VerificationStatus.FAILED: "fail",
    VerificationStatus.ERROR: "fail",
}


def _check(ev: Evidence, entry: LedgerEntry, part: VerificationPart) -> Evidence:
    key = f"{part.verifier}:{part.check_id or part.profile}"
    old = ev.checks.get(key)
    if old is None and len(ev.checks) >= _MAX_KEYS:
        return ev
    status = part.status
    ref = _ref(entry, f"check {key} {status}")
    verdict = _VERDICTS.get(status)
    h = old or _NO_RESULTS.model_copy(update={"last_status": status, "last": ref})
    flipped = (
        verdict is not None
        and h.verdict is not None
        and verdict != h.verdict
        and h.verdict_tree == ev.tree
    )
    update: dict[str, Any] = {"results": h.results + 1, "last_status": status, "last": ref}
    if verdict is not None:
        update.update(verdict=verdict, verdict_tree=ev.tree)
    if verdict == "pass":
        update["passes"] = h.passes + 1
    if verdict == "fail":
        update["failures"] = h.failures + 1
        if ev.first_diff is None and h.failed_before_diff is None:
            update["failed_before_diff"] = ref
    if flipped:
        update["flips"] = h.flips + 1
        if len(h.flip_refs) < 4:
            update["flip_refs"] = (*h.flip_refs, h.last, ref)
    checks = {**ev.checks, key: h.model_copy(update=update)}
    signatures = ev.signatures
    if verdict == "fail":
        signatures = _signed(signatures, f"check:{key}:{status}", ref)
    return ev.model_copy(update={"checks": checks, "signatures": signatures})


def _diff(ev: Evidence, entry: LedgerEntry) -> Observed:
    for part in entry.parts:
        if isinstance(part, DiffPart) and part.files:
            tree = part.workspace_tree_hash or entry.entry_id
            if tree != ev.tree:
                first = ev.first_diff or _ref(entry, "first code change")
                ev = ev.model_copy(update={"tree": tree, "first_diff": first})
    return ev, False


def _approval(ev: Evidence, entry: LedgerEntry) -> Observed:
    decision = approval_decision(entry)
    ref = _ref(entry, f"approval {decision}")
    approvals = _bump(ev.approvals, decision, ref)
    update = {"approvals": approvals, "last_approval": decision}
    return ev.model_copy(update=update), True


def _finished(ev: Evidence, entry: LedgerEntry) -> Observed:
    return ev, True  # only run_status is read, by the fold


_OBSERVERS: dict[EntryKind, Callable[[Evidence, LedgerEntry], Observed]] = {
    EntryKind.TOOL_CALL_REQUEST: _tool_request,
    EntryKind.TOOL_CALL_RESULT: _tool_result,
    EntryKind.ERROR_EVENT: _error,
    EntryKind.MODEL_CALL: _model_call,
    EntryKind.VERIFIER_RESULT: _verification,
    EntryKind.DIFF_SNAPSHOT: _diff,
    EntryKind.DIFF_OBSERVATION: _diff,
    EntryKind.APPROVAL_DECISION: _approval,
    EntryKind.RUN_FINISHED: _finished,
}


# -- classification ------------------------------------------------------------------------


class _Facts(NamedTuple):
    ev: Evidence
    finished: bool
    status: RunStatus | None
    finished_ref: Ref | None
    loop: bool
    loop_signature: str | None


Match = tuple[list[Ref], list[str]]  # evidence entries, phrases for the explanation
# One key of a condition, ready to test: its evidence and phrases when it holds, else None.
Check = Callable[[_Facts], Match | None]


def _classify(
    ev: Evidence,
    finished: bool,
    status: RunStatus | None,
    finished_ref: Ref | None,
    taxonomy: Taxonomy,
) -> Classification:
    signature, tally = _most_repeated(ev.signatures)
    count = tally.count if tally else 0
    if count < 2:
        signature = None
    loop = count >= taxonomy.repair_loop.threshold
    facts = _Facts(ev, finished, status, finished_ref, loop, signature)
    rule_id, failure_class, why, found = "(no rule matched)", UNKNOWN_CLASS, "no rule matched", None
    for rule, check in _compiled_rules(taxonomy):
        found = check(facts)
        if found is not None:
            rule_id, failure_class, why = rule.id, rule.failure_class, rule.explain
            break
    refs, phrases = found or ([], [])
    if finished_ref is not None:
        refs = [*refs, finished_ref]
    return Classification.made(
        failure_class=failure_class,
        rule=rule_id,
        taxonomy_version=taxonomy.version,
        final=finished,
        explanation=f"{why} ({'; '.join(phrases)})" if phrases else why,
        evidence=_evidence(refs),
        repair_loop=loop,
        repair_signature=signature,
        repair_count=count,
    )


def _most_repeated(signatures: dict[str, Tally]) -> tuple[str | None, Tally | None]:
    """The most repeated signature; a tie goes to the one seen first. Never dict order: the
    stored document's key order is PostgreSQL's (jsonb sorts keys), not arrival order."""
    if not signatures:
        return None, None
    signature = min(signatures, key=lambda s: (-signatures[s].count, signatures[s].first.seq, s))
    return signature, signatures[signature]


def _evidence(refs: list[Ref]) -> tuple[Ref, ...]:
    unique = {r.entry_id: r for r in refs}
    ordered = sorted(unique.values(), key=lambda r: r.seq)
    if len(ordered) <= _MAX_REFS:
        return tuple(ordered)
    return (*ordered[: _MAX_REFS - 1], ordered[-1])  # keep the end of the run


# Taxonomies whose rules were compiled (by id, with the taxonomy itself so the id stays its).
_COMPILED: dict[int, tuple[Taxonomy, tuple[tuple[Rule, Check], ...]]] = {}


def _compiled_rules(taxonomy: Taxonomy) -> tuple[tuple[Rule, Check], ...]:
    """The taxonomy's rules, each with its condition compiled (once per taxonomy)."""
    held = _COMPILED.get(id(taxonomy))
    if held is None or held[0] is not taxonomy:
        if len(_COMPILED) >= 8:
            _COMPILED.clear()
        rules = tuple((rule, _compiled(rule.when)) for rule in taxonomy.rules)
        held = _COMPILED[id(taxonomy)] = (taxonomy, rules)
    return held[1]


def _compiled(c: Condition) -> Check:
    """``c`` as one check: the evidence and phrases of its keys, tested in order, when every
    one holds; None when one does not."""
    checks: list[Check] = []
    if c.finished is not None:
        checks.append(_finished_is(c.finished))
    if c.status is not None:
        checks.append(_status(c.status))
    if c.error is not None:
        checks.append(_errors(c.error))
    if c.model_call is not None:
        checks.append(_model_calls(c.model_call))
    if c.tool is not None:
        checks.append(_tools(c.tool))
    if c.verifier is not None:
        checks.append(_checks(c.verifier))
    if c.approval is not None:
        checks.append(_approvals(c.approval))
    if c.repair_loop is not None:
        checks.append(_repair(c.repair_loop))
    if c.any_of is not None:
        checks.append(_any(tuple(_compiled(s) for s in c.any_of)))
    if c.all_of is not None:
        checks.append(_every(tuple(_compiled(s) for s in c.all_of)))
    if c.not_ is not None:
        checks.append(_not(_compiled(c.not_)))
    return checks[0] if len(checks) == 1 else _every(tuple(checks))


def _every(checks: tuple[Check, ...]) -> Check:
    def check(f: _Facts) -> Match | None:
        refs: list[Ref] = []
        phrases: list[str] = []
        for each in checks:
            found = each(f)
            if found is None:
                return None
            refs += found[0]
            phrases += found[1]
        return refs, phrases

    return check


def _any(checks: tuple[Check, ...]) -> Check:
    def check(f: _Facts) -> Match | None:
        for each in checks:
            found = each(f)
            if found is not None:
                return found
        return None

    return check


def _not(negated: Check) -> Check:
    return lambda f: ([], []) if negated(f) is None else None


def _finished_is(finished: bool) -> Check:
    return lambda f: ([], []) if f.finished == finished else None


def _status(statuses: tuple[RunStatus, ...]) -> Check:
    def check(f: _Facts) -> Match | None:
        if f.status is None or f.status not in statuses:
            return None
        return ([f.finished_ref] if f.finished_ref else []), [f"run finished {f.status}"]

    return check


def _repair(wanted: bool) -> Check:
    def check(f: _Facts) -> Match | None:
        if f.loop != wanted:
            return None
        tally = f.ev.signatures.get(f.loop_signature or "")
        if not wanted or tally is None:
            return [], []
        return [tally.first, tally.last], [f"repair loop: {f.loop_signature} x{tally.count}"]

    return check


# The checks of the evidence keys below read their condition's fields once, when compiled.


def _errors(c: ErrorCondition) -> Check:
    match, last, min_count = _matcher(c.category), c.last, c.min_count

    def check(f: _Facts) -> Match | None:
        ev = f.ev
        if last:
            picked = [ev.last_error] if ev.last_error and match(ev.last_error) else []
        else:
            picked = [k for k in ev.errors if match(k)]
        tallies = [(k, ev.errors[k]) for k in picked]
        if not tallies or sum(t.count for _, t in tallies) < min_count:
            return None
        refs = [r for _, t in tallies for r in ((t.last,) if last else (t.first, t.last))]
        return refs, [f"error {k} x{t.count}" for k, t in tallies]

    return check


def _model_calls(c: ModelCallCondition) -> Check:
    statuses, last, min_count = c.status, c.last, c.min_count
    keys = [_TEXT[s] for s in statuses]

    def check(f: _Facts) -> Match | None:
        ev = f.ev
        if last:
            ref = ev.last_model_call
            if ev.last_model_status not in statuses or ref is None:
                return None
            return [ref], [f"last model call {ev.last_model_status}"]
        calls = ev.model_calls
        tallies = [(k, calls[k]) for k in keys if k in calls]
        if sum(t.count for _, t in tallies) < min_count:
            return None
        return [r for _, t in tallies for r in (t.first, t.last)], [
            f"model calls {k} x{t.count}" for k, t in tallies
        ]

    return check


def _tools(c: ToolCondition) -> Check:
    named, excluded = _matcher(c.names), _matcher(c.not_names)
    statuses, last, before_diff, min_count = c.status, c.last, c.before_diff, c.min_count
    keys = [_TEXT[s] for s in statuses]
    when = " before any code change" if before_diff else ""
    chosen: dict[str, bool] = {}  # tool name -> whether the condition looks at that tool

    def check(f: _Facts) -> Match | None:
        refs: list[Ref] = []
        phrases: list[str] = []
        total = 0
        for name, tool in f.ev.tools.items():
            looked = chosen.get(name)
            if looked is None:
                if len(chosen) >= _MAX_CHOSEN:
                    chosen.clear()
                looked = chosen[name] = bool(named(name)) and not excluded(name)
            if not looked or (last and tool.last_status not in statuses):
                continue
            source = tool.before_diff if before_diff else tool.failures
            tallies = [(k, source[k]) for k in keys if k in source]
            n = sum(t.count for _, t in tallies)
            if before_diff and n == 0:
                continue
            if last:
                n = max(n, 1)
                refs.append(tool.last)
            total += n
            refs += [r for _, t in tallies for r in (t.first, t.last)]
            phrases += [f"{name} {k} x{t.count}{when}" for k, t in tallies]
            if last:
                phrases.append(f"{name} last {tool.last_status}")
        return (refs, phrases) if total >= min_count and refs else None

    return check


_MAX_CHOSEN = 4096  # tool names remembered per tool condition


def _checks(c: VerifierCondition) -> Check:
    named, last_status = _matcher(c.checks), c.last_status
    failed_before_diff, min_flips, min_failures = c.failed_before_diff, c.min_flips, c.min_failures

    def check(f: _Facts) -> Match | None:
        for key, h in f.ev.checks.items():
            if not named(key) or (last_status and h.last_status not in last_status):
                continue
            if failed_before_diff and h.failed_before_diff is None:
                continue
            if h.flips < min_flips or h.failures < min_failures:
                continue
            refs = [h.last]
            phrase = f"check {key}: last {h.last_status}, {h.failures} failed, {h.passes} passed"
            if failed_before_diff and h.failed_before_diff is not None:
                refs.append(h.failed_before_diff)
                phrase += ", failed before any code change"
            if min_flips:
                refs += h.flip_refs
                phrase += f", {h.flips} pass/fail flips on the same code"
            return refs, [phrase]
        return None

    return check


def _approvals(c: ApprovalCondition) -> Check:
    decisions, last = c.decision, c.last

    def check(f: _Facts) -> Match | None:
        ev = f.ev
        latest = [ev.last_approval] if ev.last_approval else []
        picked = latest if last else list(ev.approvals)
        tallies = [(d, ev.approvals[d]) for d in picked if d in decisions and d in ev.approvals]
        if not tallies:
            return None
        return [t.last for _, t in tallies], [f"approval {d} x{t.count}" for d, t in tallies]

    return check
