"""Diff timelines: per run, how the patch evolved, what looks wrong with it, and the timeline.

One state per run, a pure fold. Each ``DIFF_SNAPSHOT`` is the change made by one step (the
simulator's snapshots are deltas: a scratch file shows up ADDED in one snapshot and DELETED in
the next), so a file's history is the sequence of its edits across snapshots. The state holds:

* **Snapshots** in sequence order: files with status, lines and classification, the diff artifact,
  and the flags the snapshot raised. ``DIFF_OBSERVATION`` (a diff the agent looked at) is not one.
* **Per-file churn**, keyed by path: every edit, times edited, lines added/deleted in total and the
  *net status*, what the run's final diff shows for the file (None: no net change). A rename moves
  the record, edits and all, to the new path.
* **Flags**, one per (kind, path); a later occurrence adds its evidence and updates the reason:

  - ``overreach``: an edit reverts an earlier edit of the same file in this run: (a) a file ADDED
    and later DELETED (every edit from the add to the delete is reverted); (b) a file DELETED and
    later ADDED back; (c) a MODIFIED edit whose lines are the mirror of an earlier, not yet
    reverted MODIFIED edit (added == its deleted, deleted == its added, not both 0): the counts of
    the inverse patch, as ``git revert`` or an undo yields (the patch artifact itself is not read);
    (d) a file RENAMED back to the path it was renamed from.
  - ``churn``: a file edited ``churn_threshold`` or more times (renames carry the count along).
  - ``verifier-gaming``: a TEST file in a snapshot while the run's latest check is failing. Checks
    are ``VERIFIER_RESULT`` entries (any FAILED or ERROR part fails, else any PASSED passes) and
    results of tools whose name matches ``test_tool_pattern`` (FAILED or TIMED_OUT fails,
    SUCCEEDED passes); other outcomes leave the latest check as it was.
  - ``generated-edit``: a GENERATED file in a snapshot, whatever its status.
  - ``out-of-scope``: a path (or a rename's old path) under no scope entry, when the task gives
    one: ``metadata["scope"]`` of ``RUN_STARTED`` or ``USER_TASK`` (the latest wins), directories
    or files separated by commas or spaces, matched by whole path segments (``src/api`` covers
    ``src/api/x.py``, not ``src/api_v2/x.py``). Snapshots are judged by the scope known when
    folded.

* **A summary** of the final diff: files touched and files with a net change, lines added and
  deleted (summed over every snapshot, so reverted work counts), the same by classification (a
  file's latest), and net-changed files by net status.
* **Timeline rows** for ``agentledger timeline RUN_ID`` (seed 003 §16), one per step: lifecycle,
  task (and every later user message), plan, assistant response, tool (the request's row is
  completed in place by its result), model call (repeated reports of one provider response are
  dropped; ``cost_usd`` is left for the cost projection), diff, verifier, judge, approval, error,
  compaction, summary. Each row has seq, time, kind, a one-line summary, the whole text the
  summary shortens (``text``), and a drill-down reference (entry id, artifact id); no tool output.

Entries of other runs and sequence numbers at or below the last folded one leave the state alone.
The state keeps the newest 64 rows and 8 snapshots; every row (once final) and snapshot is a
history row, written once, so a long run's state and its per-batch writes stay bounded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from operator import itemgetter
from typing import Any, Literal, assert_never

from pydantic import BaseModel, ConfigDict

from projectors.base import (
    HistoryRow,
    ModelProjection,
    QuickCopy,
    approval_decision,
    json_object,
    metadata_count,
    new_calls,
    parse_json,
    storable,
)
from schemas.models import (
    ArtifactRef,
    ArtifactRefPart,
    DiffFile,
    DiffPart,
    EntryKind,
    ErrorPart,
    FileChangeStatus,
    FileClassification,
    LedgerEntry,
    ModelCallStatus,
    ModelUsagePart,
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

FlagKind = Literal["overreach", "churn", "verifier-gaming", "generated-edit", "out-of-scope"]
RowKind = Literal[
    "lifecycle",
    "task",
    "plan",
    "assistant",
    "tool",
    "model-call",
    "diff",
    "verifier",
    "judge",
    "approval",
    "error",
    "compaction",
    "summary",
]
Detail = dict[str, str | int | float | None]

S = FileChangeStatus
# The text of each member of the enums rows show (``.value`` costs ~5x a look-up; members of two
# enums with the same text are equal keys, of the same value).
_TEXT: dict[StrEnum, str] = {
    m: m.value
    for e in (
        FileChangeStatus,
        FileClassification,
        ModelCallStatus,
        PermissionClass,
        ToolResultStatus,
    )
    for m in e
}
SCOPE_KEY = "scope"
# RUN_STARTED metadata of an imported run whose log keeps no times ("unknown: ..."): its
# entries carry a stand-in time (the file's modification time), never shown as the run's
TIME_KEY = "import.time"


def untimed(note: object) -> bool:
    """Whether a RUN_STARTED's ``TIME_KEY`` note says the log keeps no times."""
    return isinstance(note, str) and note.startswith("unknown")


SUMMARY_CHARS = 100
_SCOPE_SPLIT = re.compile(r"[,\s]+")
# Worst first: the status a row with several verification parts shows.
_VERIFICATION_ORDER = (
    VerificationStatus.ERROR,
    VerificationStatus.FAILED,
    VerificationStatus.UNKNOWN,
    VerificationStatus.SKIPPED,
    VerificationStatus.PASSED,
)


