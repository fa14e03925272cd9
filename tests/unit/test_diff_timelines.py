"""Diff timelines: snapshots, churn, flags, summary and timeline rows folded from a run."""

from __future__ import annotations

import json

import pytest

from projectors.base import fold_all
from projectors.diff_timelines import (
    KEEP_RESPONSES,
    KEEP_ROWS,
    KEEP_SNAPSHOTS,
    DiffFlag,
    DiffTimeline,
    DiffTimelinesProjection,
    FlagKind,
    TimelineRow,
    with_all_rows,
)
from schemas.factory import (
    EntryBuilder,
    artifact,
    artifact_part,
    model_usage,
    tool_call,
    tool_result,
    verification,
)
from schemas.models import (
    Causation,
    DiffFile,
    DiffPart,
    EntryKind,
    ErrorPart,
    FileChangeStatus,
    FileClassification,
    LedgerEntry,
    TextPart,
    ToolResultPart,
    ToolResultStatus,
    VerificationStatus,
)
from streams.simulate import OUTCOMES, simulate_runs

S, C = FileChangeStatus, FileClassification


def fold(
    entries: list[LedgerEntry], projection: DiffTimelinesProjection | None = None
) -> DiffTimeline:
    state = fold_all(projection or DiffTimelinesProjection(), entries)
    assert state is not None
    return state


def started(scope: str | None = None) -> EntryBuilder:
    b = EntryBuilder()
    meta = {"scope": scope} if scope is not None else {}
    b.add(
        EntryKind.RUN_STARTED, (TextPart(text="run started for task: fix totals"),), metadata=meta
    )
    return b


def file(
    path: str,
    status: FileChangeStatus = S.MODIFIED,
    added: int = 1,
    deleted: int = 0,
    cls: FileClassification = C.SOURCE,
    old_path: str | None = None,
) -> DiffFile:
    return DiffFile(
        path=path,
        status=status,
        lines_added=added,
        lines_deleted=deleted,
        classification=cls,
        old_path=old_path,
    )


def snap(b: EntryBuilder, *files: DiffFile) -> LedgerEntry:
    patch = artifact(f"patch-{len(b.entries) + 1}", "text/x-diff")
    return b.add(EntryKind.DIFF_SNAPSHOT, (DiffPart(files=files, diff_artifact=patch),))


def verifier(b: EntryBuilder, status: VerificationStatus) -> LedgerEntry:
    return b.add(EntryKind.VERIFIER_RESULT, (verification(status),))


def tool_round(
    b: EntryBuilder,
    call_id: str,
    name: str = "repo.search",
    status: ToolResultStatus = ToolResultStatus.SUCCEEDED,
) -> LedgerEntry:
    at = b.time(len(b.entries) + 1)
    request = b.add(
        EntryKind.TOOL_CALL_REQUEST,
        (tool_call(call_id, at).model_copy(update={"tool_name": name}),),
        causation=Causation(tool_call_id=call_id),
    )
    result = tool_result(call_id).model_copy(
        update={"status": status, "exit_code": 0 if status is ToolResultStatus.SUCCEEDED else 1}
    )
    return b.add(
        EntryKind.TOOL_CALL_RESULT,
        (result,),
        causation=Causation(parent_entry_id=request.entry_id, tool_call_id=call_id),
    )


def flags(state: DiffTimeline, kind: FlagKind) -> list[DiffFlag]:
    return [f for f in state.flags if f.kind == kind]


def seqs(flag: DiffFlag) -> list[int]:
    return [e.seq for e in flag.evidence]


def rows(state: DiffTimeline, kind: str) -> list[TimelineRow]:
    return [r for r in state.rows if r.kind == kind]


# --- overreach ----------------------------------------------------------------------------------


def test_file_added_then_deleted_is_overreach_and_leaves_no_net_change() -> None:
    b = started()
    snap(b, file("src/a.py", added=5))
    added = snap(b, file("src/scratch.py", S.ADDED, 20, 0))
    snap(b, file("src/scratch.py", S.MODIFIED, 3, 1))
    deleted = snap(b, file("src/scratch.py", S.DELETED, 0, 22))
    state = fold(b.entries)
    [flag] = flags(state, "overreach")
    assert flag.path == "src/scratch.py"
    assert seqs(flag) == [3, 4, 5]
    assert [e.entry_id for e in flag.evidence][::2] == [added.entry_id, deleted.entry_id]
    assert flag.raised_at_seq == 5
    assert "added at seq 3 and deleted at seq 5" in flag.reason
    scratch = state.files["src/scratch.py"]
    assert scratch.net_status is None and all(e.reverted for e in scratch.edits)
    assert state.summary.files_touched == 2 and state.summary.files_changed == 1
    assert state.snapshots[-1].flags == ("overreach", "churn")  # the third edit of scratch.py


