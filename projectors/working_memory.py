"""Working memory: per run, what an agent may rely on, folded from the ledger. Pure.

The state holds the task goal, the current plan, changed files, evidence-bound facts, open (and
closed) problems, blockers, decisions, rejected claims and warnings, plus a compact index of what
exists in the run so far (entry ids, tool calls with their result status, artifact ids) against
which evidence resolves.

How evidence is judged. A proposed fact, problem or decision is accepted only when it cites at
least one ref and every ref resolves: ``entry:<id>`` to an entry of this run applied before the
proposal, ``tool-call:<id>`` to a tool call of this run, ``artifact:<id>`` to an artifact carried
by such an entry. Any other scheme, an entry of another run and a later entry do not resolve.
Facts must also be *supported*:

- a fact citing only the agent's own words (assistant responses, thought summaries, memory
  proposals) is unsupported;
- a fact whose refs include a failed, timed-out, denied or unanswered tool call (or its result
  entry or artifacts, a failed verifier, an error event) and no succeeded one is accepted only
  when it clearly claims a failure: a failed call supports "the build fails", never "all tests
  pass with no failures", "fixed the failing test" or "the project compiles";
- a fact claiming success (pass, succeeded, works, fixed, ...) must cite at least one success: a
  succeeded tool call, its result entry or output, or a passing verifier (neutral refs such as a
  file observation support no success);
- a fact claiming failure is unsupported when its refs show only success or pending calls.
  Negation flips the claim ("does not pass" is a failure); a claim with both or neither kind of
  word has no clear polarity.

An artifact resolves to the most telling outcome among the entries that carry it so far: failed
over pending over succeeded over neutral over the agent's own words (an ``ARTIFACT_STORED`` entry
followed by a failed result carrying the same artifact resolves to failed).

Rejected claims land in ``unsupported_claims`` with the reason. Facts are never rewritten: a newer
fact about the same subject (same normalized key, with polarity and filler words removed)
supersedes the older one, which keeps ``superseded_by``. A passing verifier check is a fact with
the verifier entry as evidence; a failing one opens a problem that a later pass of the same check
closes, and either outcome supersedes older facts about that check (its ``check:<id>`` key, or a
fact/problem keyed by the check's name or short test name, e.g. "test_last_page fails"). The
current memory keeps the newest 8 superseded facts, closed problems and rejected claims (counting
the older ones, which stay in the snapshot versions that had them), so its size stays bounded.

Other rules. The latest USER_TASK text is the goal; ASSISTANT_RESPONSE ``metadata["plan"]`` (a
JSON list or numbered/bulleted text) is the plan. A COMPACTION's inline text/JSON must mention
every significant word of the goal and of each open problem's subject, else it is flagged.
Pending approval requests, rejected approvals and ``policy*`` errors block the run. Duplicate
sequence numbers and other runs' entries leave the state untouched; ``snapshot_version`` and
``snapshot_at`` move only when a content field changes.
"""

from __future__ import annotations

import heapq
import re
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable
from itertools import pairwise
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from projectors.base import (
    HistoryRow,
    ModelProjection,
    QuickCopy,
    approval_decision,
    fold_all,
    parse_json,
    storable,
)
from projectors.layered import Layered, LayeredDict
from projectors.trust import may_instruct, model_visible
from schemas.models import (
    ArtifactRefPart,
    DiffFile,
    DiffPart,
    EntryKind,
    ErrorPart,
    FileChangeStatus,
    JsonPart,
    LedgerEntry,
    MemoryProposalPart,
    PermissionClass,
    RunStatus,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    ToolResultStatus,
    UtcDatetime,
    VerificationPart,
    VerificationStatus,
)

Outcome = Literal["succeeded", "read", "failed", "neutral", "pending", "agent", "hidden"]
Polarity = Literal["success", "failure"]


