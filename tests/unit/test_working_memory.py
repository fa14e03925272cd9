"""Working memory is an evidence-bound fold over one run's entries."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from pydantic import ValidationError

from projectors.base import fold_all
from projectors.working_memory import (
    WorkingMemory,
    WorkingMemoryProjection,
    memory_at,
)
from schemas.factory import EntryBuilder, artifact_part, json_part, sample_run, tool_call
from schemas.models import (
    Causation,
    DiffFile,
    DiffPart,
    EntryKind,
    ErrorPart,
    FileChangeStatus,
    FileClassification,
    LedgerEntry,
    MemoryProposalPart,
    PermissionClass,
    ProposedDecision,
    ProposedFact,
    ProposedProblem,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    ToolResultStatus,
    VerificationPart,
    VerificationStatus,
    Visibility,
)
from streams.simulate import OUTCOMES, simulate_runs

GOAL = "Fix the totals of OrderService"
CHECK = "OrderServiceTest#totals"


def _fold(entries: list[LedgerEntry]) -> WorkingMemory:
    state = fold_all(WorkingMemoryProjection(), entries)
    assert state is not None
    return state


def _run(goal: str = GOAL) -> EntryBuilder:
    b = EntryBuilder()
    b.add(EntryKind.RUN_STARTED)
    b.add(EntryKind.USER_TASK, (TextPart(text=goal),))
    return b


def _tool(
    b: EntryBuilder, call_id: str, status: ToolResultStatus | None = ToolResultStatus.SUCCEEDED
) -> LedgerEntry:
    """A tool call and (unless status is None) its result; returns the last entry."""
    request = b.add(
        EntryKind.TOOL_CALL_REQUEST,
        (_test_run(call_id, b.time(len(b.entries) + 1)),),
        causation=Causation(tool_call_id=call_id),
    )
    if status is None:
        return request
    result = ToolResultPart(
        tool_call_id=call_id,
        status=status,
        exit_code=0 if status is ToolResultStatus.SUCCEEDED else 1,
        timed_out=status is ToolResultStatus.TIMED_OUT,
        summary=f"{call_id}: {status.value}",
        artifact_refs=(artifact_part(f"{call_id}-stdout").to_ref(),),
    )
    return b.add(
        EntryKind.TOOL_CALL_RESULT,
        (result,),
        causation=Causation(parent_entry_id=request.entry_id, tool_call_id=call_id),
    )


def _test_run(call_id: str, at: datetime) -> ToolCallPart:
    """A test run: a tool that executes (a read's success would show only what exists)."""
    return tool_call(call_id, at).model_copy(
        update={"tool_name": "maven.test", "permission_class": PermissionClass.EXECUTE_SAFE}
    )


def _verifier(b: EntryBuilder, status: VerificationStatus, check: str = CHECK) -> LedgerEntry:
    part = VerificationPart(verifier="maven", profile="unit", status=status, check_id=check)
    return b.add(EntryKind.VERIFIER_RESULT, (part,))


def _propose(
    b: EntryBuilder,
    facts: tuple[ProposedFact, ...] = (),
    problems: tuple[ProposedProblem, ...] = (),
    decisions: tuple[ProposedDecision, ...] = (),
) -> LedgerEntry:
    part = MemoryProposalPart(facts=facts, problems=problems, decisions=decisions)
    return b.add(EntryKind.MEMORY_UPDATE_PROPOSED, (part,))


def _fact(text: str, *refs: str) -> ProposedFact:
    return ProposedFact(fact=text, evidence_refs=refs)


def _diff(b: EntryBuilder, *changes: tuple[str, FileChangeStatus, str | None]) -> None:
    files = tuple(
        DiffFile(
            path=path,
            status=status,
            lines_added=1,
            lines_deleted=0,
            classification=FileClassification.SOURCE,
            old_path=old,
        )
        for path, status, old in changes
    )
    b.add(EntryKind.DIFF_SNAPSHOT, (DiffPart(files=files),))


def _facts(state: WorkingMemory) -> list[str]:
    return [f.fact for f in state.active_facts()]


def _rejected(state: WorkingMemory) -> dict[str, str]:
    return {c.claim: c.reason for c in state.unsupported_claims}


def test_projection_contract() -> None:
    projection = WorkingMemoryProjection()
    assert (projection.name, projection.version, projection.hot) == ("working-memory", 9, True)
    assert projection.state_type is WorkingMemory
    first = _run().entries[0]
    assert projection.accepts(first)
    assert projection.initial(first) == WorkingMemory(run_id="run-1", fleet_id="fleet-a")


def test_state_is_frozen_and_strict() -> None:
    state = _fold(_run().entries)
    with pytest.raises(ValidationError):
        state.task_goal = "other"
    with pytest.raises(ValidationError):
        WorkingMemory.model_validate({"run_id": "r", "fleet_id": "f", "mood": "great"})


def test_goal_plan_and_source_range() -> None:
    b = _run()
    plan = "Plan: 1. read the code 2. reproduce with a test 3. fix 4. run the tests"
    b.add(EntryKind.ASSISTANT_RESPONSE, (TextPart(text=plan),), metadata={"plan": plan})
    b.add(EntryKind.ASSISTANT_RESPONSE, (TextPart(text="thinking"),))
    state = _fold(b.entries)
    assert state.task_goal == GOAL
    assert state.current_plan == ("read the code", "reproduce with a test", "fix", "run the tests")
    assert state.source_seq_range == (1, 4)
    assert state.snapshot_at == b.entries[2].occurred_at

    b.add(EntryKind.ASSISTANT_RESPONSE, metadata={"plan": json.dumps(["inspect", "migrate"])})
    assert _fold(b.entries).current_plan == ("inspect", "migrate")


def test_fact_whose_evidence_resolves_is_known() -> None:
    b = _run()
    _tool(b, "call-1")
    _propose(
        b,
        facts=(
            _fact("The repository uses Maven.", "entry:run-1-e2", "tool-call:call-1"),
            _fact("OrderService has 3 callers.", "artifact:art-call-1-stdout"),
        ),
    )
    state = _fold(b.entries)
    assert _facts(state) == ["The repository uses Maven.", "OrderService has 3 callers."]
    assert state.known_facts[0].evidence == ("entry:run-1-e2", "tool-call:call-1")
    assert state.unsupported_claims == ()


def test_drill_3_invented_fact_is_rejected_and_never_known() -> None:
    b = _run()
    _propose(
        b,
        facts=(
            _fact("The code is probably fine now."),
            _fact("The bug is in the ORM.", "entry:does-not-exist"),
            _fact("Only service-a may change.", "task:scope"),
        ),
    )
    state = _fold(b.entries)
    assert state.known_facts == ()
    assert state.active_facts() == ()
    reasons = _rejected(state)
    assert reasons["The code is probably fine now."] == "no evidence cited"
    assert "entry:does-not-exist" in reasons["The bug is in the ORM."]
    assert "task:scope" in reasons["Only service-a may change."]
    assert {c.kind for c in state.unsupported_claims} == {"fact"}
    assert {c.proposed_at_seq for c in state.unsupported_claims} == {3}


def test_fact_partly_unresolved_is_rejected() -> None:
    b = _run()
    _propose(b, facts=(_fact("The repository uses Maven.", "entry:run-1-e2", "entry:nope"),))
    state = _fold(b.entries)
    assert state.known_facts == ()
    assert "entry:nope" in _rejected(state)["The repository uses Maven."]


@pytest.mark.parametrize(
    "refs",
    [
        ("tool-call:call-t",),
        ("entry:run-1-e4",),  # the failed result entry
        ("artifact:art-call-t-stdout",),  # the failed call's output
        ("tool-call:call-t", "entry:run-1-e2"),  # a neutral entry confirms nothing
    ],
)
def test_success_claim_citing_failed_tool_call_is_unsupported(refs: tuple[str, ...]) -> None:
    b = _run()
    _tool(b, "call-t", ToolResultStatus.FAILED)
    _propose(b, facts=(_fact("All tests pass.", *refs),))
    state = _fold(b.entries)
    assert "All tests pass." not in _facts(state)
    assert "claims success" in _rejected(state)["All tests pass."]


def test_timed_out_or_unanswered_call_supports_no_success() -> None:
    b = _run()
    _tool(b, "call-slow", ToolResultStatus.TIMED_OUT)
    _tool(b, "call-open", None)
    _propose(
        b,
        facts=(
            _fact("The e2e suite passed.", "tool-call:call-slow"),
            _fact("The build succeeded.", "tool-call:call-open"),
        ),
    )
    state = _fold(b.entries)
    assert state.known_facts == ()
    assert "(pending)" in _rejected(state)["The build succeeded."]


@pytest.mark.parametrize(
    ("claim", "refs", "reason"),
    [
        # both kinds of word: no clear polarity, and the only evidence failed
        ("All tests pass with no failures", ("tool-call:call-t",), "does not clearly claim"),
        ("Fixed the failing test", ("tool-call:call-t",), "does not clearly claim"),
        # no listed word at all: a failed call supports nothing but a failure
        ("The project compiles", ("tool-call:call-t",), "does not clearly claim"),
        ("The project compiles", ("artifact:art-call-t-stdout", "entry:run-1-e5"), "(failed)"),
        # a success claim needs a success: a file observation alone is neutral
        ("All tests pass", ("entry:run-1-e5",), "claims success but cites no success"),
        ("The build works", ("entry:run-1-e2", "entry:run-1-e5"), "cites no success"),
    ],
)
def test_failed_or_neutral_evidence_supports_no_unclear_or_success_claim(
    claim: str, refs: tuple[str, ...], reason: str
) -> None:
    b = _run()
    _tool(b, "call-t", ToolResultStatus.FAILED)  # e3, e4
    b.add(EntryKind.FILE_OBSERVATION)  # e5, neutral
    _propose(b, facts=(_fact(claim, *refs),))
    state = _fold(b.entries)
    assert state.known_facts == ()
    assert reason in _rejected(state)[claim]


@pytest.mark.parametrize(
    ("claim", "refs"),
    [
        ("The build fails", ("tool-call:call-t",)),
        ("The test does not pass", ("artifact:art-call-t-stdout",)),
        ("The project compiles", ("tool-call:call-ok",)),
        ("The project compiles", ("entry:run-1-e5",)),  # neutral claim, neutral evidence
        ("Fixed the failing test", ("tool-call:call-t", "tool-call:call-ok")),
        ("All tests pass", ("tool-call:call-ok", "entry:run-1-e5")),
        ("All tests pass", ("entry:run-1-e8",)),  # a passing verifier
    ],
)
def test_claims_with_fitting_evidence_are_accepted(claim: str, refs: tuple[str, ...]) -> None:
    """Accepted: a failure as an open problem (something to solve), anything else as a fact."""
    b = _run()
    _tool(b, "call-t", ToolResultStatus.FAILED)  # e3, e4
    b.add(EntryKind.FILE_OBSERVATION)  # e5
    _tool(b, "call-ok")  # e6, e7
    _verifier(b, VerificationStatus.PASSED)  # e8
    _propose(b, facts=(_fact(claim, *refs),))
    state = _fold(b.entries)
    accepted = _facts(state) + [p.problem for p in state.open_problems]
    assert claim in accepted, _rejected(state)
    assert (claim in _facts(state)) == (claim not in ("The build fails", "The test does not pass"))


@pytest.mark.parametrize("stored_first", [True, False])
def test_an_artifact_resolves_to_the_worst_outcome_of_the_entries_carrying_it(
    stored_first: bool,
) -> None:
    stored = (artifact_part("x"),)  # art-x
    b = _run()
    if stored_first:
        b.add(EntryKind.ARTIFACT_STORED, stored)  # e3: neutral
    request = b.add(
        EntryKind.TOOL_CALL_REQUEST,
        (tool_call("call-x", b.time(len(b.entries) + 1)),),
        causation=Causation(tool_call_id="call-x"),
    )
    failed = ToolResultPart(
        tool_call_id="call-x",
        status=ToolResultStatus.FAILED,
        exit_code=1,
        timed_out=False,
        summary="2 tests failed",
        artifact_refs=(artifact_part("x").to_ref(),),
    )
    b.add(
        EntryKind.TOOL_CALL_RESULT,
        (failed,),
        causation=Causation(parent_entry_id=request.entry_id, tool_call_id="call-x"),
    )
    if not stored_first:
        b.add(EntryKind.ARTIFACT_STORED, stored)
    _propose(b, facts=(_fact("All tests pass", "artifact:art-x"),))
    _propose(b, facts=(_fact("Two tests fail", "artifact:art-x"),))
    state = _fold(b.entries)
    assert _facts(state) == []
    assert [p.problem for p in state.open_problems] == ["Two tests fail"]
    assert "artifact:art-x (failed)" in _rejected(state)["All tests pass"]


def test_an_artifact_stored_then_carried_by_a_success_supports_success() -> None:
    b = _run()
    b.add(EntryKind.ARTIFACT_STORED, (artifact_part("call-ok-stdout"),))
    _tool(b, "call-ok")  # its result carries art-call-ok-stdout too
    _propose(b, facts=(_fact("All tests pass", "artifact:art-call-ok-stdout"),))
    assert _facts(_fold(b.entries)) == ["All tests pass"]


def test_failure_claims_and_mixed_evidence_are_judged_by_polarity() -> None:
    b = _run()
    _tool(b, "call-red", ToolResultStatus.FAILED)
    _tool(b, "call-green", ToolResultStatus.SUCCEEDED)
    _propose(
        b,
        facts=(
            _fact("OrderServiceTest fails on totals.", "tool-call:call-red"),
            _fact("The test does not pass on the base commit.", "tool-call:call-red"),
            _fact("The suite passes after the fix.", "tool-call:call-red", "tool-call:call-green"),
            _fact("The search failed.", "tool-call:call-green"),
        ),
    )
    state = _fold(b.entries)
    assert _facts(state) == []
    assert [p.problem for p in state.open_problems] == [
        "OrderServiceTest fails on totals.",
        "The test does not pass on the base commit.",
    ]
    rejected = _rejected(state)
    assert "claims failure" in rejected["The search failed."]
    # a failure among the refs defeats a success, whatever else it cites (issue 14)
    assert "claims success" in rejected["The suite passes after the fix."]


def test_refs_to_another_run_or_a_later_entry_never_resolve() -> None:
    other = EntryBuilder("run-2")
    other.add(EntryKind.RUN_STARTED)
    b = _run()
    _propose(
        b,
        facts=(
            _fact("Run 2 saw the bug.", f"entry:{other.entry_id(1)}"),
            _fact("The file was read.", "entry:run-1-e5"),  # exists only later
        ),
    )
    b.add(EntryKind.FILE_OBSERVATION)
    b.add(EntryKind.FILE_OBSERVATION)
    state = _fold(b.entries)
    assert state.index.entries.get("run-1-e5") is not None
    assert state.known_facts == ()
    assert set(_rejected(state)) == {"Run 2 saw the bug.", "The file was read."}


def test_fact_citing_only_the_agents_own_words_is_unsupported() -> None:
    b = _run()
    said = b.add(EntryKind.ASSISTANT_RESPONSE, (TextPart(text="Maven is used."),))
    _propose(b, facts=(_fact("The repository uses Maven.", f"entry:{said.entry_id}"),))
    state = _fold(b.entries)
    assert _rejected(state) == {
        "The repository uses Maven.": "cites only the agent's own statements"
    }


def test_problems_and_decisions_need_resolving_evidence() -> None:
    b = _run()
    failed = _tool(b, "call-t", ToolResultStatus.FAILED)
    _propose(
        b,
        problems=(
            ProposedProblem(
                problem="totals test fails", evidence_refs=(f"entry:{failed.entry_id}",)
            ),
            ProposedProblem(problem="CI is flaky", evidence_refs=()),
        ),
        decisions=(
            ProposedDecision(
                decision="Limit changes to service-a.",
                reason="Task scope.",
                evidence_refs=("entry:run-1-e2",),
            ),
            ProposedDecision(decision="Rewrite the ORM.", reason="Feels right.", evidence_refs=()),
        ),
    )
    state = _fold(b.entries)
    assert [p.problem for p in state.open_problems] == ["totals test fails"]
    assert state.open_problems[0].opened_at_seq == 5
    assert [d.decision for d in state.decisions] == ["Limit changes to service-a."]
    assert state.decisions[0].reason == "Task scope."
    kinds = {c.claim: c.kind for c in state.unsupported_claims}
    assert kinds == {"CI is flaky": "problem", "Rewrite the ORM.": "decision"}


def test_superseded_fact_is_kept_with_a_link() -> None:
    b = _run()
    _tool(b, "call-red", ToolResultStatus.FAILED)
    _propose(b, facts=(_fact("OrderServiceTest fails.", "tool-call:call-red"),))
    _tool(b, "call-green")
    _propose(b, facts=(_fact("OrderServiceTest passes.", "tool-call:call-green"),))
    state = _fold(b.entries)
    (closed,) = state.closed_problems  # a failure claim is a problem; the backed pass closes it
    assert (closed.problem, closed.closed_by, closed.closed_at_seq) == (
        "OrderServiceTest fails.",
        "entry:run-1-e8",
        8,
    )
    assert state.open_problems == () and _facts(state) == ["OrderServiceTest passes."]

    _tool(b, "call-red-again", ToolResultStatus.FAILED)
    _propose(b, facts=(_fact("OrderServiceTest fails.", "tool-call:call-red-again"),))
    state = _fold(b.entries)
    (old,) = state.known_facts
    assert (old.fact, old.status, old.superseded_by) == (
        "OrderServiceTest passes.",
        "superseded",
        "entry:run-1-e11",
    )
    assert [p.problem for p in state.open_problems] == ["OrderServiceTest fails."]


def test_same_fact_again_merges_evidence() -> None:
    b = _run()
    _tool(b, "call-1")
    _propose(b, facts=(_fact("The repository uses Maven.", "entry:run-1-e2"),))
    _propose(b, facts=(_fact("the repository uses maven", "tool-call:call-1"),))
    state = _fold(b.entries)
    assert len(state.known_facts) == 1
    assert state.known_facts[0].evidence == ("entry:run-1-e2", "tool-call:call-1")


def test_verifier_failure_opens_a_problem_that_a_pass_of_the_same_check_closes() -> None:
    b = _run()
    failing = _verifier(b, VerificationStatus.FAILED)
    other = _verifier(b, VerificationStatus.PASSED, check="OrderServiceTest#discounts")
    opened = _fold(b.entries)
    assert [p.key for p in opened.open_problems] == [f"check:{CHECK}"]
    assert opened.open_problems[0].evidence == (f"entry:{failing.entry_id}",)
    assert opened.open_problems[0].opened_at_seq == failing.sequence_no
    assert [f.evidence for f in opened.active_facts()] == [(f"entry:{other.entry_id}",)]

    passing = _verifier(b, VerificationStatus.PASSED)
    state = _fold(b.entries)
    assert state.open_problems == ()
    (closed,) = state.closed_problems
    assert (closed.closed_by, closed.closed_at_seq) == (f"entry:{passing.entry_id}", 5)
    assert closed.problem == opened.open_problems[0].problem
    derived = state.active_facts()[-1]
    assert (derived.source, derived.evidence) == ("verifier", (f"entry:{passing.entry_id}",))
    assert CHECK in derived.fact and "passed" in derived.fact


def test_repeated_failure_keeps_one_problem_and_skipped_does_nothing() -> None:
    b = _run()
    first = _verifier(b, VerificationStatus.FAILED)
    second = _verifier(b, VerificationStatus.ERROR)
    _verifier(b, VerificationStatus.SKIPPED)
    state = _fold(b.entries)
    (problem,) = state.open_problems
    assert problem.evidence == (f"entry:{first.entry_id}", f"entry:{second.entry_id}")


def test_verifier_outcomes_supersede_facts_about_their_check() -> None:
    b = _run()
    failing = _verifier(b, VerificationStatus.FAILED)
    _propose(b, facts=(_fact("totals still fails", f"entry:{failing.entry_id}"),))
    assert [p.problem for p in _fold(b.entries).open_problems][-1] == "totals still fails"
    passing = _verifier(b, VerificationStatus.PASSED)
    after_pass = _fold(b.entries)
    assert after_pass.open_problems == (), "a pass closes every problem that mentions the check"
    assert {p.closed_by for p in after_pass.closed_problems} == {f"entry:{passing.entry_id}"}
    assert len(after_pass.active_facts()) == 1  # the pass, as a fact

    again = _verifier(b, VerificationStatus.FAILED)
    state = _fold(b.entries)
    assert state.active_facts() == ()
    assert state.known_facts[0].superseded_by == f"entry:{again.entry_id}"
    assert len(state.open_problems) == 1 and len(state.closed_problems) == 2


def test_a_pass_of_a_check_closes_failure_claims_that_name_its_test() -> None:
    """Issue 14 #6: after test_last_page passed, "tests fail on test_last_page" is not active."""
    b = _run()
    check = "tests/test_pages.py::test_last_page"
    failing = _verifier(b, VerificationStatus.FAILED, check=check)
    _propose(b, facts=(_fact("tests fail on test_last_page", f"entry:{failing.entry_id}"),))
    _verifier(b, VerificationStatus.PASSED, check=check)
    state = _fold(b.entries)
    assert state.open_problems == ()
    assert [f.fact for f in state.active_facts()] == [f"{check} (maven/unit) passed"]


def test_compaction_that_keeps_goal_and_open_problems_is_not_flagged() -> None:
    b = _run()
    _verifier(b, VerificationStatus.FAILED)
    summary = f"Goal: {GOAL}. Open problem: totals still fails. Done: read the code."
    b.add(
        EntryKind.COMPACTION,
        (TextPart(text=summary),),
        metadata={"replaces_through_seq": "2"},
    )
    assert _fold(b.entries).flags == ()


def test_compaction_that_drops_goal_or_open_problem_is_flagged() -> None:
    b = _run()
    failed = _tool(b, "call-t", ToolResultStatus.FAILED)
    _propose(
        b,
        problems=(
            ProposedProblem(
                problem="the mock still uses the old constructor",
                evidence_refs=(f"entry:{failed.entry_id}",),
            ),
        ),
    )
    b.add(EntryKind.COMPACTION, (TextPart(text="Summary of turns 1-4: tests were run."),))
    state = _fold(b.entries)
    assert state.flags == (
        "compaction run-1-e6 (seq 6) drops the task goal",
        "compaction run-1-e6 (seq 6) drops open problem: the mock still uses the old constructor",
    )
    b.add(EntryKind.COMPACTION, (artifact_part("history"),))
    assert "not inline" in _fold(b.entries).flags[-1]


def test_compaction_summary_as_json_counts() -> None:
    b = _run()
    doc = {"goal": GOAL, "openProblems": [], "facts": []}
    b.add(EntryKind.COMPACTION, (json_part(doc, "summary@1"),))
    assert _fold(b.entries).flags == ()


def test_changed_files_drop_files_created_and_deleted_in_the_run() -> None:
    b = _run()
    added, modified, deleted = (
        FileChangeStatus.ADDED,
        FileChangeStatus.MODIFIED,
        FileChangeStatus.DELETED,
    )
    _diff(b, ("src/b.py", modified, None), ("src/scratch.py", added, None))
    _diff(b, ("src/a.py", modified, None), ("src/tmp.py", added, None))
    b.add(EntryKind.DIFF_OBSERVATION, (DiffPart(files=()),))
    _diff(b, ("src/scratch.py", deleted, None), ("src/old.py", deleted, None))
    _diff(b, ("src/kept.py", FileChangeStatus.RENAMED, "src/tmp.py"))
    state = _fold(b.entries)
    assert state.changed_files == ("src/a.py", "src/b.py", "src/kept.py", "src/old.py")
    _diff(b, ("src/kept.py", deleted, None))
    assert "src/kept.py" not in _fold(b.entries).changed_files


def test_blockers_follow_approvals_and_policy_denials() -> None:
    b = _run()
    b.add(  # shown to a human only: nothing of it reaches the memory a model reads
        EntryKind.APPROVAL_REQUEST,
        (TextPart(text="push with token?"),),
        metadata={"action": "git_push to prod with the deploy token"},
    )
    assert _fold(b.entries).blocked_by == ()
    request = b.add(
        EntryKind.APPROVAL_REQUEST,
        (TextPart(text="push?"),),
        metadata={"action": "git_push"},
        visibility=Visibility.MODEL_VISIBLE,
    )
    pending = _fold(b.entries)
    assert [(x.kind, x.blocker) for x in pending.blocked_by] == [
        ("approval-pending", "awaiting approval: git_push")
    ]
    assert pending.blocked_by[0].evidence == f"entry:{request.entry_id}"

    b.add(EntryKind.APPROVAL_DECISION, (json_part({"approved": True}),))
    assert _fold(b.entries).blocked_by == ()

    b.add(
        EntryKind.APPROVAL_REQUEST,
        metadata={"action": "open_pr"},
        visibility=Visibility.MODEL_VISIBLE,
    )
    b.add(EntryKind.APPROVAL_DECISION, (TextPart(text="no"),), metadata={"decision": "REJECTED"})
    denial = ErrorPart(category="policy.denied", message="push to protected branch denied")
    b.add(EntryKind.ERROR_EVENT, (denial,))
    hidden = ErrorPart(category="policy.denied", message="audit: rule 7 matched")
    b.add(EntryKind.ERROR_EVENT, (hidden,), visibility=Visibility.AUDIT_ONLY)
    state = _fold(b.entries)
    assert [(x.kind, x.blocker) for x in state.blocked_by] == [
        ("approval-rejected", "approval rejected: open_pr"),
        ("policy-denied", "policy denied: push to protected branch denied"),
    ]


def test_snapshot_version_changes_only_with_content() -> None:
    b = _run()
    started = _fold(b.entries[:1])
    assert (started.snapshot_version, started.snapshot_at) == (0, None)
    with_goal = _fold(b.entries)
    assert with_goal.snapshot_version == 1

    _tool(b, "call-1")
    b.add(EntryKind.MODEL_CALL)
    b.add(EntryKind.ASSISTANT_RESPONSE, metadata={"plan": "1. a 2. b"})
    b.add(EntryKind.ASSISTANT_RESPONSE, metadata={"plan": "1. a 2. b"})
    b.add(EntryKind.DIFF_SNAPSHOT, (DiffPart(files=()),))
    _propose(b, facts=(_fact("Maven.", "entry:run-1-e2"),))
    _propose(b, facts=(_fact("Maven.", "entry:run-1-e2"),))
    state = _fold(b.entries)
    assert state.snapshot_version == 3  # goal, plan, fact
    assert state.snapshot_at == b.entries[8].occurred_at  # the first fact
    assert state.source_seq_range == (1, len(b.entries))


def test_duplicates_and_other_runs_leave_state_unchanged() -> None:
    projection = WorkingMemoryProjection()
    b = _run()
    state = _fold(b.entries)
    assert projection.fold(state, b.entries[-1]) == state
    stranger = EntryBuilder("run-9").add(EntryKind.USER_TASK, (TextPart(text="other"),))
    assert projection.fold(state, stranger) == state


def test_doc_round_trip() -> None:
    projection = WorkingMemoryProjection()
    for entries in (sample_run(), next(iter(simulate_runs(1, 1, seed=5)))):
        state = _fold(entries)
        doc = projection.to_doc(state)
        assert json.loads(json.dumps(doc)) == doc
        assert projection.from_doc(doc) == state


def test_memory_at_is_the_fold_of_the_prefix() -> None:
    run = next(iter(simulate_runs(1, 1, seed=7)))
    assert memory_at(run, 0) is None
    for seq in (1, 10, 22, len(run)):
        assert memory_at(list(reversed(run)), seq) == _fold(run[:seq])
    before = memory_at(run, 21)
    assert before is not None and before.unsupported_claims == ()


def test_sample_run_keeps_its_evidence_bound_memory() -> None:
    state = _fold(sample_run())
    assert "The repository uses Maven." in _facts(state)
    assert [d.decision for d in state.decisions] == ["Limit changes to service-a."]
    assert state.unsupported_claims == ()
    assert state.blocked_by == ()


def test_simulated_runs_give_sensible_memory() -> None:
    runs = list(simulate_runs(1, len(OUTCOMES), seed=11))
    for outcome, run in zip(OUTCOMES, runs, strict=True):
        state = _fold(run)
        goal = run[[e.kind for e in run].index(EntryKind.USER_TASK)].parts[0]
        assert isinstance(goal, TextPart) and state.task_goal == goal.text
        assert state.current_plan and state.source_seq_range == (1, len(run))
        assert state.flags == ()
        assert not any("scratch_debug" in path for path in state.changed_files)
        if outcome == "repository-baseline":
            continue
        rejected = _rejected(state)
        assert "does-not-exist" in rejected["the bug is in the ORM"]
        assert "claims success" in rejected["all tests pass"]
        assert "all tests pass" not in _facts(state)
        if outcome == "success":
            assert state.open_problems == () and len(state.closed_problems) == 2
        if outcome == "verifier":
            assert state.open_problems
        if outcome == "policy":  # the simulator records the denial AUDIT_ONLY: not for a model
            assert not any(x.kind == "policy-denied" for x in state.blocked_by)


def test_shared_folds_change_no_result_and_share_the_second_fold() -> None:
    """context-manifests keeps its own working memory: a worker folding both shares the second
    fold of each entry (issue 25), and the results are those of folding each alone."""
    from projectors.context_manifests import ContextManifestsProjection
    from projectors.working_memory import SHARED_FOLDS, SharedFolds

    entries = next(iter(simulate_runs(1, 1, seed=9, entries_per_run=120)))
    wm, cm = WorkingMemoryProjection(), ContextManifestsProjection()
    SHARED_FOLDS.clear()
    alone_wm = fold_all(wm, entries)
    SHARED_FOLDS.clear()
    alone_cm = fold_all(cm, entries)
    SHARED_FOLDS.clear()

    hits = SHARED_FOLDS.hits
    memory, context = None, None
    for entry in entries[:3]:  # not armed (a reader's refold): nothing kept, nothing shared
        wm.fold(wm.initial(entry), entry)
    assert SHARED_FOLDS.hits == hits and not SHARED_FOLDS._done
    SHARED_FOLDS.arm()  # as the engine does for a batch's folds
    for entry in entries:  # as a batch folds them: each entry onto both projections
        memory = wm.fold(memory or wm.initial(entry), entry)
        context = cm.fold(context or cm.initial(entry), entry)
    assert memory is not None and context is not None
    assert SHARED_FOLDS.hits - hits == len(entries)  # every second fold shared
    SHARED_FOLDS.clear()
    assert context.memory is memory  # one object from then on
    assert alone_wm is not None and alone_cm is not None
    assert wm.to_json(memory) == wm.to_json(alone_wm)
    assert cm.checkpoint_json(cm.finish(context)) == cm.checkpoint_json(cm.finish(alone_cm))

    # an equal state (not the same object) is shared too; a different one is folded
    folds = SharedFolds()
    folds.arm()
    first = entries[0]
    start = wm.initial(first)
    once = folds.fold(start, first)
    assert folds.fold(start.model_copy(), first) is once and folds.hits == 1
    other = start.model_copy(update={"run_id": "other-run"})
    assert folds.fold(other, first) is other  # another run's state: not this entry's
    assert folds.hits == 1
    # another decoded copy of the entry is folded again, not looked up
    again = LedgerEntry.model_validate(first.model_dump())
    assert folds.fold(start, again) == once and folds.hits == 1