def test_file_added_then_modified_is_not_overreach() -> None:
    b = started()
    snap(b, file("src/new.py", S.ADDED, 20, 0))
    snap(b, file("src/new.py", S.MODIFIED, 2, 1))
    state = fold(b.entries)
    assert flags(state, "overreach") == []
    assert state.files["src/new.py"].net_status is S.ADDED


def test_deleted_file_added_back_is_overreach() -> None:
    b = started()
    snap(b, file("src/legacy.py", S.DELETED, 0, 40))
    snap(b, file("src/legacy.py", S.ADDED, 40, 0))
    state = fold(b.entries)
    [flag] = flags(state, "overreach")
    assert seqs(flag) == [2, 3] and "deleted at seq 2 and added back" in flag.reason
    assert state.files["src/legacy.py"].net_status is S.MODIFIED


def test_mirrored_modification_undoes_the_earlier_one() -> None:
    b = started()
    snap(b, file("config/app.yaml", added=5, deleted=2, cls=C.CONFIG))
    snap(b, file("src/a.py", added=5, deleted=2))
    snap(b, file("config/app.yaml", added=2, deleted=5, cls=C.CONFIG))
    state = fold(b.entries)
    [flag] = flags(state, "overreach")
    assert flag.path == "config/app.yaml" and seqs(flag) == [2, 4]
    assert "+2 -5 undoes the +5 -2 change of seq 2" in flag.reason
    assert state.files["config/app.yaml"].net_status is None
    assert state.files["src/a.py"].net_status is S.MODIFIED
    assert state.summary.files_changed == 1
    assert state.summary.by_classification["CONFIG"].files_changed == 0


def test_repeated_or_empty_modifications_are_not_reverts() -> None:
    b = started()
    snap(b, file("src/a.py", added=5, deleted=2))
    snap(b, file("src/a.py", added=5, deleted=2))
    snap(b, file("src/b.py", added=0, deleted=0))
    snap(b, file("src/b.py", added=0, deleted=0))
    state = fold(b.entries)
    assert flags(state, "overreach") == []
    assert state.files["src/a.py"].net_status is S.MODIFIED


def test_a_mirror_reverts_each_earlier_change_only_once() -> None:
    b = started()
    snap(b, file("src/a.py", added=5, deleted=2))
    snap(b, file("src/a.py", added=2, deleted=5))
    snap(b, file("src/a.py", added=2, deleted=5))
    state = fold(b.entries)
    [flag] = flags(state, "overreach")
    assert seqs(flag) == [2, 3]
    assert state.files["src/a.py"].net_status is S.MODIFIED


def test_rename_back_is_overreach_and_renames_carry_the_history() -> None:
    b = started()
    snap(b, file("src/old.py", added=3))
    snap(b, file("src/new.py", S.RENAMED, 0, 0, old_path="src/old.py"))
    mid = fold(b.entries)
    assert set(mid.files) == {"src/new.py"}
    moved = mid.files["src/new.py"]
    assert moved.renamed_from == "src/old.py" and moved.times_edited == 2
    assert moved.net_status is S.RENAMED and flags(mid, "overreach") == []
    snap(b, file("src/old.py", S.RENAMED, 0, 0, old_path="src/new.py"))
    state = fold(b.entries)
    [flag] = flags(state, "overreach")
    assert flag.path == "src/old.py" and seqs(flag) == [3, 4]
    back = state.files["src/old.py"]
    assert back.renamed_from is None and back.times_edited == 3
    assert back.net_status is S.MODIFIED  # the first modification still stands


# --- churn --------------------------------------------------------------------------------------