class _Frozen(QuickCopy, BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Fact(_Frozen):
    """A fact the agent may rely on; superseded facts stay, linked to what replaced them."""

    fact_id: str
    fact: str
    evidence: tuple[str, ...]
    status: Literal["active", "superseded"] = "active"
    superseded_by: str | None = None  # fact:<fact_id> or entry:<entry_id>
    source: Literal["proposal", "verifier"]
    key: str
    added_at_seq: int
    superseded_at_seq: int | None = None


class Problem(_Frozen):
    """An open problem; a closed one keeps the ref that closed it."""

    problem: str
    evidence: tuple[str, ...]
    opened_at_seq: int
    source: Literal["proposal", "verifier"]
    key: str
    closed_by: str | None = None
    closed_at_seq: int | None = None


class Decision(_Frozen):
    decision: str
    reason: str
    evidence: tuple[str, ...]
    decided_at_seq: int


class UnsupportedClaim(_Frozen):
    """A proposal the projector rejected, and why."""

    claim: str
    kind: Literal["fact", "problem", "decision"]
    reason: str
    evidence: tuple[str, ...]
    proposed_at_seq: int


class Blocker(_Frozen):
    kind: Literal["approval-pending", "approval-rejected", "policy-denied"]
    blocker: str
    evidence: str
    since_seq: int


class ToolCallStatus(_Frozen):
    request_entry_id: str | None = None
    status: ToolResultStatus | None = None  # None: no result yet; the first result counts
    read_only: bool = False  # a READ_ONLY tool: its success shows what exists, not that it works
    result_entry_id: str | None = None


_NO_CALL = ToolCallStatus()  # a call the index does not know yet (copied, never stored)


class RunIndex(_Frozen):
    """What exists in the run so far; bounded by the run's size. Its maps grow with the run and
    change a little at every entry: Layered, so a fold step copies what it changes only."""

    entries: Annotated[Layered[str, Outcome], LayeredDict(dict[str, Outcome])] = Field(
        default_factory=Layered
    )
    tool_calls: Annotated[Layered[str, ToolCallStatus], LayeredDict(dict[str, ToolCallStatus])] = (
        Field(default_factory=Layered)
    )
    # artifact id -> the carrying entry with the most telling outcome (see _TELLING)
    artifacts: Annotated[Layered[str, str], LayeredDict(dict[str, str])] = Field(
        default_factory=Layered
    )
    created_files: tuple[str, ...] = ()  # ADDED in this run, so a later DELETE drops them
    changed_files: tuple[str, ...] = ()  # every file the run changed, sorted
    # path -> the sequence number of the entry that changed it last (a path no longer changed
    # keeps its number: changed_files says which are)
    file_changes: Annotated[Layered[str, int], LayeredDict(dict[str, int])] = Field(
        default_factory=Layered
    )
    # the newest CHANGED_FILES_SHOWN of them by their last change, the newest last: the memory
    # lists these once the run has changed more
    recent_files: tuple[str, ...] = ()


class WorkingMemory(_Frozen):
    """One run's working memory; ``snapshot_version`` counts changes of its content."""

    run_id: str
    fleet_id: str
    task_goal: str | None = None
    current_plan: tuple[str, ...] = ()
    # the files the run changed, sorted: all of them up to CHANGED_FILES_SHOWN, then the newest
    # CHANGED_FILES_SHOWN by their last change (a run creating thousands of files kept a memory,
    # and a snapshot row per version, of every path); changed_files_total counts them all and
    # the evidence index lists them all (``memory --index changed_files``)
    changed_files: tuple[str, ...] = ()
    changed_files_total: int = 0
    known_facts: tuple[Fact, ...] = ()
    open_problems: tuple[Problem, ...] = ()
    closed_problems: tuple[Problem, ...] = ()
    blocked_by: tuple[Blocker, ...] = ()
    decisions: tuple[Decision, ...] = ()
    unsupported_claims: tuple[UnsupportedClaim, ...] = ()
    flags: tuple[str, ...] = ()
    source_seq_range: tuple[int, int] | None = None
    snapshot_version: int = 0
    snapshot_at: UtcDatetime | None = None  # occurred_at of the entry that made this version
    index: RunIndex = Field(default_factory=RunIndex)
    # Superseded facts, closed problems and rejected claims older than the newest
    # KEEP_RETIRED of each leave the current memory (the snapshot versions that had them keep
    # them): a run of thousands of entries keeps a memory of bounded size.
    facts_retired: int = 0
    problems_retired: int = 0
    claims_retired: int = 0

    def active_facts(self) -> tuple[Fact, ...]:
        return tuple(f for f in self.known_facts if f.status == "active")


_CONTENT_FIELDS = (
    "task_goal",
    "current_plan",
    "changed_files",
    "changed_files_total",
    "known_facts",
    "open_problems",
    "closed_problems",
    "blocked_by",
    "decisions",
    "unsupported_claims",
    "flags",
)


# USER_TASK metadata of a user's interruption notice (Claude Code writes "[Request interrupted
# by user]" as the user's text): it is not the run's goal
INTERRUPTION_KEY = "user.interruption"
# ... and of a harness's automatic reply in the user's place (OpenHands' evaluation harness
# answers "Please continue working on the task..." whenever the agent asks): not the goal
AUTO_REPLY_KEY = "user.auto_reply"

# the parts of the evidence index that grow with the run (checkpoint pages)
INDEX_PAGED = (
    "index.entries",
    "index.tool_calls",
    "index.artifacts",
    "index.created_files",
    "index.changed_files",
    "index.file_changes",
)


class WorkingMemoryProjection(ModelProjection[WorkingMemory]):
    name = "working-memory"
    # 4: the newest 8 retired items of each kind kept (long runs).
    # 2: failed/neutral evidence supports no unclear or success claim. 3: model-visible entries
    # only; untrusted tasks are not the goal; a failure among a success claim's refs defeats it;
    # reads support no success; failure claims open problems; a check's pass closes what
    # mentions it; compactions checked for success claims and new requirements
    # 5: approval decisions read as every projection reads them (a JSON "decision" too). 6: a
    # user's interruption notice is not the goal. 7: nor a harness's automatic reply
    # 8: a fact's id counts the retired facts too (one id was given twice once they left)
    # 9: changed_files bounded (CHANGED_FILES_SHOWN newest, changed_files_total counts them
    # all); the index lists every changed file
    version = 9
    hot = True
    state_type = WorkingMemory
    unbounded = ("index",)  # the evidence index: every entry id of the run
    paged: tuple[str, ...] = INDEX_PAGED

    def accepts(self, entry: LedgerEntry) -> bool:
        return True  # every entry may later be cited as evidence

    def initial(self, entry: LedgerEntry) -> WorkingMemory:
        return WorkingMemory(run_id=entry.run_id, fleet_id=entry.fleet_id)

    def history(
        self, before: WorkingMemory | None, after: WorkingMemory, entry: LedgerEntry
    ) -> list[HistoryRow]:
        """Every snapshot version, for time travel (without the evidence index)."""
        if before is not None and before.snapshot_version == after.snapshot_version:
            return []
        doc = after.model_dump(mode="json", exclude=_NO_INDEX)  # (to_doc less the index)
        return [HistoryRow("snapshot", str(after.snapshot_version), entry.sequence_no, doc)]

    def fold(self, state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
        return SHARED_FOLDS.fold(state, entry)


def _fold(state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    """One entry onto a working memory (the projection's fold; pure)."""
    seen = state.source_seq_range
    if entry.run_id != state.run_id or (seen is not None and entry.sequence_no <= seen[1]):
        return state
    if not model_visible(entry):  # indexed as existing, never a source of what memory says
        return _bookkeep(state, state, entry)
    handler = _HANDLERS.get(entry.kind)
    updated = handler(state, entry) if handler is not None else state
    return _bookkeep(state, updated, entry)


class SharedFolds:
    """The working-memory fold, its results shared by identity.

    Two projections fold every entry onto a working memory: this one, and context-manifests,
    which keeps its own for the next turn's memory text (so either can be rebuilt alone). A
    worker running both folds each entry twice onto equal states: the second fold of an entry
    (the same decoded object) onto a state that is the first's, or equal to it, returns the
    first's result, the same object, so the two memories stay one object from then on and the
    check is ``is``. The fold is pure, so this changes no result, only the work (issue 25:
    ~9 % of the worker's fold time). It keeps results only while armed (the engine arms it for
    a batch's folds and clears it after), so a reader's refold holds nothing; and at most
    ``LIMIT`` at a time.
    """

    LIMIT = 4_096

    def __init__(self) -> None:
        self._done: dict[tuple[str, int], tuple[LedgerEntry, WorkingMemory, WorkingMemory]] = {}
        self.hits = 0
        self.armed = False

    def arm(self) -> None:
        self.armed = True

    def fold(self, state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
        if not self.armed:
            return _fold(state, entry)
        key = (entry.run_id, entry.sequence_no)
        done = self._done.get(key)
        if done is not None and done[0] is entry and (done[1] is state or done[1] == state):
            self.hits += 1
            return done[2]
        result = _fold(state, entry)
        if len(self._done) >= self.LIMIT:
            self._done.clear()
        self._done[key] = (entry, state, result)
        return result

    def clear(self) -> None:
        """Forget every result and disarm."""
        self._done.clear()
        self.armed = False


SHARED_FOLDS = SharedFolds()


def memory_at(entries: list[LedgerEntry], seq: int) -> WorkingMemory | None:
    """The working memory of a run as it stood after entry ``seq`` (None before any entry)."""
    prefix = sorted((e for e in entries if e.sequence_no <= seq), key=lambda e: e.sequence_no)
    return fold_all(WorkingMemoryProjection(), prefix)


KEEP_RETIRED = 8
CHANGED_FILES_SHOWN = 100  # changed files the memory lists (the index keeps them all)
_NO_INDEX = {"index"}


def _bookkeep(before: WorkingMemory, after: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    seen = before.source_seq_range
    changed = after is not before and _content(before) != _content(after)
    if changed:
        after = _trimmed(after)
    seq = entry.sequence_no
    return after.model_copy(
        update={
            "index": _indexed(after.index, entry),
            "source_seq_range": (seen[0] if seen else seq, seq),
            "snapshot_version": before.snapshot_version + 1 if changed else before.snapshot_version,
            "snapshot_at": entry.occurred_at if changed else before.snapshot_at,
        }
    )


def _trimmed(state: WorkingMemory) -> WorkingMemory:
    """The memory without what is older than the newest KEEP_RETIRED of each retired kind."""
    update: dict[str, object] = {}
    index = _FactIndex.of(state.known_facts)
    extra = len(index.superseded) - KEEP_RETIRED
    if extra > 0:  # the oldest superseded facts go
        facts, kept, start = state.known_facts, [], 0
        for at in sorted(map(index.position, index.superseded[:extra])):
            kept.append(facts[start:at])
            start = at + 1
        kept.append(facts[start:])
        update["known_facts"] = index.trimmed(sum(kept, ()), extra)
        update["facts_retired"] = state.facts_retired + extra
    if len(state.closed_problems) > KEEP_RETIRED:
        extra = len(state.closed_problems) - KEEP_RETIRED
        update["closed_problems"] = state.closed_problems[extra:]
        update["problems_retired"] = state.problems_retired + extra
    if len(state.unsupported_claims) > KEEP_RETIRED:
        extra = len(state.unsupported_claims) - KEEP_RETIRED
        update["unsupported_claims"] = state.unsupported_claims[extra:]
        update["claims_retired"] = state.claims_retired + extra
    return state.model_copy(update=update) if update else state


def _content(state: WorkingMemory) -> tuple[object, ...]:
    return tuple(getattr(state, name) for name in _CONTENT_FIELDS)


# --- the index of what exists ---------------------------------------------------------------


def _indexed(index: RunIndex, entry: LedgerEntry) -> RunIndex:
    if not model_visible(entry):
        return index.model_copy(
            update={"entries": index.entries.updated({entry.entry_id: "hidden"})}
        )
    # what this entry sets, read before the index (the index's maps are never changed)
    entries: dict[str, Outcome] = {entry.entry_id: _outcome(entry)}
    calls: dict[str, ToolCallStatus] = {}
    artifacts: dict[str, str] = {}
    for part in entry.parts:
        if not isinstance(part, _INDEXED_PARTS):  # (text, usage, ...: nothing to index)
            continue
        if isinstance(part, ToolCallPart | ToolResultPart):
            _index_call(index, calls, entries, part, entry.entry_id)
        for artifact_id in _artifact_ids(part):
            carrier = artifacts.get(artifact_id)
            if carrier is None:
                carrier = index.artifacts.get(artifact_id)
            if carrier is None or _more_telling(index, entries, entry.entry_id, carrier):
                artifacts[artifact_id] = entry.entry_id
    update: dict[str, object] = {"entries": index.entries.updated(entries)}
    if calls:
        update["tool_calls"] = index.tool_calls.updated(calls)
    if artifacts:
        update["artifacts"] = index.artifacts.updated(artifacts)
    return index.model_copy(update=update)


def _index_call(
    index: RunIndex,
    calls: dict[str, ToolCallStatus],
    entries: dict[str, Outcome],
    part: ToolCallPart | ToolResultPart,
    entry_id: str,
) -> None:
    """Sets in ``calls`` and ``entries`` (what the entry changes, read before ``index``) what
    a tool call's request or result says."""
    known = calls.get(part.tool_call_id)
    if known is None:
        known = index.tool_calls.get(part.tool_call_id, _NO_CALL)
    if isinstance(part, ToolCallPart):
        read_only = part.permission_class is PermissionClass.READ_ONLY
        known = known.model_copy(update={"request_entry_id": entry_id, "read_only": read_only})
        calls[part.tool_call_id] = known
        if known.status is not None:  # its result came first: both judged again
            entries[entry_id] = _call_outcome(known)
            if known.result_entry_id is not None:
                entries[known.result_entry_id] = _call_outcome(known)
        return
    if known.status is None:  # the first result counts, as in the next turn's pool
        known = known.model_copy(update={"status": part.status, "result_entry_id": entry_id})
        calls[part.tool_call_id] = known
    entries[entry_id] = _call_outcome(known)
    if known.request_entry_id is not None:
        entries[known.request_entry_id] = _call_outcome(known)


def _more_telling(
    index: RunIndex, entries: dict[str, Outcome], candidate: str, carrier: str
) -> bool:
    def outcome(entry_id: str) -> Outcome:
        found = entries.get(entry_id)
        if found is None:
            found = index.entries.get(entry_id)
        return "agent" if found is None else found

    return _TELLING[outcome(candidate)] > _TELLING[outcome(carrier)]


# The parts that name a tool call or carry an artifact (see _artifact_ids).
_INDEXED_PARTS = (ToolCallPart, ToolResultPart, DiffPart, VerificationPart, ArtifactRefPart)


def _artifact_ids(part: object) -> list[str]:
    if isinstance(part, ToolResultPart):
        return [ref.artifact_id for ref in part.artifact_refs]
    if isinstance(part, DiffPart):
        return [part.diff_artifact.artifact_id] if part.diff_artifact else []
    if isinstance(part, VerificationPart):
        return [part.diagnostics_ref.artifact_id] if part.diagnostics_ref else []
    return [part.artifact_id] if isinstance(part, ArtifactRefPart) else []


_AGENT_WORDS = {
    EntryKind.ASSISTANT_RESPONSE,
    EntryKind.AGENT_THOUGHT_SUMMARY,
    EntryKind.MEMORY_UPDATE_PROPOSED,
}


def _outcome(entry: LedgerEntry) -> Outcome:
    if entry.kind in _AGENT_WORDS:
        return "agent"
    if entry.kind is EntryKind.TOOL_CALL_REQUEST:
        return "pending"
    if entry.kind is EntryKind.ERROR_EVENT:
        return "failed"
    if entry.kind is EntryKind.RUN_FINISHED:
        return "succeeded" if entry.run_status is RunStatus.SUCCEEDED else "failed"
    results = {p.status for p in entry.parts if isinstance(p, ToolResultPart)}
    if results:
        if results <= {ToolResultStatus.SUCCEEDED}:
            return "succeeded"
        # an outcome the log did not record proves nothing either way
        return (
            "neutral"
            if results <= {ToolResultStatus.SUCCEEDED, ToolResultStatus.UNKNOWN}
            else "failed"
        )
    return _verification_outcome(entry)


def _verification_outcome(entry: LedgerEntry) -> Outcome:
    statuses = {p.status for p in entry.parts if isinstance(p, VerificationPart)}
    if statuses & {VerificationStatus.FAILED, VerificationStatus.ERROR}:
        return "failed"
    return "succeeded" if VerificationStatus.PASSED in statuses else "neutral"


def _call_outcome(call: ToolCallStatus) -> Outcome:
    """A tool call's outcome as evidence: a read that succeeded ("read") shows what exists,
    never that something works."""
    if call.status is None:
        return "pending"
    if call.status is ToolResultStatus.SUCCEEDED:
        return "read" if call.read_only else "succeeded"
    if call.status is ToolResultStatus.UNKNOWN:
        return "neutral"  # the outcome was not recorded (an imported log)
    return "failed"


# How much an outcome tells about an artifact that several entries carry; the highest wins.
_TELLING: dict[Outcome, int] = {
    "failed": 4,
    "pending": 3,
    "succeeded": 2,
    "read": 2,
    "neutral": 1,
    "agent": 0,
    "hidden": -1,
}


def _resolve(index: RunIndex, ref: str) -> Outcome | None:
    scheme, _, ident = ref.partition(":")
    if scheme == "entry":
        return index.entries.get(ident)
    if scheme == "tool-call":
        call = index.tool_calls.get(ident)
        return _call_outcome(call) if call is not None else None
    if scheme == "artifact" and ident in index.artifacts:
        return index.entries.get(index.artifacts[ident])
    return None


# --- judging evidence -----------------------------------------------------------------------


def _unresolved(index: RunIndex, refs: tuple[str, ...], seq: int) -> str | None:
    """Why the refs do not all resolve in this run before ``seq``, or None if they do."""
    if not refs:
        return "no evidence cited"
    missing = [ref for ref in refs if _resolve(index, ref) is None]
    if missing:
        return f"evidence does not resolve in this run before seq {seq}: {', '.join(missing)}"
    return None


def _unsupported_fact(index: RunIndex, text: str, refs: tuple[str, ...], seq: int) -> str | None:
    unresolved = _unresolved(index, refs, seq)
    if unresolved is not None:
        return unresolved
    # An entry the model cannot see exists, but shows it nothing: neutral evidence.
    outcomes = {ref: _neutral_if_hidden(_resolve(index, ref)) for ref in refs}
    seen = set(outcomes.values())
    if seen == {"agent"}:
        return "cites only the agent's own statements"
    polarity = _polarity(text)
    if polarity == "failure":
        against = [f"{ref} ({out})" for ref, out in outcomes.items() if out in _NOT_FAILED]
        if against and "failed" not in seen:
            return f"claims failure but its evidence shows otherwise: {', '.join(against)}"
        return None
    adverse = [f"{ref} ({out})" for ref, out in outcomes.items() if out in _NOT_SUCCEEDED]
    if adverse and polarity == "success":  # one failure defeats a success, whatever else it cites
        return f"claims success but its evidence shows otherwise: {', '.join(adverse)}"
    if adverse and not seen & {"succeeded", "read"}:
        return (
            "does not clearly claim a failure, yet its evidence failed or did not finish: "
            + ", ".join(adverse)
        )
    if polarity == "success" and "succeeded" not in seen:
        return (
            "claims success but cites no success (a succeeded tool call that is not a read, its "
            "output or a passing verifier)"
        )
    return None


def _neutral_if_hidden(outcome: Outcome | None) -> Outcome | None:
    return "neutral" if outcome == "hidden" else outcome


_NOT_SUCCEEDED = frozenset({"failed", "pending"})
_NOT_FAILED = frozenset({"succeeded", "read", "pending"})


_TOKEN = re.compile(r"[a-z0-9_]+")
_SUCCESS = frozenset({
    "pass", "passes", "passed", "passing", "succeed", "succeeds", "succeeded", "success",
    "successful", "successfully", "work", "works", "worked", "working", "fixed", "resolved",
    "green", "ok", "okay",
})  # fmt: skip
_FAILURE = frozenset({
    "fail", "fails", "failed", "failing", "failure", "failures", "error", "errors", "broken",
    "breaks", "crash", "crashes", "crashed", "red", "timeout", "timed",
})  # fmt: skip
_NEGATION = frozenset({
    "not", "no", "never", "cannot", "doesn", "don", "didn", "isn", "aren", "won", "nothing",
})  # fmt: skip
_FILLER = frozenset({
    "a", "an", "the", "all", "now", "still", "again", "is", "are", "was", "were", "be", "been",
    "it", "its", "this", "that", "of", "in", "on", "for", "to", "and", "or", "with", "after",
    "before", "latest", "do", "does", "did", "has", "have", "had", "check", "goal",
})  # fmt: skip
_NOT_SUBJECT = _SUCCESS | _FAILURE | _NEGATION | _FILLER


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.casefold())


def _normalized(text: str) -> str:
    """``text``'s words, lower case, one space apart: what makes two facts or decisions the same.

    Kept by text: each new fact is compared with every fact of the memory, and tokenizing them
    all again for each one made a run of 1,000/2,000/4,000 distinct passing checks (a fact
    each) fold in 4.1/11.7/36 s. (At most ``_NORMALIZED_CHARS`` characters of texts are kept;
    all are dropped at once past that.)"""
    found = _NORMALIZED.get(text)
    if found is None:
        if _NORMALIZED_SIZE[0] > _NORMALIZED_CHARS:
            _NORMALIZED.clear()
            _NORMALIZED_SIZE[0] = 0
        found = _NORMALIZED[text] = " ".join(_tokens(text))
        _NORMALIZED_SIZE[0] += len(text) + len(found)
    return found


_NORMALIZED: dict[str, str] = {}
_NORMALIZED_SIZE = [0]  # the characters of the texts kept, and of their normalized forms
_NORMALIZED_CHARS = 1 << 24


def _subject_key(text: str) -> str:
    """A fact's subject: its words without polarity, negation and filler ("tests pass" -> tests)."""
    subject = [t for t in _tokens(text) if t not in _NOT_SUBJECT]
    return " ".join(subject) or _normalized(text)


def _polarity(text: str) -> Polarity | None:
    words = set(_tokens(text))
    success, failure = bool(words & _SUCCESS), bool(words & _FAILURE)
    if success == failure:
        return None
    return "failure" if success == bool(words & _NEGATION) else "success"


# --- facts and problems ---------------------------------------------------------------------


def _merged(old: tuple[str, ...], new: Iterable[str]) -> tuple[str, ...]:
    return old + tuple(ref for ref in dict.fromkeys(new) if ref not in old)


def _with_fact(
    state: WorkingMemory,
    text: str,
    refs: tuple[str, ...],
    seq: int,
    source: Literal["proposal", "verifier"],
    key: str,
    also_about: Iterable[str] = (),
) -> WorkingMemory:
    """Add a fact (or merge its evidence into the same active fact); supersede older ones."""
    normalized = _normalized(text)
    index = _FactIndex.of(state.known_facts)
    alike = index.by_text.get(normalized)
    # (the first active fact of the same text)
    at = index.position(min(alike)) if alike else None
    same = None if at is None else state.known_facts[at]
    # (retired facts leave the memory: counted with it, no id is given twice)
    fact_id = same.fact_id if same else f"fact-{len(state.known_facts) + state.facts_retired + 1}"
    keys, by = {key, *also_about}, f"fact:{fact_id}"  # (made once, not once per fact)
    state = _superseding(state, keys, by, seq, keep=at)  # (positions stay)
    facts = state.known_facts
    if same is not None and at is not None:
        merged = same.model_copy(update={"evidence": _merged(same.evidence, refs)})
        facts = (*facts[:at], merged, *facts[at + 1 :])
    else:
        added = Fact(
            fact_id=fact_id, fact=text, evidence=refs, source=source, key=key, added_at_seq=seq
        )
        facts = (*facts, added)
    index = _FactIndex.of(state.known_facts)
    return state.model_copy(update={"known_facts": index.passed_on(facts, ())})


def _superseding(
    state: WorkingMemory, keys: set[str], by: str, seq: int, keep: int | None = None
) -> WorkingMemory:
    """The memory with its active facts about ``keys`` superseded ``by`` (but the one at
    position ``keep``)."""
    index = _FactIndex.of(state.known_facts)
    gone = [n for n in map(index.position, index.concerning(keys)) if n != keep]
    if not gone:
        return state
    facts = list(state.known_facts)
    for n in gone:
        facts[n] = _superseded(facts[n], keys, by, seq)
    superseded = [state.known_facts[n] for n in gone]
    return state.model_copy(update={"known_facts": index.passed_on(tuple(facts), superseded)})


def _superseded(fact: Fact, keys: set[str], by: str, seq: int) -> Fact:
    if fact.status != "active" or not _concerns(fact.key, keys):
        return fact
    return fact.model_copy(
        update={"status": "superseded", "superseded_by": by, "superseded_at_seq": seq}
    )


def _fact_number(fact: Fact) -> int:
    """N of a fact's id (``fact-N``): a memory's facts are in the order of their numbers (a new
    one is numbered after every fact the run has had)."""
    return int(fact.fact_id.removeprefix("fact-"))


class _FactIndex:
    """Which active facts of one ``known_facts`` tuple have a normalized text, a key, a word in
    their key (what :func:`_concerns` matches), by their numbers; and the superseded facts'
    numbers, in order.

    Each new fact was compared with every fact of the memory (its text, then whether it is
    about the new one's keys): a run of 4,000 distinct passing checks folded in 6.5 s, each
    fact costing time in proportion to the facts before it. An index belongs to one tuple
    (kept by its identity) and is handed on to the tuple a fold step makes of it (a fact
    superseded, changed or added: :meth:`passed_on`; the oldest superseded retired:
    :meth:`trimmed`); a tuple it was not handed to (reloaded, or folded again from an older
    state) gets one made anew: the same answers, in proportion to its facts. Facts are found
    by their numbers (a bisection of the tuple), which retiring facts does not change.
    """

    _KEPT: ClassVar[dict[int, _FactIndex]] = {}  # by id(facts) (held: the id stays its)
    _MOST: ClassVar[int] = 256

    def __init__(self, facts: tuple[Fact, ...]) -> None:
        self.facts = facts
        self.by_text: dict[str, set[int]] = {}
        self.by_key: dict[str, set[int]] = {}
        self.by_word: dict[str, set[int]] = {}
        self.superseded: list[int] = []
        numbers = list(map(_fact_number, facts))
        # (always, but for a document no fold of this version made: then found one by one)
        self.ordered = all(a < b for a, b in pairwise(numbers))
        for f in facts:
            self._add(f)

    @classmethod
    def of(cls, facts: tuple[Fact, ...]) -> _FactIndex:
        kept = cls._KEPT.get(id(facts))
        if kept is not None and kept.facts is facts:
            return kept
        return cls._keep(cls(facts))

    @classmethod
    def _keep(cls, index: _FactIndex) -> _FactIndex:
        if len(cls._KEPT) >= cls._MOST:
            cls._KEPT.pop(next(iter(cls._KEPT)))
        cls._KEPT[id(index.facts)] = index
        return index

    def position(self, number: int) -> int:
        """Where the fact numbered ``number`` is in the tuple."""
        if self.ordered:
            return bisect_left(self.facts, number, key=_fact_number)
        return next(n for n, f in enumerate(self.facts) if _fact_number(f) == number)

    def _add(self, f: Fact) -> None:
        n = _fact_number(f)
        if f.status != "active":
            insort(self.superseded, n)
            return
        self.by_text.setdefault(_normalized(f.fact), set()).add(n)
        self.by_key.setdefault(f.key, set()).add(n)
        for word in set(f.key.split()):
            self.by_word.setdefault(word, set()).add(n)

    def _remove(self, f: Fact) -> None:
        """``f``, active, is superseded."""
        n = _fact_number(f)
        self.by_text[_normalized(f.fact)].discard(n)
        self.by_key[f.key].discard(n)
        for word in set(f.key.split()):
            self.by_word[word].discard(n)
        insort(self.superseded, n)

    def concerning(self, keys: set[str]) -> list[int]:
        """The numbers of the active facts :func:`_concerns` says are about ``keys``."""
        found: set[int] = set()
        for k in keys:
            found |= self.by_key.get(k, set())
            if k and " " not in k and not k.startswith("check:"):
                found |= self.by_word.get(k, set())
        return sorted(found)

    def passed_on(self, facts: tuple[Fact, ...], superseded: Iterable[Fact]) -> tuple[Fact, ...]:
        """``facts``: this index's with ``superseded`` (active here) superseded, one fact
        changed in place or one appended; this index now theirs."""
        old = self.facts
        for f in superseded:
            self._remove(f)
        if len(facts) > len(old):
            self._add(facts[-1])
        return self._moved(old, facts)

    def trimmed(self, facts: tuple[Fact, ...], retired: int) -> tuple[Fact, ...]:
        """``facts``: this index's without its ``retired`` oldest superseded facts; this index
        now theirs."""
        del self.superseded[:retired]
        return self._moved(self.facts, facts)

    def _moved(self, old: tuple[Fact, ...], facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
        self._KEPT.pop(id(old), None)
        if self.ordered:  # (else not handed on: the next tuple's is made anew)
            self.facts = facts
            self._keep(self)
        return facts


def _with_problem(
    state: WorkingMemory,
    text: str,
    refs: tuple[str, ...],
    seq: int,
    source: Literal["proposal", "verifier"],
    key: str,
) -> WorkingMemory:
    """Open a problem, or add evidence to the open problem with the same key."""
    problems = list(state.open_problems)
    for i, problem in enumerate(problems):
        if problem.key == key:
            problems[i] = problem.model_copy(update={"evidence": _merged(problem.evidence, refs)})
            return state.model_copy(update={"open_problems": tuple(problems)})
    opened = Problem(problem=text, evidence=refs, opened_at_seq=seq, source=source, key=key)
    return state.model_copy(update={"open_problems": (*problems, opened)})


def _concerns(key: str, keys: set[str]) -> bool:
    """Whether a memory item with ``key`` is about one of ``keys``: the same key, or (for a
    check's test name, a single word like ``test_last_page``) a key that mentions it."""
    if key in keys:
        return True
    return any(
        k in key and k in key.split()  # (split only where it is in the key at all)
        for k in keys
        if k and " " not in k and not k.startswith("check:")
    )


def _closing(state: WorkingMemory, keys: set[str], by: str, seq: int) -> WorkingMemory:
    still = tuple(p for p in state.open_problems if not _concerns(p.key, keys))
    closed = tuple(
        p.model_copy(update={"closed_by": by, "closed_at_seq": seq})
        for p in state.open_problems
        if _concerns(p.key, keys)
    )
    if not closed:
        return state
    return state.model_copy(
        update={"open_problems": still, "closed_problems": state.closed_problems + closed}
    )


# --- handlers, one per entry kind that changes memory ---------------------------------------


def _task(state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    if "true" in (entry.metadata.get(INTERRUPTION_KEY), entry.metadata.get(AUTO_REPLY_KEY)):
        return state  # the user stopped the agent, or the harness answered for it: no goal
    if not may_instruct(entry):  # trust is never raised: untrusted text is not the task
        flag = f"task from entry {entry.entry_id} ignored: {entry.trust_level.value} cannot set it"
        return state.model_copy(update={"flags": (*state.flags, flag)})
    goal = _text(entry).strip()
    return state.model_copy(update={"task_goal": goal}) if goal else state


def _plan(state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    plan = entry.metadata.get("plan")
    if plan is None:
        return state
    return state.model_copy(update={"current_plan": _plan_steps(plan)})


_STEP = re.compile(r"\n|(?:^|\s)(?:\d+[.)]|[-*•])\s+")


def _plan_steps(plan: str) -> tuple[str, ...]:
    """A plan's steps: a JSON list of strings, or text numbered "1. 2." / bulleted / by line."""
    parsed = parse_json(plan)
    if isinstance(parsed, list) and all(isinstance(step, str) for step in parsed):
        steps = (storable(step).strip() for step in parsed)
        return tuple(step for step in steps if step)
    body = re.sub(r"^\s*plan\s*:\s*", "", plan, flags=re.IGNORECASE)
    steps = (step.strip(" \t;,") for step in _STEP.split(body))
    return tuple(step for step in steps if step)


def _diff(state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    index = state.index
    changed = _SortedEdit(index.changed_files)
    created = _SortedEdit(index.created_files)
    for part in entry.parts:
        if isinstance(part, DiffPart):
            for file in part.files:
                _apply_file_change(changed, created, file)
    every = changed.result()
    seq = entry.sequence_no
    file_changes = index.file_changes.updated({path: seq for path in changed.touched})
    recent = _recent(index.recent_files, changed, every, file_changes)
    index = index.model_copy(
        update={
            "created_files": created.result(),
            "changed_files": every,
            "file_changes": file_changes,
            "recent_files": recent,
        }
    )
    shown = every if len(every) <= CHANGED_FILES_SHOWN else tuple(sorted(recent))
    return state.model_copy(
        update={"changed_files": shown, "changed_files_total": len(every), "index": index}
    )


def _recent(
    before: tuple[str, ...],
    changed: _SortedEdit,
    every: tuple[str, ...],
    file_changes: Layered[str, int],
) -> tuple[str, ...]:
    """The newest CHANGED_FILES_SHOWN changed files by their last change (the newest last):
    ``before``'s still changed and not changed again, then the diff's in the order of their
    last change. A file the run created and removed again leaves it; once fewer than half
    the files it should list are left, the newest of the others (by the entry that changed
    them last, the path after it) fill it again: every file outside it is older than every
    file in it. (Filling at half, not at each removal, keeps a run deleting its own files one
    diff at a time linear: a fill scans all of the run's files.)"""
    touched = changed.touched
    if not touched and not changed.removed:
        return before
    again = set(touched)
    kept = [path for path in before if path not in again and path in changed]
    last = list(reversed(dict.fromkeys(reversed(touched))))  # each once, at its last change
    recent = [*kept, *(path for path in last if path in changed)][-CHANGED_FILES_SHOWN:]
    wanted = min(CHANGED_FILES_SHOWN, len(every))
    if len(recent) * 2 < wanted:
        listed = set(recent)

        def last_change(path: str) -> tuple[int, str]:
            return file_changes.get(path, 0), path

        older = heapq.nlargest(
            wanted - len(recent), (p for p in every if p not in listed), key=last_change
        )
        recent[:0] = sorted(older, key=last_change)
    return tuple(recent)


class _SortedEdit:
    """Edits of a sorted tuple of distinct paths, made as a set's (``in``, ``add``,
    ``discard``), and the sorted tuple they leave: membership by binary search, the edits kept
    apart and merged in once. A diff touches a few files of the run's many: making a set of
    them all and sorting it again each time cost O(F log F) a diff (a run creating 4,000 files
    one diff at a time: 2.7 s of working-memory fold, 4.7x the time of 2,000)."""

    __slots__ = ("added", "items", "removed", "touched")

    def __init__(self, items: tuple[str, ...]) -> None:
        self.items = items
        self.added: set[str] = set()
        self.removed: set[str] = set()
        self.touched: list[str] = []  # every path given to add, in order (the files changed)

    def __contains__(self, path: str) -> bool:
        if path in self.added:
            return True
        if path in self.removed:
            return False
        at = bisect_left(self.items, path)
        return at < len(self.items) and self.items[at] == path

    def add(self, path: str) -> None:
        self.touched.append(path)
        if path in self:
            return
        if path in self.removed:
            self.removed.discard(path)  # (one of the items again)
        else:
            self.added.add(path)

    def discard(self, path: str) -> None:
        if path not in self:
            return
        if path in self.added:
            self.added.discard(path)
        else:
            self.removed.add(path)

    def result(self) -> tuple[str, ...]:
        """The sorted tuple after the edits (the same tuple when they changed nothing)."""
        if not self.added and not self.removed:
            return self.items
        kept = [p for p in self.items if p not in self.removed] if self.removed else self.items
        # two sorted runs one after the other: Timsort finds them and merges them in one pass
        return tuple(sorted([*kept, *sorted(self.added)]))


def _apply_file_change(changed: _SortedEdit, created: _SortedEdit, file: DiffFile) -> None:
    if file.status is FileChangeStatus.RENAMED and file.old_path:
        born_here = _removed(changed, created, file.old_path)
        if born_here:
            created.add(file.path)
        changed.add(file.path)
    elif file.status is FileChangeStatus.DELETED:
        _removed(changed, created, file.path)
    else:
        if file.status is FileChangeStatus.ADDED and file.path not in changed:
            created.add(file.path)
        changed.add(file.path)


def _removed(changed: _SortedEdit, created: _SortedEdit, path: str) -> bool:
    """A path leaves the tree: no change is left if the run created it, else it is a deletion."""
    if path in created:
        created.discard(path)
        changed.discard(path)
        return True
    changed.add(path)
    return False


def _verification(state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    for part in entry.parts:
        if isinstance(part, VerificationPart):
            state = _verified(state, entry, part)
    return state


def _verified(state: WorkingMemory, entry: LedgerEntry, part: VerificationPart) -> WorkingMemory:
    check = part.check_id or f"{part.verifier}/{part.profile}"
    key = f"check:{check}"
    about = _check_keys(check)
    ref, seq = f"entry:{entry.entry_id}", entry.sequence_no
    label = f"{check} ({part.verifier}/{part.profile})"
    if part.status is VerificationStatus.PASSED:
        state = _closing(state, about, ref, seq)
        return _with_fact(state, f"{label} passed", (ref,), seq, "verifier", key, about)
    if part.status in (VerificationStatus.FAILED, VerificationStatus.ERROR):
        state = _superseding(state, about, ref, seq)
        verb = "failed" if part.status is VerificationStatus.FAILED else "errored"
        return _with_problem(state, f"{label} {verb}", (ref,), seq, "verifier", key)
    return state


def _check_keys(check: str) -> set[str]:
    """Keys of memory items about a check: its own, its full name, its short (test) name."""
    return {f"check:{check}", _subject_key(check), _subject_key(_short_name(check))}


def _short_name(check: str) -> str:
    return re.split(r"::|#", check)[-1]


def _proposal(state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    for part in entry.parts:
        if isinstance(part, MemoryProposalPart):
            state = _proposed(state, part, entry)
    return state


def _proposed(state: WorkingMemory, part: MemoryProposalPart, entry: LedgerEntry) -> WorkingMemory:
    seq, by = entry.sequence_no, f"entry:{entry.entry_id}"
    for fact in part.facts:
        refs = fact.evidence_refs
        why = _unsupported_fact(state.index, fact.fact, refs, seq)
        key = _subject_key(fact.fact)
        if why:
            state = _rejected(state, fact.fact, "fact", why, refs, seq)
        elif _polarity(fact.fact) == "failure":
            # A failure is a problem to solve, not a fact to rely on; what it contradicts goes.
            state = _superseding(state, {key}, by, seq)
            state = _with_problem(state, fact.fact, refs, seq, "proposal", key)
        else:
            state = _with_fact(state, fact.fact, refs, seq, "proposal", key)
            if _polarity(fact.fact) == "success":  # backed by a success: the problem is solved
                state = _closing(state, {key}, by, seq)
    for problem in part.problems:
        refs = problem.evidence_refs
        why = _unresolved(state.index, refs, seq)
        key = _subject_key(problem.problem)
        state = (
            _rejected(state, problem.problem, "problem", why, refs, seq)
            if why
            else _with_problem(state, problem.problem, refs, seq, "proposal", key)
        )
    for decision in part.decisions:
        refs = decision.evidence_refs
        why = _unresolved(state.index, refs, seq)
        state = (
            _rejected(state, decision.decision, "decision", why, refs, seq)
            if why
            else _decided(state, decision.decision, decision.reason, refs, seq)
        )
    return state


def _rejected(
    state: WorkingMemory,
    claim: str,
    kind: Literal["fact", "problem", "decision"],
    reason: str,
    refs: tuple[str, ...],
    seq: int,
) -> WorkingMemory:
    rejected = UnsupportedClaim(
        claim=claim, kind=kind, reason=reason, evidence=refs, proposed_at_seq=seq
    )
    return state.model_copy(update={"unsupported_claims": (*state.unsupported_claims, rejected)})


def _decided(
    state: WorkingMemory, decision: str, reason: str, refs: tuple[str, ...], seq: int
) -> WorkingMemory:
    normalized = _normalized(decision)
    if any(_normalized(d.decision) == normalized for d in state.decisions):
        return state
    made = Decision(decision=decision, reason=reason, evidence=refs, decided_at_seq=seq)
    return state.model_copy(update={"decisions": (*state.decisions, made)})


def _compaction(state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    """A summary must keep the goal and every open problem; flag what it drops."""
    where = f"compaction {entry.entry_id} (seq {entry.sequence_no})"
    summary = _text(entry, with_json=True)
    if not summary.strip():
        dropped = [f"{where}: summary is not inline, goal and open problems unverified"]
    else:
        words = set(_tokens(summary))
        goal = state.task_goal
        dropped = [f"{where} drops the task goal"] if goal and not _mentioned(goal, words) else []
        dropped += [
            f"{where} drops open problem: {p.problem}"
            for p in state.open_problems
            if not set(_problem_words(p)) <= words
        ]
        dropped += [
            f"{where} claims open problem solved: {p.problem}"
            for p in state.open_problems
            if _claims_solved(summary, _problem_words(p))
        ]
        dropped += [
            f"{where} adds a requirement the task does not state: {sentence[:120]}"
            for sentence in _new_requirements(summary, state)
        ]
    return state.model_copy(update={"flags": state.flags + tuple(dropped)}) if dropped else state


_SENTENCE = re.compile(r"[^.!?\n;]+")
_REQUIREMENT = frozenset({"must", "should", "required", "requires", "require", "requirement",
                          "requirements", "mandatory", "need", "needs", "shall"})  # fmt: skip


def _claims_solved(summary: str, subject: list[str]) -> bool:
    """Whether a sentence of the summary mentions the problem's subject as a success."""
    wanted = set(subject)
    return bool(wanted) and any(
        wanted <= set(_tokens(s)) and _polarity(s) == "success" for s in _SENTENCE.findall(summary)
    )


def _new_requirements(summary: str, state: WorkingMemory) -> list[str]:
    """Sentences stating a requirement whose subject words are mostly new to the task, the plan,
    the problems and the facts: a summary may compress the task, not add to it."""
    known = set(_tokens(state.task_goal or ""))
    for text in (*state.current_plan, *(p.problem for p in state.open_problems)):
        known |= set(_tokens(text))
    for fact in state.active_facts():
        known |= set(_tokens(fact.fact))
    found = []
    for sentence in _SENTENCE.findall(summary):
        words = _tokens(sentence)
        if not _REQUIREMENT & set(words):
            continue
        subject = {w for w in words if w not in _NOT_SUBJECT and w not in _REQUIREMENT}
        if subject and len(subject - known) * 2 > len(subject):  # mostly words never used
            found.append(sentence.strip())
    return found


def _mentioned(goal: str, words: set[str]) -> bool:
    return {t for t in _tokens(goal) if t not in _FILLER} <= words


def _problem_words(problem: Problem) -> list[str]:
    if problem.key.startswith("check:"):
        return _tokens(_short_name(problem.key.removeprefix("check:")))
    return problem.key.split()


def _approval_request(state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    what = entry.metadata.get("action") or _text(entry).strip() or entry.entry_id
    blocker = Blocker(
        kind="approval-pending",
        blocker=f"awaiting approval: {what}",
        evidence=f"entry:{entry.entry_id}",
        since_seq=entry.sequence_no,
    )
    return state.model_copy(update={"blocked_by": (*state.blocked_by, blocker)})


def _approval_decision(state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    pending = [b for b in state.blocked_by if b.kind == "approval-pending"]
    parent = f"entry:{entry.causation.parent_entry_id}"
    answered = next((b for b in pending if b.evidence == parent), pending[0] if pending else None)
    blockers = tuple(b for b in state.blocked_by if b is not answered)
    if approval_decision(entry) == "REJECTED":
        what = answered.blocker.removeprefix("awaiting approval: ") if answered else "request"
        rejected = Blocker(
            kind="approval-rejected",
            blocker=f"approval rejected: {what}",
            evidence=f"entry:{entry.entry_id}",
            since_seq=entry.sequence_no,
        )
        blockers = (*blockers, rejected)
    return state.model_copy(update={"blocked_by": blockers})


def _error(state: WorkingMemory, entry: LedgerEntry) -> WorkingMemory:
    denials = [
        Blocker(
            kind="policy-denied",
            blocker=f"policy denied: {part.message}",
            evidence=f"entry:{entry.entry_id}",
            since_seq=entry.sequence_no,
        )
        for part in entry.parts
        if isinstance(part, ErrorPart) and part.category.startswith("policy")
    ]
    return state.model_copy(update={"blocked_by": (*state.blocked_by, *denials)})


def _text(entry: LedgerEntry, with_json: bool = False) -> str:
    texts = [p.text for p in entry.parts if isinstance(p, TextPart)]
    if with_json:
        texts += [p.json_text for p in entry.parts if isinstance(p, JsonPart)]
    return "\n".join(texts)


_HANDLERS: dict[EntryKind, Callable[[WorkingMemory, LedgerEntry], WorkingMemory]] = {
    EntryKind.USER_TASK: _task,
    EntryKind.ASSISTANT_RESPONSE: _plan,
    EntryKind.DIFF_SNAPSHOT: _diff,
    EntryKind.DIFF_OBSERVATION: _diff,
    EntryKind.VERIFIER_RESULT: _verification,
    EntryKind.MEMORY_UPDATE_PROPOSED: _proposal,
    EntryKind.COMPACTION: _compaction,
    EntryKind.APPROVAL_REQUEST: _approval_request,
    EntryKind.APPROVAL_DECISION: _approval_decision,
    EntryKind.ERROR_EVENT: _error,
}