class _Frozen(QuickCopy, BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Evidence(_Frozen):
    seq: int
    entry_id: str


class FileEdit(_Frozen):
    """One file of one snapshot, as part of that file's history."""

    seq: int
    entry_id: str
    status: FileChangeStatus
    lines_added: int
    lines_deleted: int
    reverted: bool = False


class FileChurn(_Frozen):
    """A file's edits in this run; ``net_status`` None means no net change."""

    path: str
    classification: FileClassification
    times_edited: int
    lines_added: int
    lines_deleted: int
    net_status: FileChangeStatus | None
    renamed_from: str | None = None
    edits: tuple[FileEdit, ...]


class DiffSnapshot(_Frozen):
    seq: int
    entry_id: str
    occurred_at: UtcDatetime
    files: tuple[DiffFile, ...]
    lines_added: int
    lines_deleted: int
    diff_artifact: ArtifactRef | None = None
    base_sha: str | None = None
    workspace_tree_hash: str | None = None
    flags: tuple[FlagKind, ...] = ()  # raised or extended by this snapshot


class DiffFlag(_Frozen):
    kind: FlagKind
    path: str
    reason: str
    # in sequence order: the first FLAG_EVIDENCE_FIRST and the newest of at most
    # FLAG_EVIDENCE_KEPT (a file edited 500 times keeps its flag's size)
    evidence: tuple[Evidence, ...]
    raised_at_seq: int
    evidence_total: int = 0  # evidence items seen, kept or not (0: as many as kept)


class ClassTotals(_Frozen):
    files_touched: int = 0
    files_changed: int = 0
    lines_added: int = 0
    lines_deleted: int = 0


class DiffSummary(_Frozen):
    snapshots: int = 0
    files_touched: int = 0
    files_changed: int = 0  # with a net change
    lines_added: int = 0
    lines_deleted: int = 0
    by_classification: dict[str, ClassTotals] = {}
    by_status: dict[str, int] = {}  # net status -> files


class TimelineRow(_Frozen):
    seq: int
    occurred_at: UtcDatetime
    kind: RowKind
    summary: str  # one line, at most SUMMARY_CHARS
    entry_id: str
    artifact_id: str | None = None
    status: str | None = None
    detail: Detail = {}
    text: str | None = None  # the whole text the summary shortens (None: the summary is all)


class OpenCall(_Frozen):
    """A tool call awaiting its result: its timeline row's number in the run, and the row."""

    row: int
    tool_name: str
    started_at: UtcDatetime
    finished_at: UtcDatetime | None = None
    request: TimelineRow | None = None


class DiffTimeline(_Frozen):
    run_id: str
    fleet_id: str
    last_seq: int = 0
    scope: tuple[str, ...] = ()
    status: RunStatus | None = None
    # The newest KEEP_SNAPSHOTS snapshots and KEEP_ROWS timeline rows: every snapshot is a
    # history row ("diff"), and so is every timeline row once final ("row", keyed by its
    # number in the run; a tool call's row is final with its result). Readers take the rows
    # from history, and the rows of calls still open from ``open_calls``.
    snapshots: tuple[DiffSnapshot, ...] = ()
    files: dict[str, FileChurn] = {}
    flags: tuple[DiffFlag, ...] = ()
    summary: DiffSummary = DiffSummary()
    rows: tuple[TimelineRow, ...] = ()
    rows_total: int = 0  # rows in the run so far
    finalized: tuple[tuple[int, TimelineRow], ...] = ()  # (number, row) final at the last entry
    failing_check: Evidence | None = None  # the latest check, while it is failing
    # the repository the run's first lifecycle row names (a run-started entry's metadata, as
    # the timeline header reads it), None if none; ``lifecycle``: that row has been made
    repository: str | None = None
    lifecycle: bool = False
    open_calls: dict[str, OpenCall] = {}
    # provider response id -> seq of its row, for the newest KEEP_RESPONSES responses
    model_responses: dict[str, int] = {}


_FOLDED = frozenset(
    {
        EntryKind.RUN_STARTED,
        EntryKind.RUN_FINISHED,
        EntryKind.RUN_SUMMARY,
        EntryKind.USER_TASK,
        EntryKind.ASSISTANT_RESPONSE,
        EntryKind.TOOL_CALL_REQUEST,
        EntryKind.TOOL_CALL_RESULT,
        EntryKind.MODEL_CALL,
        EntryKind.DIFF_SNAPSHOT,
        EntryKind.VERIFIER_RESULT,
        EntryKind.JUDGE_RESULT,
        EntryKind.APPROVAL_REQUEST,
        EntryKind.APPROVAL_DECISION,
        EntryKind.ERROR_EVENT,
        EntryKind.COMPACTION,
    }
)


class DiffTimelinesProjection(ModelProjection[DiffTimeline]):
    name = "diff-timelines"
    # 2: a flag keeps at most 16 evidence items (and counts them all); the state keeps the
    # newest rows and snapshots, all of them are history rows
    # 3: rows keep the whole text their summary shortens; assistant responses are rows
    # 4: approval decisions read as every projection reads them (DENIED is REJECTED)
    # 5: the state says the run's repository (its first run-started entry's), for the runs list
    # 6: a run-started row keeps the importer's note that the run's times are unknown
    version = 6
    hot = False
    state_type = DiffTimeline
    unbounded = ("rows", "snapshots", "files", "model_responses", "open_calls", "finalized")

    def __init__(self, churn_threshold: int = 3, test_tool_pattern: str = r"test") -> None:
        if churn_threshold < 1:
            raise ValueError(f"churn_threshold must be at least 1, not {churn_threshold}")
        self.churn_threshold = churn_threshold
        self._test_tool = re.compile(test_tool_pattern, re.IGNORECASE)

    def accepts(self, entry: LedgerEntry) -> bool:
        return entry.kind in _FOLDED

    def initial(self, entry: LedgerEntry) -> DiffTimeline:
        return DiffTimeline(run_id=entry.run_id, fleet_id=entry.fleet_id)

    def history(
        self, before: DiffTimeline | None, after: DiffTimeline, entry: LedgerEntry
    ) -> list[HistoryRow]:
        """One row per snapshot, so SQL can query snapshots across runs without the state, and
        one per timeline row once it is final."""
        if before is after:
            return []
        # (each document as JSON: pydantic's to_json is orjson's of model_dump(mode="json"))
        out = [
            HistoryRow("row", f"{n:08d}", row.seq, json=row.__pydantic_serializer__.to_json(row))
            for n, row in after.finalized
        ]
        made = after.summary.snapshots - (before.summary.snapshots if before is not None else 0)
        if entry.kind is EntryKind.DIFF_SNAPSHOT and made > 0 and after.snapshots:
            snap = after.snapshots[-1]
            json = snap.__pydantic_serializer__.to_json(snap)
            out.append(HistoryRow("diff", snap.entry_id, snap.seq, json=json))
        return out

    def fold(self, state: DiffTimeline, entry: LedgerEntry) -> DiffTimeline:
        if entry.run_id != state.run_id or entry.sequence_no <= state.last_seq:
            return state
        update = self._update(state, entry)
        update["last_seq"] = entry.sequence_no
        return _settled(state, update)

    def _update(self, state: DiffTimeline, entry: LedgerEntry) -> dict[str, object]:
        kind = entry.kind
        match kind:  # the commonest first
            case EntryKind.MODEL_CALL:
                return _model_called(state, entry)
            case EntryKind.ASSISTANT_RESPONSE:
                plan = "plan" in entry.metadata
                return _rows(state, _plan_row(entry) if plan else _assistant_row(entry))
            case EntryKind.TOOL_CALL_REQUEST:
                return _tool_requested(state, entry)
            case EntryKind.TOOL_CALL_RESULT:
                return self._tool_result(state, entry)
            case EntryKind.DIFF_SNAPSHOT:
                return self._snapshot(state, entry)
            case EntryKind.RUN_STARTED | EntryKind.USER_TASK:
                return _started(state, entry)
            case EntryKind.RUN_FINISHED:
                return _finished(state, entry)
            case EntryKind.RUN_SUMMARY:
                text = _text(entry)
                row = _row(entry, "summary", _clip(text or "run summary"), text=_whole(text))
                return _rows(state, row)
            case EntryKind.VERIFIER_RESULT:
                return _verified(state, entry)
            case EntryKind.JUDGE_RESULT:
                return _rows(state, _verification_row(entry, "judge"))
            case EntryKind.APPROVAL_REQUEST | EntryKind.APPROVAL_DECISION:
                return _rows(state, _approval_row(entry))
            case EntryKind.ERROR_EVENT:
                return _rows(state, *_error_rows(entry))
            case EntryKind.COMPACTION:
                return _rows(state, _compaction_row(entry))
            case (
                EntryKind.SYSTEM_INSTRUCTION
                | EntryKind.DEVELOPER_INSTRUCTION
                | EntryKind.ORG_POLICY
                | EntryKind.REPOSITORY_INSTRUCTION
                | EntryKind.AGENT_THOUGHT_SUMMARY
                | EntryKind.FILE_OBSERVATION
                | EntryKind.DIFF_OBSERVATION
                | EntryKind.CONTEXT_PROJECTED
                | EntryKind.MEMORY_UPDATE_PROPOSED
                | EntryKind.ARTIFACT_STORED
                | EntryKind.UNKNOWN
            ):
                return {}  # not a step of the timeline (model calls carry their context's id)
            case _:
                assert_never(kind)

    # --- tool results and checks --------------------------------------------------------------

    def _tool_result(self, state: DiffTimeline, entry: LedgerEntry) -> dict[str, object]:
        rows = list(state.rows)
        base = _first_row_number(state)
        late: list[tuple[int, TimelineRow]] = []  # rows of calls no longer in the window
        window: list[tuple[int, TimelineRow]] = []  # rows of calls in it
        calls = dict(state.open_calls)
        failing = state.failing_check
        for part in entry.parts:
            if not isinstance(part, ToolResultPart):
                continue
            call = calls.pop(part.tool_call_id, None)
            if call is None:
                rows.append(_result_row(entry, part, None, None))
                continue
            at = call.row - base
            kept = 0 <= at < len(rows)
            row = _result_row(entry, part, call, rows[at] if kept else call.request)
            if kept:
                rows[at] = row
                if at < len(state.rows):
                    window.append((call.row, row))
            else:
                late.append((call.row, row))
            if self._test_tool.search(call.tool_name):
                failing = _after_test_tool(failing, part.status, entry)
        window.sort(key=_number)
        return {
            "rows": tuple(rows),
            "open_calls": calls,
            "failing_check": failing,
            "finalized": (*late, *window),
        }

    # --- diff snapshots -----------------------------------------------------------------------

    def _snapshot(self, state: DiffTimeline, entry: LedgerEntry) -> dict[str, object]:
        diffs = [p for p in entry.parts if isinstance(p, DiffPart)]
        files = tuple(f for d in diffs for f in d.files)
        at = Evidence.made(seq=entry.sequence_no, entry_id=entry.entry_id)
        churn = dict(state.files)
        book = _FlagBook(state.flags, entry.sequence_no)
        for f in files:
            record = self._edited(churn, book, f, at)
            self._judge(state, book, f, record, at)
        snap = _snapshot_of(entry, diffs, files, tuple(dict.fromkeys(book.raised)))
        count = state.summary.snapshots + 1
        return {
            "snapshots": (*state.snapshots, snap)[-KEEP_SNAPSHOTS:],
            "files": churn,
            "flags": book.flags(),
            "summary": _summary(churn, count),
            "rows": (*state.rows, _diff_row(entry, snap, count)),
        }

    def _edited(
        self, churn: dict[str, FileChurn], book: _FlagBook, f: DiffFile, at: Evidence
    ) -> FileChurn:
        record, undone, why = _churned(churn, f, at)
        churn[f.path] = record
        if undone:
            book.flag("overreach", f.path, why, (*undone, at))
        if record.times_edited >= self.churn_threshold:
            reason = (
                f"edited {record.times_edited} times (threshold {self.churn_threshold}), "
                f"+{record.lines_added} -{record.lines_deleted} lines in total"
            )
            book.flag("churn", f.path, reason, record.edits)
        return record

    def _judge(
        self, state: DiffTimeline, book: _FlagBook, f: DiffFile, record: FileChurn, at: Evidence
    ) -> None:
        failing = state.failing_check
        status = _TEXT[f.status].lower()
        if f.classification is FileClassification.TEST and failing is not None:
            reason = (
                f"test file {status} at seq {at.seq} after a failing check at seq {failing.seq}"
            )
            book.flag("verifier-gaming", f.path, reason, (failing, at))
        if f.classification is FileClassification.GENERATED:
            reason = f"generated file {status} at seq {at.seq}; change its source and regenerate"
            book.flag("generated-edit", f.path, reason, (at,))
        if state.scope:
            for path in (f.path, f.old_path):
                if path is not None and not _in_scope(path, state.scope):
                    reason = f"{path} is outside the task scope ({', '.join(state.scope)})"
                    book.flag("out-of-scope", path, reason, (at,))


# --- flags --------------------------------------------------------------------------------------


FLAG_EVIDENCE_KEPT = 16
FLAG_EVIDENCE_FIRST = 2


class _FlagBook:
    """The flags of one fold call: one per (kind, path), new evidence merged in."""

    def __init__(self, flags: tuple[DiffFlag, ...], seq: int) -> None:
        self._flags = {(f.kind, f.path): f for f in flags}
        self._seq = seq
        self.raised: list[FlagKind] = []

    def flag(
        self, kind: FlagKind, path: str, reason: str, shown: Sequence[Evidence | FileEdit]
    ) -> None:
        """Raise or extend a flag with the entries that show it (edits are made evidence only
        when the flag keeps them)."""
        old = self._flags.get((kind, path))
        total = len({e.seq for e in shown})
        kept: Sequence[Evidence | FileEdit] = shown
        known: dict[int, Evidence] = {}
        if old is not None:
            known = {e.seq: e for e in old.evidence}
            merged = {**known, **{e.seq: e for e in shown}}
            newest_known = max(known, default=0)
            later = sum(1 for seq in merged if seq > newest_known)  # the middle was counted
            total = (old.evidence_total or len(old.evidence)) + later
            kept = [merged[seq] for seq in sorted(merged)]
        if len(kept) > FLAG_EVIDENCE_KEPT:
            newest = FLAG_EVIDENCE_KEPT - FLAG_EVIDENCE_FIRST
            kept = [*kept[:FLAG_EVIDENCE_FIRST], *kept[-newest:]]
        evidence = tuple(_as_evidence(e, known) for e in kept)
        self._flags[(kind, path)] = DiffFlag.made(
            kind=kind,
            path=path,
            reason=reason,
            evidence=evidence,
            raised_at_seq=old.raised_at_seq if old is not None else self._seq,
            evidence_total=total if total > len(evidence) else 0,
        )
        self.raised.append(kind)

    def flags(self) -> tuple[DiffFlag, ...]:
        return tuple(self._flags.values())


def _as_evidence(e: Evidence | FileEdit, known: dict[int, Evidence]) -> Evidence:
    """``e`` as evidence: the flag's own when it holds the same, else made."""
    if isinstance(e, Evidence):
        return e
    same = known.get(e.seq)
    if same is not None and same.entry_id == e.entry_id:
        return same
    return Evidence.made(seq=e.seq, entry_id=e.entry_id)


def _in_scope(path: str, scope: tuple[str, ...]) -> bool:
    """The path is a scope entry or lies under one, whole path segments only: ``src/api``
    covers ``src/api/orders.py`` but not ``src/api_v2/orders.py``."""
    path = path.removeprefix("./")
    return any(path == p or path.startswith(p if p.endswith("/") else p + "/") for p in scope)


def _scope(value: str) -> tuple[str, ...]:
    return tuple(p.removeprefix("./") for p in _SCOPE_SPLIT.split(value) if p)


# --- per-file history ---------------------------------------------------------------------------

_Transition = tuple[FileChangeStatus | None, tuple[FileEdit, ...], str]


def _churned(
    churn: dict[str, FileChurn], f: DiffFile, at: Evidence
) -> tuple[FileChurn, tuple[FileEdit, ...], str]:
    """The file's record after this edit, the earlier edits it reverted, and how."""
    prev = _previous(churn, f)
    edits = list(prev.edits) if prev is not None else []
    net = prev.net_status if prev is not None else None
    renamed_from = prev.renamed_from if prev is not None else None
    match f.status:
        case S.ADDED:
            net, undone, why = _added(f, net, edits)
        case S.DELETED:
            net, undone, why = _deleted(f, net, edits, at)
        case S.MODIFIED:
            net, undone, why = _modified(f, net, edits)
        case S.RENAMED:
            net, undone, why = _renamed(f, net, edits, renamed_from)
            renamed_from = None if undone else renamed_from or f.old_path
        case S.UNKNOWN:
            net, undone, why = net or S.UNKNOWN, (), ""
        case _:
            assert_never(f.status)
    edit = FileEdit.made(
        seq=at.seq,
        entry_id=at.entry_id,
        status=f.status,
        lines_added=f.lines_added,
        lines_deleted=f.lines_deleted,
        reverted=bool(undone),
    )
    edits.append(edit)
    record = FileChurn.made(
        path=f.path,
        classification=f.classification,
        times_edited=len(edits),
        lines_added=(prev.lines_added if prev else 0) + f.lines_added,
        lines_deleted=(prev.lines_deleted if prev else 0) + f.lines_deleted,
        net_status=net,
        renamed_from=renamed_from,
        edits=tuple(edits),
    )
    return record, undone, why


def _previous(churn: dict[str, FileChurn], f: DiffFile) -> FileChurn | None:
    """The record this edit continues; a rename takes over its old path's record."""
    here = churn.get(f.path)
    if f.status is not S.RENAMED or f.old_path is None or f.old_path not in churn:
        return here
    moved = churn.pop(f.old_path)
    if here is None:
        return moved
    edits = tuple(sorted((*moved.edits, *here.edits), key=lambda e: e.seq))
    return moved.model_copy(
        update={
            "edits": edits,
            "lines_added": moved.lines_added + here.lines_added,
            "lines_deleted": moved.lines_deleted + here.lines_deleted,
        }
    )


def _last(edits: list[FileEdit], status: FileChangeStatus) -> int | None:
    for i in range(len(edits) - 1, -1, -1):
        if edits[i].status is status and not edits[i].reverted:
            return i
    return None


def _revert(edits: list[FileEdit], indexes: Iterable[int]) -> tuple[FileEdit, ...]:
    undone = []
    for i in indexes:
        edits[i] = edits[i].model_copy(update={"reverted": True})
        undone.append(edits[i])
    return tuple(undone)


def _added(f: DiffFile, net: FileChangeStatus | None, edits: list[FileEdit]) -> _Transition:
    i = _last(edits, S.DELETED) if net is S.DELETED else None
    if i is None:
        return (S.ADDED if net in (None, S.ADDED) else net), (), ""
    why = f"{f.path} deleted at seq {edits[i].seq} and added back"
    return S.MODIFIED, _revert(edits, [i]), why


def _deleted(
    f: DiffFile, net: FileChangeStatus | None, edits: list[FileEdit], at: Evidence
) -> _Transition:
    i = _last(edits, S.ADDED) if net is S.ADDED else None
    if i is None:
        return S.DELETED, (), ""
    why = f"{f.path} added at seq {edits[i].seq} and deleted at seq {at.seq}"
    return None, _revert(edits, [j for j in range(i, len(edits)) if not edits[j].reverted]), why


def _modified(f: DiffFile, net: FileChangeStatus | None, edits: list[FileEdit]) -> _Transition:
    mirror = (f.lines_deleted, f.lines_added)
    match = None
    if f.lines_added or f.lines_deleted:
        match = next(
            (
                i
                for i in range(len(edits) - 1, -1, -1)
                if edits[i].status is S.MODIFIED
                and not edits[i].reverted
                and (edits[i].lines_added, edits[i].lines_deleted) == mirror
            ),
            None,
        )
    if match is None:
        return (net if net in (S.ADDED, S.RENAMED) else S.MODIFIED), (), ""
    undone = _revert(edits, [match])
    why = (
        f"{f.path} +{f.lines_added} -{f.lines_deleted} undoes the "
        f"+{mirror[0]} -{mirror[1]} change of seq {undone[0].seq}"
    )
    settled = all(e.reverted for e in edits) and net in (None, S.MODIFIED)
    return (None if settled else net or S.MODIFIED), undone, why


def _renamed(
    f: DiffFile, net: FileChangeStatus | None, edits: list[FileEdit], renamed_from: str | None
) -> _Transition:
    i = _last(edits, S.RENAMED) if renamed_from is not None and renamed_from == f.path else None
    if i is None:
        return (S.ADDED if net is S.ADDED else S.RENAMED), (), ""
    undone = _revert(edits, [i])
    why = f"{f.old_path} renamed back to {f.path} (renamed at seq {undone[0].seq})"
    if net is S.ADDED:
        return S.ADDED, undone, why
    return (None if all(e.reverted for e in edits) else S.MODIFIED), undone, why


def _summary(churn: dict[str, FileChurn], snapshots: int) -> DiffSummary:
    by_class: dict[str, list[int]] = {}
    by_status: dict[str, int] = {}
    for record in churn.values():
        totals = by_class.setdefault(_TEXT[record.classification], [0, 0, 0, 0])
        totals[0] += 1
        totals[2] += record.lines_added
        totals[3] += record.lines_deleted
        if record.net_status is not None:
            totals[1] += 1
            net = _TEXT[record.net_status]
            by_status[net] = by_status.get(net, 0) + 1
    classes = {
        cls: ClassTotals.made(
            files_touched=t[0], files_changed=t[1], lines_added=t[2], lines_deleted=t[3]
        )
        for cls, t in sorted(by_class.items())
    }
    return DiffSummary.made(
        snapshots=snapshots,
        files_touched=len(churn),
        files_changed=sum(t.files_changed for t in classes.values()),
        lines_added=sum(t.lines_added for t in classes.values()),
        lines_deleted=sum(t.lines_deleted for t in classes.values()),
        by_classification=classes,
        by_status=dict(sorted(by_status.items())),
    )


def _snapshot_of(
    entry: LedgerEntry,
    diffs: list[DiffPart],
    files: tuple[DiffFile, ...],
    flags: tuple[FlagKind, ...],
) -> DiffSnapshot:
    first = diffs[0] if diffs else None
    return DiffSnapshot.made(
        seq=entry.sequence_no,
        entry_id=entry.entry_id,
        occurred_at=entry.occurred_at,
        files=files,
        lines_added=sum(f.lines_added for f in files),
        lines_deleted=sum(f.lines_deleted for f in files),
        diff_artifact=next((d.diff_artifact for d in diffs if d.diff_artifact), None),
        base_sha=first.base_sha if first else None,
        workspace_tree_hash=first.workspace_tree_hash if first else None,
        flags=flags,
    )


# --- timeline rows ------------------------------------------------------------------------------


def _row(
    entry: LedgerEntry,
    kind: RowKind,
    summary: str,
    *,
    artifact_id: str | None = None,
    status: str | None = None,
    detail: Detail | None = None,
    text: str | None = None,
) -> TimelineRow:
    return TimelineRow.made(
        seq=entry.sequence_no,
        occurred_at=entry.occurred_at,
        kind=kind,
        summary=summary,
        entry_id=entry.entry_id,
        artifact_id=artifact_id,
        status=status,
        detail=detail if detail is not None else {},
        text=text,
    )


KEEP_ROWS = 64
KEEP_SNAPSHOTS = 8
KEEP_RESPONSES = 256
_SEQ_THEN_ID = itemgetter(1, 0)  # a (response id, seq) item's sort key


def _first_row_number(state: DiffTimeline) -> int:
    """The number in the run of ``state.rows[0]`` (states before v2 kept every row)."""
    return max(state.rows_total, len(state.rows)) - len(state.rows)


def _settled(state: DiffTimeline, update: dict[str, object]) -> DiffTimeline:
    """``state`` updated, with the rows this entry made final noted and the window trimmed.

    An update's ``rows`` are the state's with new rows appended and rows of the window replaced;
    its ``finalized`` lists the replaced rows (by number: those out of the window first, then
    those in it in order), so only the appended rows are looked at here."""
    late = update.pop("finalized", ())
    assert isinstance(late, tuple)
    rows = update.get("rows")
    if not isinstance(rows, tuple):
        update["finalized"] = late
        return state.model_copy(update=update)
    kept = len(state.rows)
    total = max(state.rows_total, kept) + len(rows) - kept  # _first_row_number + len(rows)
    number = total - len(rows) + kept  # of the first appended row
    final = list(late)
    for r in rows[kept:]:
        if r.kind != "tool" or r.status != "PENDING":  # not _open(r)
            final.append((number, r))
        number += 1
    update["rows"] = rows[-KEEP_ROWS:]
    update["rows_total"] = total
    update["finalized"] = tuple(final)
    return state.model_copy(update=update)


def _number(numbered: tuple[int, TimelineRow]) -> int:
    return numbered[0]


def _open(row: TimelineRow) -> bool:
    return row.kind == "tool" and row.status == "PENDING"


def _rows(state: DiffTimeline, *rows: TimelineRow) -> dict[str, object]:
    return {"rows": (*state.rows, *rows)} if rows else {}


def _clip(text: str, limit: int = SUMMARY_CHARS) -> str:
    line = text.strip().split("\n", 1)[0].strip()
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def _whole(text: str, limit: int = SUMMARY_CHARS) -> str | None:
    """``text`` when a summary would show only part of it (None when it shows all)."""
    body = text.strip()
    return body if body and _clip(body, limit) != body else None


def _text(entry: LedgerEntry) -> str:
    return next((p.text for p in entry.parts if isinstance(p, TextPart)), "")


def _started(state: DiffTimeline, entry: LedgerEntry) -> dict[str, object]:
    meta = entry.metadata
    scope = _scope(meta[SCOPE_KEY]) if SCOPE_KEY in meta else state.scope
    detail: Detail = {
        k: meta[k] for k in ("repository", "base_sha", SCOPE_KEY, TIME_KEY) if k in meta
    }
    text = _text(entry)
    if entry.kind is EntryKind.RUN_STARTED:
        row = _row(
            entry, "lifecycle", _clip(text or "run started"), detail=detail, text=_whole(text)
        )
        if not state.lifecycle:  # the run's first lifecycle row: the timeline header's
            repository = detail.get("repository")
            return {
                "scope": scope,
                "rows": (*state.rows, row),
                "lifecycle": True,
                "repository": repository if isinstance(repository, str) else None,
            }
    else:
        summary = "task: " + _clip(text or "(no text)")
        row = _row(entry, "task", summary, detail=detail, text=_whole(text))
    return {"scope": scope, "rows": (*state.rows, row)}


def _finished(state: DiffTimeline, entry: LedgerEntry) -> dict[str, object]:
    status = entry.run_status or RunStatus.UNKNOWN
    detail: Detail = {"outcome": entry.metadata["outcome"]} if "outcome" in entry.metadata else {}
    row = _row(
        entry, "lifecycle", f"run finished: {status.value}", status=status.value, detail=detail
    )
    return {"status": status, "rows": (*state.rows, row), "lifecycle": True}


def _plan_row(entry: LedgerEntry) -> TimelineRow:
    plan = entry.metadata["plan"]
    steps = parse_json(plan)
    if isinstance(steps, list):
        plan = storable("; ".join(str(s) for s in steps))
    return _row(entry, "plan", "plan: " + _clip(plan), text=_whole(plan))


def _assistant_row(entry: LedgerEntry) -> TimelineRow:
    text = _text(entry)
    return _row(entry, "assistant", "assistant: " + _clip(text or "(no text)"), text=_whole(text))


def _tool_requested(state: DiffTimeline, entry: LedgerEntry) -> dict[str, object]:
    rows = list(state.rows)
    base = _first_row_number(state)
    calls = dict(state.open_calls)
    for part in entry.parts:
        if not isinstance(part, ToolCallPart):
            continue
        detail: Detail = {
            "tool_call_id": part.tool_call_id,
            "tool_name": part.tool_name,
            "permission_class": _TEXT[part.permission_class],
        }
        if part.approval_id is not None:
            detail["approval_id"] = part.approval_id
        summary = f"{part.tool_name} requested ({_TEXT[part.permission_class]})"
        row = _row(entry, "tool", summary, status="PENDING", detail=detail)
        calls[part.tool_call_id] = OpenCall.made(
            row=base + len(rows),
            tool_name=part.tool_name,
            started_at=part.started_at,
            finished_at=part.finished_at,
            request=row,
        )
        rows.append(row)
    return {"rows": tuple(rows), "open_calls": calls}


def _result_row(
    entry: LedgerEntry, part: ToolResultPart, call: OpenCall | None, request: TimelineRow | None
) -> TimelineRow:
    name = call.tool_name if call is not None else part.tool_call_id
    status = _TEXT[part.status]
    words = [name, status]
    detail: Detail = dict(request.detail) if request is not None else {}
    detail["tool_call_id"] = part.tool_call_id
    detail["result_entry_id"] = entry.entry_id
    detail["result_seq"] = entry.sequence_no
    detail["exit_code"] = part.exit_code
    if part.exit_code is not None:
        words.append(f"exit {part.exit_code}")
    if call is not None:
        end = call.finished_at or entry.occurred_at
        duration_ms = max(0, round((end - call.started_at).total_seconds() * 1000))
        detail["duration_ms"] = duration_ms
        words.append(f"in {duration_ms / 1000:.1f}s")
    summary = " ".join(words) + (f": {_clip(part.summary, 60)}" if part.summary.strip() else "")
    artifact_id = part.artifact_refs[0].artifact_id if part.artifact_refs else None
    base = request if request is not None else _row(entry, "tool", "")
    return base.model_copy(
        update={
            "summary": summary,
            "status": status,
            "artifact_id": artifact_id,
            "detail": detail,
            "text": _whole(part.summary, 60),
        }
    )


def _after_test_tool(
    failing: Evidence | None, status: ToolResultStatus, entry: LedgerEntry
) -> Evidence | None:
    if status in (ToolResultStatus.FAILED, ToolResultStatus.TIMED_OUT):
        return Evidence.made(seq=entry.sequence_no, entry_id=entry.entry_id)
    return None if status is ToolResultStatus.SUCCEEDED else failing


def _model_called(state: DiffTimeline, entry: LedgerEntry) -> dict[str, object]:
    rows: list[TimelineRow] = []
    seen = state.model_responses
    for _, part in new_calls(entry, seen):  # a response reported again adds no row
        response = part.provider_response_id
        if response is not None:  # (an entry's own id never comes again: not kept)
            seen = {**seen, response: entry.sequence_no}
            if len(seen) > KEEP_RESPONSES:  # the newest by seq, not by key order (jsonb
                # reorders object keys, so a reloaded state's order is not its insertion order)
                newest = sorted(seen.items(), key=_SEQ_THEN_ID)[-KEEP_RESPONSES:]
                seen = dict(newest)
        rows.append(_model_row(entry, part))
    if not rows:
        return {}
    return {"rows": (*state.rows, *rows), "model_responses": seen}


def _model_row(entry: LedgerEntry, u: ModelUsagePart) -> TimelineRow:
    unknown = u.unknown_fields  # None: the source did not say (v3)
    tokens_in = None if "input_tokens" in unknown else u.input_tokens
    cached = None if "cached_input_tokens" in unknown else u.cached_input_tokens
    out = None if "output_tokens" in unknown else u.output_tokens
    latency = None if "latency_ms" in unknown else u.latency_ms
    summary = (
        f"{u.provider}/{u.model} {u.purpose}: {_thousands(tokens_in)} in "
        f"({_thousands(cached)} cached) / {_thousands(out)} out, "
        + (f"{latency / 1000:.1f}s" if latency is not None else "latency unknown")
    )
    detail: Detail = {
        "provider": u.provider,
        "model": u.model,
        "purpose": u.purpose,
        "provider_response_id": u.provider_response_id,
        "input_tokens": tokens_in,
        "cached_input_tokens": cached,
        "output_tokens": out,
        "reasoning_tokens": None if "reasoning_tokens" in unknown else u.reasoning_tokens,
        "latency_ms": latency,
        "context_entry_id": entry.causation.parent_entry_id,
        "cost_usd": None,  # joined in from the cost projection
    }
    return _row(entry, "model-call", summary, status=_TEXT[u.status], detail=detail)


def _thousands(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _diff_row(entry: LedgerEntry, snap: DiffSnapshot, number: int) -> TimelineRow:
    names = ", ".join(f"{f.path} {_TEXT[f.status]}" for f in snap.files[:3])
    more = f" +{len(snap.files) - 3} more" if len(snap.files) > 3 else ""
    summary = (
        f"diff #{number}: {len(snap.files)} file{'' if len(snap.files) == 1 else 's'} "
        f"(+{snap.lines_added} -{snap.lines_deleted}) {names}{more}"
    )
    if snap.flags:
        summary += f" [{', '.join(snap.flags)}]"
    detail: Detail = {
        "snapshot": number,
        "files": len(snap.files),
        "lines_added": snap.lines_added,
        "lines_deleted": snap.lines_deleted,
        "flags": ",".join(snap.flags),
    }
    artifact_id = snap.diff_artifact.artifact_id if snap.diff_artifact else None
    return _row(entry, "diff", summary, artifact_id=artifact_id, detail=detail)


def _verified(state: DiffTimeline, entry: LedgerEntry) -> dict[str, object]:
    row = _verification_row(entry, "verifier")
    failing = state.failing_check
    if row.status in (VerificationStatus.ERROR, VerificationStatus.FAILED):
        failing = Evidence.made(seq=entry.sequence_no, entry_id=entry.entry_id)
    elif any(
        isinstance(p, VerificationPart) and p.status is VerificationStatus.PASSED
        for p in entry.parts
    ):
        failing = None
    return {"rows": (*state.rows, row), "failing_check": failing}


def _verification_row(entry: LedgerEntry, kind: Literal["verifier", "judge"]) -> TimelineRow:
    checks = [p for p in entry.parts if isinstance(p, VerificationPart)]
    statuses = {p.status for p in checks}
    status = next((s for s in _VERIFICATION_ORDER if s in statuses), None)
    words = [f"{p.verifier}/{p.profile} {p.status.value}" for p in checks[:2]]
    if len(checks) > 2:
        words.append(f"+{len(checks) - 2} more")
    first = checks[0] if checks else None
    if first is not None and first.check_id:
        words.append(first.check_id)
    note = _text(entry)
    whole = " ".join(words) + (f": {note}" if note else "") or kind
    summary = _clip(whole)
    detail: Detail = {}
    if first is not None:
        detail = {"verifier": first.verifier, "profile": first.profile, "check_id": first.check_id}
        detail["checks"] = len(checks)
    diagnostics = next((p.diagnostics_ref for p in checks if p.diagnostics_ref), None)
    return _row(
        entry,
        kind,
        summary,
        artifact_id=diagnostics.artifact_id if diagnostics else None,
        status=status.value if status else None,
        detail=detail,
        text=_whole(whole),
    )


def _approval_row(entry: LedgerEntry) -> TimelineRow:
    meta, doc = entry.metadata, json_object(entry)
    detail: Detail = {"parent_entry_id": entry.causation.parent_entry_id}
    if entry.kind is EntryKind.APPROVAL_REQUEST:
        action = (
            meta.get("action") or storable(str(doc.get("action") or "")) or _clip(_text(entry), 60)
        )
        detail["action"] = action or None
        return _row(entry, "approval", f"approval requested: {action or '?'}", detail=detail)
    decision = approval_decision(entry)
    text = _text(entry)
    summary = f"approval {decision}" + (f": {_clip(text, 60)}" if text else "")
    return _row(entry, "approval", summary, status=decision, detail=detail, text=_whole(text, 60))


def _error_rows(entry: LedgerEntry) -> list[TimelineRow]:
    errors = [p for p in entry.parts if isinstance(p, ErrorPart)]
    if not errors:
        text = _text(entry)
        return [_row(entry, "error", "error: " + _clip(text or "(no detail)"), text=_whole(text))]
    return [
        _row(
            entry,
            "error",
            _clip(f"error {e.category}: {e.message}"),
            status=e.category,
            detail={"category": e.category, "signature": e.signature},
            text=_whole(f"error {e.category}: {e.message}"),
        )
        for e in errors
    ]


def _compaction_row(entry: LedgerEntry) -> TimelineRow:
    through = entry.metadata.get("replaces_through_seq")
    summary = "compaction" + (f" replaces entries through seq {through}" if through else "")
    artifact = next((p.artifact_id for p in entry.parts if isinstance(p, ArtifactRefPart)), None)
    count = metadata_count(through)
    detail: Detail = {"replaces_through_seq": count} if count is not None else {}
    return _row(entry, "compaction", summary, artifact_id=artifact, detail=detail)


def with_all_rows(state: DiffTimeline, final: Iterable[tuple[int, dict[str, Any]]]) -> DiffTimeline:
    """The timeline with every row of the run: ``final`` (the history rows, as (number, doc)),
    then the rows of calls still open, in run order. A state folded before v2 kept every row."""
    rows = {n: TimelineRow.model_validate(doc) for n, doc in final}
    if not rows and state.rows_total == 0:
        return state
    base = _first_row_number(state)
    for call in state.open_calls.values():
        at = call.row - base
        row = state.rows[at] if 0 <= at < len(state.rows) else call.request
        if row is not None:
            rows.setdefault(call.row, row)
    return state.model_copy(update={"rows": tuple(rows[n] for n in sorted(rows))})