def test_churn_flags_a_file_edited_threshold_times_and_counts_its_lines() -> None:
    b = started()
    for added, deleted in ((10, 2), (4, 1), (3, 3)):
        snap(b, file("src/a.py", added=added, deleted=deleted), file("src/b.py", added=1))
    snap(b, file("src/c.py", added=1))
    state = fold(b.entries)
    a = state.files["src/a.py"]
    assert (a.times_edited, a.lines_added, a.lines_deleted) == (3, 17, 6)
    assert [e.seq for e in a.edits] == [2, 3, 4]
    assert state.files["src/c.py"].times_edited == 1
    assert {f.path for f in flags(state, "churn")} == {"src/a.py", "src/b.py"}
    churn_a = next(f for f in flags(state, "churn") if f.path == "src/a.py")
    assert seqs(churn_a) == [2, 3, 4] and churn_a.raised_at_seq == 4
    assert churn_a.reason == "edited 3 times (threshold 3), +17 -6 lines in total"


def test_churn_flag_grows_with_later_edits_and_respects_the_threshold() -> None:
    b = started()
    for _ in range(2):
        snap(b, file("src/a.py", added=2))
    assert flags(fold(b.entries), "churn") == []
    [early] = flags(fold(b.entries, DiffTimelinesProjection(churn_threshold=2)), "churn")
    assert seqs(early) == [2, 3]
    snap(b, file("src/a.py", added=2))
    snap(b, file("src/a.py", added=2))
    [flag] = flags(fold(b.entries), "churn")
    assert seqs(flag) == [2, 3, 4, 5] and flag.raised_at_seq == 4
    assert "edited 4 times" in flag.reason


def test_churn_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="churn_threshold"):
        DiffTimelinesProjection(churn_threshold=0)


# --- verifier gaming ----------------------------------------------------------------------------

TEST_FILE = "tests/test_orders.py"


def test_test_file_changed_after_failing_verifier_is_gaming() -> None:
    b = started()
    snap(b, file("src/orders.py", added=4))
    failed = verifier(b, VerificationStatus.FAILED)
    edit = snap(b, file("src/orders.py", added=1), file(TEST_FILE, added=2, cls=C.TEST))
    state = fold(b.entries)
    [flag] = flags(state, "verifier-gaming")
    assert flag.path == TEST_FILE
    assert [e.entry_id for e in flag.evidence] == [failed.entry_id, edit.entry_id]
    assert "after a failing check at seq 3" in flag.reason
    assert state.failing_check is not None and state.failing_check.seq == 3


def test_test_file_changed_after_failing_test_tool_is_gaming() -> None:
    b = started()
    failed = tool_round(b, "call-1", "run_tests", ToolResultStatus.FAILED)
    snap(b, file(TEST_FILE, cls=C.TEST))
    [flag] = flags(fold(b.entries), "verifier-gaming")
    assert flag.evidence[0].entry_id == failed.entry_id


@pytest.mark.parametrize(
    "setup",
    ["no-failure", "failure-then-pass", "test-tool-pass", "other-tool-fails", "source-only"],
)
def test_no_gaming_without_a_standing_failure(setup: str) -> None:
    b = started()
    edited = file(TEST_FILE, cls=C.TEST)
    if setup == "failure-then-pass":
        verifier(b, VerificationStatus.FAILED)
        verifier(b, VerificationStatus.PASSED)
    elif setup == "test-tool-pass":
        verifier(b, VerificationStatus.ERROR)
        tool_round(b, "call-1", "run_tests")
    elif setup == "other-tool-fails":
        tool_round(b, "call-1", "apply_patch", ToolResultStatus.FAILED)
    elif setup == "source-only":
        verifier(b, VerificationStatus.FAILED)
        edited = file("src/orders.py")
    snap(b, edited)
    assert flags(fold(b.entries), "verifier-gaming") == []


def test_test_file_changed_before_the_failure_is_not_gaming() -> None:
    b = started()
    snap(b, file(TEST_FILE, cls=C.TEST))
    verifier(b, VerificationStatus.FAILED)
    assert flags(fold(b.entries), "verifier-gaming") == []


# --- generated and out-of-scope files -----------------------------------------------------------


def test_generated_file_edit_is_flagged() -> None:
    b = started()
    snap(b, file("src/api/orders_pb2.py", added=3, cls=C.GENERATED), file("src/api/orders.py"))
    snap(b, file("src/api/orders_pb2.py", S.DELETED, 0, 90, cls=C.GENERATED))
    state = fold(b.entries)
    [flag] = flags(state, "generated-edit")
    assert flag.path == "src/api/orders_pb2.py" and seqs(flag) == [2, 3]
    assert "generated file deleted at seq 3" in flag.reason


def test_source_edit_is_not_generated() -> None:
    b = started()
    snap(b, file("src/api/orders.py"), file("docs/readme.md", cls=C.DOCUMENTATION))
    assert flags(fold(b.entries), "generated-edit") == []


def test_paths_outside_the_run_scope_are_flagged() -> None:
    b = started(scope="src/api/")
    snap(b, file("src/api/orders.py"), file("src/payments/client.py"), file(TEST_FILE, cls=C.TEST))
    state = fold(b.entries)
    assert state.scope == ("src/api/",)
    found = {f.path: f for f in flags(state, "out-of-scope")}
    assert set(found) == {"src/payments/client.py", TEST_FILE}
    assert found[TEST_FILE].reason == f"{TEST_FILE} is outside the task scope (src/api/)"
    assert seqs(found[TEST_FILE]) == [2]


def test_inside_scope_or_without_scope_nothing_is_flagged() -> None:
    inside = started(scope="src/api/, ./tests/")
    snap(inside, file("./src/api/orders.py"), file(TEST_FILE, cls=C.TEST))
    assert fold(inside.entries).scope == ("src/api/", "tests/")
    assert flags(fold(inside.entries), "out-of-scope") == []
    unscoped = started()
    snap(unscoped, file("anywhere/at/all.py"))
    assert flags(fold(unscoped.entries), "out-of-scope") == []


def test_scope_entries_match_whole_path_segments() -> None:
    b = started(scope="src/api src/export/csv_writer.py")
    snap(
        b,
        file("src/api/orders.py"),
        file("src/export/csv_writer.py"),
        file("src/api_v2/orders.py"),
        file("src/export/csv_writer.py.bak", S.ADDED),
    )
    found = {f.path for f in flags(fold(b.entries), "out-of-scope")}
    assert found == {"src/api_v2/orders.py", "src/export/csv_writer.py.bak"}


def test_task_scope_overrides_run_scope_and_renames_check_the_old_path() -> None:
    b = started(scope="src/")
    b.add(EntryKind.USER_TASK, (TextPart(text="Fix pagination"),), metadata={"scope": "src/api/"})
    snap(b, file("src/api/pagination.py", S.RENAMED, 0, 0, old_path="src/pagination.py"))
    [flag] = flags(fold(b.entries), "out-of-scope")
    assert flag.path == "src/pagination.py"


# --- summary ------------------------------------------------------------------------------------


def test_summary_of_the_final_diff() -> None:
    b = started()
    snap(b, file("src/a.py", added=10, deleted=2), file("tests/test_a.py", S.ADDED, 30, 0, C.TEST))
    snap(b, file("src/tmp.py", S.ADDED, 5, 0))
    snap(
        b, file("src/tmp.py", S.DELETED, 0, 5), file("setup.cfg", added=1, deleted=1, cls=C.CONFIG)
    )
    snap(b, file("src/old.py", S.DELETED, 0, 12))
    summary = fold(b.entries).summary
    assert summary.snapshots == 4
    assert (summary.files_touched, summary.files_changed) == (5, 4)
    assert (summary.lines_added, summary.lines_deleted) == (46, 20)
    assert summary.by_status == {"ADDED": 1, "DELETED": 1, "MODIFIED": 2}
    by = {
        k: (v.files_touched, v.files_changed, v.lines_added, v.lines_deleted)
        for k, v in summary.by_classification.items()
    }
    assert by == {"CONFIG": (1, 1, 1, 1), "SOURCE": (3, 2, 15, 19), "TEST": (1, 1, 30, 0)}


def test_snapshots_keep_files_artifact_and_order() -> None:
    b = started()
    first = snap(b, file("src/a.py", added=3, deleted=1), file("src/b.py", added=2))
    snap(b, file("src/a.py", added=1))
    state = fold(b.entries)
    assert [s.seq for s in state.snapshots] == [2, 3]
    s0 = state.snapshots[0]
    assert s0.entry_id == first.entry_id and s0.occurred_at == first.occurred_at
    assert [f.path for f in s0.files] == ["src/a.py", "src/b.py"]
    assert (s0.lines_added, s0.lines_deleted) == (5, 1)
    assert s0.diff_artifact is not None and s0.diff_artifact.artifact_id == "art-patch-2"


# --- timeline rows ------------------------------------------------------------------------------


def timeline_run() -> EntryBuilder:
    b = started(scope="src/")
    b.add(EntryKind.USER_TASK, (TextPart(text="Fix the totals\nwith details"),))
    b.add(EntryKind.SYSTEM_INSTRUCTION)
    ctx = b.add(EntryKind.CONTEXT_PROJECTED)
    b.add(
        EntryKind.MODEL_CALL,
        (model_usage("resp-1"),),
        causation=Causation(parent_entry_id=ctx.entry_id),
    )
    b.add(EntryKind.MODEL_CALL, (model_usage("resp-1"),))  # the same response reported again
    plan = json.dumps(["read the code", "fix", "run the tests"])
    b.add(EntryKind.ASSISTANT_RESPONSE, (TextPart(text="ok"),), metadata={"plan": plan})
    b.add(EntryKind.ASSISTANT_RESPONSE, (TextPart(text="thinking out loud"),))
    tool_round(b, "call-1", "run_tests", ToolResultStatus.FAILED)  # seqs 9, 10
    snap(b, file("src/a.py", added=8, deleted=3))  # 11
    b.add(EntryKind.VERIFIER_RESULT)  # 12: factory verification, FAILED
    b.add(EntryKind.JUDGE_RESULT)  # 13
    b.add(EntryKind.APPROVAL_REQUEST, metadata={"action": "git_push"})  # 14
    b.add(EntryKind.APPROVAL_DECISION)  # 15: {"approved": true}
    b.add(EntryKind.APPROVAL_DECISION, (TextPart(text="no"),), metadata={"decision": "REJECTED"})
    b.add(EntryKind.ERROR_EVENT)  # 17
    b.add(
        EntryKind.COMPACTION,
        (TextPart(text="Summary of turns 1-9."), artifact_part("history")),
        metadata={"replaces_through_seq": "9"},
    )  # 18
    b.add(EntryKind.RUN_SUMMARY, (TextPart(text="verifier still failing"),))
    b.add(EntryKind.RUN_FINISHED)  # 20
    return b


def test_one_row_per_step_in_sequence_order() -> None:
    state = fold(timeline_run().entries)
    kinds = [(r.seq, r.kind) for r in state.rows]
    assert kinds == [
        (1, "lifecycle"),
        (2, "task"),
        (5, "model-call"),
        (7, "plan"),
        (8, "assistant"),  # an assistant response without a plan is a row too (v3)
        (9, "tool"),
        (11, "diff"),
        (12, "verifier"),
        (13, "judge"),
        (14, "approval"),
        (15, "approval"),
        (16, "approval"),
        (17, "error"),
        (18, "compaction"),
        (19, "summary"),
        (20, "lifecycle"),
    ]
    assert all("\n" not in r.summary and len(r.summary) <= 140 for r in state.rows)
    assert state.status == "SUCCEEDED"


def test_lifecycle_task_plan_and_summary_rows() -> None:
    state = fold(timeline_run().entries)
    start, finish = rows(state, "lifecycle")
    assert start.summary == "run started for task: fix totals"
    assert start.detail == {"scope": "src/"} and start.entry_id == "run-1-e1"
    assert finish.summary == "run finished: SUCCEEDED" and finish.status == "SUCCEEDED"
    assert rows(state, "task")[0].summary == "task: Fix the totals"
    assert rows(state, "plan")[0].summary == "plan: read the code; fix; run the tests"
    assert rows(state, "summary")[0].summary == "verifier still failing"


def test_tool_row_is_completed_by_its_result() -> None:
    state = fold(timeline_run().entries)
    [row] = rows(state, "tool")
    assert row.seq == 9 and row.entry_id == "run-1-e9"
    assert row.status == "FAILED" and row.artifact_id == "art-call-1-stdout"
    assert row.summary == "run_tests FAILED exit 1 in 1.5s: Found 2 matches in src/app."
    assert row.detail["tool_name"] == "run_tests" and row.detail["exit_code"] == 1
    assert row.detail["duration_ms"] == 1500
    assert row.detail["result_entry_id"] == "run-1-e10" and row.detail["result_seq"] == 10
    assert state.open_calls == {}


def test_unanswered_and_orphan_tool_calls() -> None:
    b = started()
    b.add(EntryKind.TOOL_CALL_REQUEST, (tool_call("call-open", b.time(2)),))
    orphan = ToolResultPart(
        tool_call_id="call-lost", status=ToolResultStatus.DENIED, timed_out=False, summary=""
    )
    b.add(EntryKind.TOOL_CALL_RESULT, (orphan,))
    state = fold(b.entries)
    pending, lost = rows(state, "tool")
    assert pending.status == "PENDING" and pending.summary == "repo.search requested (READ_ONLY)"
    assert set(state.open_calls) == {"call-open"}
    assert lost.seq == 3 and lost.status == "DENIED" and lost.summary == "call-lost DENIED"


def test_model_call_row_has_usage_and_an_empty_cost_slot() -> None:
    state = fold(timeline_run().entries)
    [row] = rows(state, "model-call")
    assert row.status == "OK"
    assert (
        row.summary == "openai/gpt-5.1-codex planning: 18,420 in (12,000 cached) / 1,350 out, 18.4s"
    )
    assert row.detail["provider_response_id"] == "resp-1"
    assert row.detail["context_entry_id"] == "run-1-e4"
    assert (row.detail["input_tokens"], row.detail["output_tokens"]) == (18420, 1350)
    assert row.detail["latency_ms"] == 18450
    assert "cost_usd" in row.detail and row.detail["cost_usd"] is None
    assert state.model_responses == {"resp-1": 5}


def test_diff_verifier_judge_rows() -> None:
    state = fold(timeline_run().entries)
    [diff] = rows(state, "diff")
    assert diff.summary == "diff #1: 1 file (+8 -3) src/a.py MODIFIED"
    assert diff.artifact_id == "art-patch-11" and diff.detail["lines_added"] == 8
    [check] = rows(state, "verifier")
    assert check.status == "FAILED" and check.artifact_id == "art-diagnostics"
    assert check.summary == "maven@3.9/maven-compile-unit FAILED OrderServiceTest#totals"
    [judge] = rows(state, "judge")
    assert judge.status == "PASSED" and judge.summary.endswith(": In scope.")


def test_flags_show_on_their_diff_row() -> None:
    b = started(scope="src/")
    verifier(b, VerificationStatus.FAILED)
    snap(b, file("tests/test_a.py", cls=C.TEST))
    [row] = rows(fold(b.entries), "diff")
    assert row.summary.endswith("[verifier-gaming, out-of-scope]")
    assert row.detail["flags"] == "verifier-gaming,out-of-scope"


def test_approval_error_and_compaction_rows() -> None:
    state = fold(timeline_run().entries)
    request, approved, rejected = rows(state, "approval")
    assert request.summary == "approval requested: git_push"
    assert approved.status == "APPROVED" and approved.detail["parent_entry_id"] == "run-1-e14"
    assert rejected.status == "REJECTED" and rejected.summary == "approval REJECTED: no"
    [error] = rows(state, "error")
    assert error.summary == "error verifier.test_failure: 1 test failed"
    assert error.detail == {
        "category": "verifier.test_failure",
        "signature": "OrderServiceTest#totals",
    }
    [compaction] = rows(state, "compaction")
    assert compaction.summary == "compaction replaces entries through seq 9"
    assert compaction.artifact_id == "art-history"
    assert compaction.detail == {"replaces_through_seq": 9}


def test_errors_without_parts_and_long_text_stay_one_short_line() -> None:
    b = started()
    b.add(EntryKind.ERROR_EVENT, (ErrorPart(category="tool.failed", message="x" * 500),))
    b.add(EntryKind.ERROR_EVENT, (TextPart(text="worker lost\nheartbeat"),))
    first, second = rows(fold(b.entries), "error")
    assert len(first.summary) == 100 and first.summary.endswith("…")
    assert second.summary == "error: worker lost"


def test_accepts_only_what_it_folds() -> None:
    projection = DiffTimelinesProjection()
    b = timeline_run()
    accepted = {e.sequence_no for e in b.entries if projection.accepts(e)}
    assert {3, 4} & accepted == set()  # instruction, context
    assert {1, 2, 5, 6, 7, 8, 9, 10, 11, 20} <= accepted  # 8: a response without a plan (v3)


# --- guard, history, documents ------------------------------------------------------------------


def test_repeated_and_foreign_entries_leave_the_state_alone() -> None:
    b = started()
    first = snap(b, file("src/a.py"))
    state = fold(b.entries)
    projection = DiffTimelinesProjection()
    assert projection.fold(state, first) is state
    other = EntryBuilder("run-2")
    other.add(EntryKind.RUN_STARTED)
    foreign = snap(other, file("src/x.py"))
    assert projection.fold(state, foreign) is state


def test_history_has_one_row_per_snapshot() -> None:
    projection = DiffTimelinesProjection()
    b = started()
    s1 = snap(b, file("src/a.py"))
    v = verifier(b, VerificationStatus.FAILED)
    state = fold(b.entries[:1])
    after = projection.fold(state, s1)
    made = projection.history(state, after, s1)
    [row] = [r for r in made if r.kind == "diff"]
    assert (row.kind, row.key, row.seq) == ("diff", s1.entry_id, 2)
    assert row.doc["files"][0]["path"] == "src/a.py"
    # and its timeline row, final at once, numbered in the run (the start was row 0)
    assert [(r.kind, r.key, r.seq) for r in made if r.kind == "row"] == [("row", "00000001", 2)]
    later = projection.history(after, projection.fold(after, v), v)
    assert [(r.kind, r.key) for r in later] == [("row", "00000002")]


def test_a_long_run_keeps_a_window_of_rows_and_every_row_once_in_history() -> None:
    """Rows leave the state after KEEP_ROWS newer ones; each final row is a history row once,
    a tool call's when its result comes (even after its request left the window)."""
    projection = DiffTimelinesProjection()
    b = started()
    b.add(EntryKind.TOOL_CALL_REQUEST, (tool_call("call-slow", b.time(len(b.entries) + 1)),))
    for i in range(KEEP_ROWS + 10):
        snap(b, file(f"src/f{i}.py"))
    b.add(EntryKind.TOOL_CALL_RESULT, (tool_result("call-slow"),))
    state: DiffTimeline | None = None
    history = []
    for e in b.entries:
        before = state
        state = projection.initial(e) if state is None else state
        state = projection.fold(state, e)
        history += projection.history(before, state, e)
    assert state is not None
    assert len(state.rows) == KEEP_ROWS and state.rows_total == KEEP_ROWS + 12
    rows = [h for h in history if h.kind == "row"]
    assert sorted(h.key for h in rows) == [f"{n:08d}" for n in range(KEEP_ROWS + 12)]
    slow = next(h for h in rows if h.key == "00000001")
    assert slow.doc["status"] == "SUCCEEDED" and slow.doc["detail"]["tool_call_id"] == "call-slow"
    assert len(state.snapshots) == KEEP_SNAPSHOTS and state.summary.snapshots == KEEP_ROWS + 10
    # what a reader assembles: every row in run order, the same as while the call was open
    whole = with_all_rows(state, [(int(h.key), h.doc) for h in rows])
    assert [r.seq for r in whole.rows] == sorted(r.seq for r in whole.rows)
    assert len(whole.rows) == KEEP_ROWS + 12
    open_now = with_all_rows(state.model_copy(update={"open_calls": {}}), [])
    assert open_now.rows == ()  # no history given, no open call: nothing


def test_doc_round_trip() -> None:
    projection = DiffTimelinesProjection()
    b = timeline_run()
    snap(b, file("src/x.py", S.ADDED, 4, 0), file("out/gen_pb2.py", cls=C.GENERATED))
    snap(b, file("src/x.py", S.DELETED, 0, 4), file("src/y.py", S.RENAMED, old_path="src/z.py"))
    b.add(EntryKind.TOOL_CALL_REQUEST, (tool_call("call-open", b.time(len(b.entries) + 1)),))
    state = fold(b.entries, projection)
    assert state.flags and state.open_calls and state.failing_check is not None
    doc = projection.to_doc(state)
    restored = projection.from_doc(json.loads(json.dumps(doc)))
    assert restored == state
    assert projection.to_doc(restored) == doc


def test_projection_identity() -> None:
    projection = DiffTimelinesProjection()
    assert (projection.name, projection.version, projection.hot) == ("diff-timelines", 6, False)


# --- simulator runs -----------------------------------------------------------------------------


def test_simulated_runs_keep_the_invariants() -> None:
    runs = list(simulate_runs(1, len(OUTCOMES), seed=7))
    for run in runs:
        state = fold(run)
        diffs = [e for e in run if e.kind is EntryKind.DIFF_SNAPSHOT]
        assert [s.entry_id for s in state.snapshots] == [e.entry_id for e in diffs]
        assert [r.entry_id for r in rows(state, "diff")] == [e.entry_id for e in diffs]
        summary = state.summary
        assert summary.snapshots == len(diffs)
        assert summary.lines_added == sum(s.lines_added for s in state.snapshots)
        assert summary.lines_deleted == sum(s.lines_deleted for s in state.snapshots)
        assert summary.lines_added == sum(f.lines_added for f in state.files.values())
        assert sum(f.times_edited for f in state.files.values()) == sum(
            len(s.files) for s in state.snapshots
        )
        assert [r.seq for r in state.rows] == sorted(r.seq for r in state.rows)
        assert state.open_calls == {}
        responses = [r.detail["provider_response_id"] for r in rows(state, "model-call")]
        assert len(responses) == len(set(responses))
        assert state.status == run[-1].run_status
        for flag in state.flags:
            assert flag.evidence and all(e.seq <= state.last_seq for e in flag.evidence)
        if len(diffs) == 4:  # the scratch file is added, then deleted
            [overreach] = flags(state, "overreach")
            assert overreach.path.endswith("scratch_debug.py")
            assert state.files[overreach.path].net_status is None
            [gaming] = flags(state, "verifier-gaming")
            assert gaming.path.startswith("tests/")
            assert summary.files_changed == summary.files_touched - 1
    assert any(len([e for e in r if e.kind is EntryKind.DIFF_SNAPSHOT]) == 4 for r in runs)


def test_the_responses_kept_do_not_depend_on_key_order_after_a_reload() -> None:
    """jsonb reorders object keys: the responses a long run keeps are the newest by seq."""
    projection = DiffTimelinesProjection()
    b = started()
    for i in range(KEEP_RESPONSES + 40):
        b.add(EntryKind.MODEL_CALL, (model_usage(response_id=f"resp-{(i * 7919) % 1000:04d}-{i}"),))
    straight = fold(b.entries, projection)
    state = fold(b.entries[:150], projection)
    doc = projection.to_doc(state)
    doc["model_responses"] = dict(sorted(doc["model_responses"].items()))  # not by insertion
    reloaded = projection.from_doc(json.loads(json.dumps(doc)))
    for e in b.entries[150:]:
        reloaded = projection.fold(reloaded, e)
    assert len(straight.model_responses) == KEEP_RESPONSES
    assert reloaded.model_responses == straight.model_responses


def test_rows_keep_the_whole_text_and_assistant_responses_are_rows() -> None:
    """The table may shorten a row; its document never does (``text``)."""
    from consumers.analytics import assemble_timeline

    task = "Fix the pagination bug in the orders endpoint. " * 8 + "Then add a regression test."
    reply = "I looked at the handler.\nThe offset is computed from the page number " + "x" * 300
    b = started()
    b.add(EntryKind.USER_TASK, (TextPart(text=task),))
    b.add(EntryKind.ASSISTANT_RESPONSE, (TextPart(text=reply),))
    b.add(EntryKind.ASSISTANT_RESPONSE, (TextPart(text="Done."),))
    state = fold(b.entries)
    [task_row] = rows(state, "task")
    assert len(task_row.summary) <= 106 and task_row.text == task.strip()
    long_reply, short_reply = rows(state, "assistant")
    assert long_reply.text == reply.strip() and "\n" not in long_reply.summary
    assert short_reply.summary == "assistant: Done." and short_reply.text is None
    doc = assemble_timeline(state, [], None, None)
    texts = [r["text"] for r in doc["rows"]]
    assert task.strip() in texts and reply.strip() in texts and "assistant: Done." in texts


def test_the_state_names_the_repository_the_timeline_header_shows() -> None:
    """``repository`` (version 5, the runs list's repository filter) is the first lifecycle
    row's, as the timeline header reads it: a later run-started entry does not change it, and
    a run whose first lifecycle row names none has none."""
    b = EntryBuilder()
    for name in ("github.com/a/one", "github.com/a/two"):
        b.add(EntryKind.RUN_STARTED, (TextPart(text="run started"),), metadata={"repository": name})
    state = fold(b.entries)
    assert state.repository == "github.com/a/one"
    first = next(r for r in state.rows if r.kind == "lifecycle")
    assert first.detail["repository"] == "github.com/a/one"
    b = EntryBuilder()
    b.add(EntryKind.RUN_FINISHED)
    b.add(EntryKind.RUN_STARTED, (TextPart(text="run started"),), metadata={"repository": "x"})
    assert fold(b.entries).repository is None
    for run in simulate_runs(1, 5, seed=7):
        assert fold(run).repository == "github.com/example/shop"
