"""Failure classifications over hand-written runs and simulator runs; the taxonomy is data."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from projectors.base import fold_all
from projectors.failure_classifications import (
    DEFAULT_TAXONOMY,
    FailureClassifications,
    RunDiagnosis,
    Taxonomy,
    TaxonomyError,
    counts,
    explain,
    reclassify,
)
from schemas.factory import EntryBuilder, diff, json_part, model_usage, tool_call, verification
from schemas.models import (
    EntryKind,
    ErrorPart,
    LedgerEntry,
    ModelCallStatus,
    RunStatus,
    ToolResultPart,
    ToolResultStatus,
    VerificationStatus,
)
from streams.simulate import OUTCOMES, simulate_runs

FAILED, PASSED = VerificationStatus.FAILED, VerificationStatus.PASSED
PROJECTION = FailureClassifications()


class Run:
    """A hand-written run: each method appends the entries of one step."""

    def __init__(self, run_id: str = "run-1", fleet_id: str = "fleet-a") -> None:
        self.b = EntryBuilder(run_id, fleet_id=fleet_id)
        self.b.add(EntryKind.RUN_STARTED)
        self.steps = 0

    @property
    def entries(self) -> list[LedgerEntry]:
        return self.b.entries

    def error(self, category: str, signature: str | None = None, message: str = "boom") -> Run:
        part = ErrorPart(category=category, message=message, signature=signature)
        self.b.add(EntryKind.ERROR_EVENT, (part,))
        return self

    def tool(
        self,
        name: str,
        status: ToolResultStatus = ToolResultStatus.FAILED,
        summary: str = "exit 1",
        timed_out: bool = False,
    ) -> Run:
        self.steps += 1
        call_id = f"call-{self.steps}"
        request = tool_call(call_id).model_copy(update={"tool_name": name})
        self.b.add(EntryKind.TOOL_CALL_REQUEST, (request,))
        result = ToolResultPart(
            tool_call_id=call_id,
            status=status,
            exit_code=0 if status is ToolResultStatus.SUCCEEDED else 1,
            timed_out=timed_out,
            summary=summary,
        )
        self.b.add(EntryKind.TOOL_CALL_RESULT, (result,))
        return self

    def verify(self, status: VerificationStatus, check: str = "OrderTest#totals") -> Run:
        part = verification(status).model_copy(update={"check_id": check})
        self.b.add(EntryKind.VERIFIER_RESULT, (part,))
        return self

    def change(self, tree: str | None = None) -> Run:
        self.steps += 1
        part = diff().model_copy(update={"workspace_tree_hash": tree or f"tree-{self.steps}"})
        self.b.add(EntryKind.DIFF_SNAPSHOT, (part,))
        return self

    def model(self, status: ModelCallStatus = ModelCallStatus.OK, reports: int = 1) -> Run:
        """One provider response (its own id), reported ``reports`` times."""
        self.steps += 1
        usage = model_usage(f"resp-{self.steps}").model_copy(update={"status": status})
        for _ in range(reports):
            self.b.add(EntryKind.MODEL_CALL, (usage,))
        return self

    def approval(self, decision: str) -> Run:
        self.b.add(EntryKind.APPROVAL_REQUEST)
        self.b.add(EntryKind.APPROVAL_DECISION, metadata={"decision": decision})
        return self

    def finish(self, status: RunStatus = RunStatus.FAILED) -> list[LedgerEntry]:
        self.b.add(EntryKind.RUN_SUMMARY)
        self.b.add(EntryKind.RUN_FINISHED, run_status=status)
        return self.entries


def fold(
    entries: list[LedgerEntry], projection: FailureClassifications = PROJECTION
) -> RunDiagnosis:
    state = fold_all(projection, entries)
    assert state is not None
    return state


def shipped_data() -> dict[str, Any]:
    text = resources.files("projectors").joinpath("data", DEFAULT_TAXONOMY).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def insert_rule(data: dict[str, Any], at: int, rule: dict[str, Any]) -> dict[str, Any]:
    rules = list(data["rules"])
    rules.insert(at, rule)
    return {**data, "rules": rules}


F = RunStatus.FAILED
ONE_PER_CLASS: dict[str, list[LedgerEntry]] = {
    "none": Run().change().verify(FAILED).change().verify(PASSED).finish(RunStatus.SUCCEEDED),
    "model": Run().change().error("model.invalid_output").finish(F),
    "provider": Run().model().error("provider.rate_limit").finish(F),
    "tool": Run().change().tool("apply_patch").error("tool.failed").finish(F),
    "sandbox": Run().change().error("sandbox.oom").finish(F),
    "context": Run().error("context.overflow").finish(F),
    "verifier": Run().change().verify(FAILED).change().verify(FAILED).finish(F),
    "verifier-flaky": Run().change().verify(PASSED).verify(FAILED).finish(F),
    "policy": Run().approval("APPROVED").finish(RunStatus.POLICY_DENIED),
    "approval-rejected": Run().change().approval("REJECTED").finish(RunStatus.BLOCKED),
    "budget": Run().change().model().finish(RunStatus.BUDGET_EXCEEDED),
    "repository-baseline": Run().verify(FAILED).change().verify(FAILED).finish(F),
    "timeout": Run().change().finish(RunStatus.TIMED_OUT),
    "unknown": Run().change().error("internal", message="worker lost heartbeat").finish(F),
    "step-limit": Run().change().model().finish(RunStatus.STEP_LIMIT),
    "unevaluated": Run().change().finish(RunStatus.SUBMITTED),
}


@pytest.mark.parametrize("expected", sorted(ONE_PER_CLASS))
def test_every_class_has_a_positive_case(expected: str) -> None:
    c = fold(ONE_PER_CLASS[expected]).classification
    assert c.failure_class == expected
    assert c.final and c.taxonomy_version == "failure-taxonomy.v2"
    assert c.explanation and "\n" not in c.explanation
    assert c.evidence and c.evidence[-1].seq == len(ONE_PER_CLASS[expected])  # RUN_FINISHED


def test_the_shipped_taxonomy_declares_every_simulator_class() -> None:
    declared = set(Taxonomy.default().classes)
    assert declared >= {"none", *OUTCOMES[1:]} and set(ONE_PER_CLASS) == declared


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        # evidence other than errors and final status
        (Run().model(ModelCallStatus.RATE_LIMITED).finish(F), "provider"),
        (Run().model(ModelCallStatus.CONTENT_FILTERED).finish(F), "model"),
        (Run().change().tool("apply_patch").finish(F), "tool"),
        (Run().change().tool("run_tests").finish(F), "verifier"),
        (Run().tool("run_tests").change().finish(F), "repository-baseline"),
        (Run().change().tool("shell", ToolResultStatus.DENIED).finish(F), "policy"),
        (Run().change().error("policy.denied").finish(F), "policy"),
        (Run().tool("run_tests", ToolResultStatus.FAILED, timed_out=True).finish(F), "timeout"),
        (Run().error("timeout.wall_clock").finish(F), "timeout"),
        (Run().error("budget.tokens").finish(F), "budget"),
        (Run().change().verify(VerificationStatus.ERROR).finish(F), "verifier"),
        (Run().error("verifier.test_failure").finish(F), "verifier"),
        (Run().finish(F), "unknown"),
        (Run().finish(RunStatus.CANCELLED), "unknown"),
    ],
)
def test_other_evidence_for_a_class(entries: list[LedgerEntry], expected: str) -> None:
    assert fold(entries).classification.failure_class == expected


def test_an_approval_rejected_in_a_json_part() -> None:
    run = Run().change()
    run.b.add(EntryKind.APPROVAL_DECISION, (json_part({"approved": False}),))
    assert fold(run.finish(RunStatus.BLOCKED)).classification.failure_class == "approval-rejected"


@pytest.mark.parametrize(
    ("entries", "expected", "rule"),
    [
        (Run().error("provider.rate_limit").finish(RunStatus.SUCCEEDED), "none", "succeeded"),
        (Run().tool("git_push").error("tool.x").error("policy.denied").finish(F), "policy", ""),
        (Run().change().verify(FAILED).approval("REJECTED").finish(F), "approval-rejected", ""),
        (Run().error("provider.5xx").finish(RunStatus.BUDGET_EXCEEDED), "budget", ""),
        (Run().error("model.bad").error("context.overflow").finish(F), "context", ""),
        (Run().tool("apply_patch").error("tool.x").error("sandbox.oom").finish(F), "sandbox", ""),
        (
            Run().error("model.invalid").model(ModelCallStatus.RATE_LIMITED).finish(F),
            "provider",
            "",
        ),
        # explicit errors outrank what verifier results suggest, even unrecognised ones
        (
            Run().change().verify(FAILED).error("internal").finish(F),
            "unknown",
            "unrecognised-error",
        ),
        (Run().change().verify(PASSED).verify(FAILED).error("tool.x").finish(F), "tool", ""),
        # among verifier evidence: baseline, then flaky, then plain failure
        (
            Run().verify(FAILED, "a").change().verify(PASSED, "b").verify(FAILED, "b").finish(F),
            "repository-baseline",
            "",
        ),
        (
            Run().change().verify(FAILED).verify(PASSED).verify(FAILED).finish(F),
            "verifier-flaky",
            "",
        ),
        (Run().change().tool("apply_patch").verify(FAILED).finish(F), "verifier", "verifier"),
        # recovered evidence does not count: the latest model call and check result decide
        (
            Run().model(ModelCallStatus.RATE_LIMITED).model().change().verify(FAILED).finish(F),
            "verifier",
            "",
        ),
        (
            Run().verify(FAILED, "a").change().verify(PASSED, "a").verify(FAILED, "b").finish(F),
            "verifier",
            "",
        ),
        (Run().approval("REJECTED").approval("APPROVED").change().finish(F), "unknown", ""),
        # a pass and a fail with a code change in between is not flaky; a same-tree diff is none
        (Run().change().verify(PASSED).change().verify(FAILED).finish(F), "verifier", ""),
        (
            Run().change("t1").verify(PASSED).change("t1").verify(FAILED).finish(F),
            "verifier-flaky",
            "",
        ),
    ],
)
def test_precedence(entries: list[LedgerEntry], expected: str, rule: str) -> None:
    c = fold(entries).classification
    assert c.failure_class == expected
    assert not rule or c.rule == rule


def test_a_response_reported_twice_is_one_model_call() -> None:
    once = fold(Run().model(ModelCallStatus.RATE_LIMITED).finish(F))
    twice = fold(Run().model(ModelCallStatus.RATE_LIMITED, reports=2).finish(F))
    assert twice.evidence.model_calls["RATE_LIMITED"].count == 1
    assert twice.classification.failure_class == once.classification.failure_class == "provider"
    recovered = fold(Run().model(ModelCallStatus.RATE_LIMITED).model(reports=2).finish(F))
    assert recovered.evidence.last_model_status is ModelCallStatus.OK


def test_repeated_error_signature_is_a_repair_loop() -> None:
    run = Run().change()
    for _ in range(3):
        run.error("tool.failed", signature="hunk-2").change()
    c = fold(run.finish(F)).classification
    assert c.repair_loop and c.repair_signature == "hunk-2" and c.repair_count == 3
    assert "repair loop without progress: yes" in explain(fold(run.entries))


def test_two_repeats_are_not_a_loop() -> None:
    run = Run().error("tool.failed", signature="hunk-2").error("tool.failed", signature="hunk-2")
    c = fold(run.finish(F)).classification
    assert not c.repair_loop and c.repair_signature == "hunk-2" and c.repair_count == 2


def test_same_tool_failure_is_a_repair_loop_different_failures_are_not() -> None:
    same = Run().change()
    for _ in range(3):
        same.tool("apply_patch", summary="hunk 2 does not apply")
    c = fold(same.finish(F)).classification
    assert c.failure_class == "tool" and c.repair_loop and c.repair_count == 3
    assert c.repair_signature is not None and c.repair_signature.startswith("tool:apply_patch:")
    varied = Run().change()
    for i in range(3):
        varied.tool("apply_patch", summary=f"hunk {i} does not apply")
    assert not fold(varied.finish(F)).classification.repair_loop


def test_errors_without_signature_repeat_by_category_and_message() -> None:
    run = Run().error("model.invalid").error("model.invalid").error("model.invalid")
    assert fold(run.finish(F)).classification.repair_loop


def test_threshold_comes_from_the_taxonomy() -> None:
    entries = Run().error("x", signature="s").error("x", signature="s").finish(F)
    assert not fold(entries).classification.repair_loop
    lower = Taxonomy.model_validate({**shipped_data(), "repair_loop": {"threshold": 2}})
    assert fold(entries, FailureClassifications(lower)).classification.repair_loop


def test_unfinished_run_gets_a_provisional_class() -> None:
    projection = FailureClassifications()
    run = Run().change().verify(FAILED).error("provider.rate_limit")
    state = fold(run.entries, projection)
    c = state.classification
    assert not state.finished and not c.final and c.failure_class == "provider"
    assert "unfinished (provisional class)" in explain(state)
    finished = run.finish(F)
    before, last = state, finished[-1]
    assert projection.fold(state, finished[-2]) == state  # RUN_SUMMARY: not needed
    state = projection.fold(state, last)
    assert state.finished and state.classification.final
    assert state.classification.failure_class == "provider"
    rows = projection.history(before, state, last)
    assert [(r.kind, r.key, r.seq) for r in rows] == [("classification", "final", last.sequence_no)]
    assert rows[0].doc["failure_class"] == "provider" and rows[0].doc["fleet_id"] == "fleet-a"
    assert projection.history(state, state, last) == []


def test_unfinished_run_without_evidence_is_provisionally_unknown() -> None:
    entries = Run().change().verify(PASSED).entries
    state = fold(entries)
    c = state.classification
    assert (c.failure_class, c.rule, c.final) == ("unknown", "in-progress", False)
    assert PROJECTION.history(None, state, entries[-1]) == []


def test_outcome_metadata_is_never_read() -> None:
    entries = Run().change().verify(FAILED).finish(F)
    lying = entries[-1].model_copy(
        update={"metadata": {"outcome": "success"}, "parts": (json_part({"outcome": "success"}),)}
    )
    assert fold([*entries[:-1], lying]) == fold(entries)


def test_a_new_rule_reclassifies_the_same_entries() -> None:
    entries = Run().change().error("sandbox.oom").finish(F)
    assert fold(entries).classification.failure_class == "sandbox"
    data = shipped_data()
    data = insert_rule(
        {**data, "version": "test.v2", "classes": {**data["classes"], "oom": "out of memory"}},
        1,
        {
            "id": "oom",
            "class": "oom",
            "explain": "out of memory",
            "when": {"error": {"category": ["*.oom"]}},
        },
    )
    v2 = FailureClassifications(Taxonomy.model_validate(data))
    c = fold(entries, v2).classification
    assert (c.failure_class, c.rule, c.taxonomy_version) == ("oom", "oom", "test.v2")
    # a document classified by v1 is reclassified when read back by v2
    doc = PROJECTION.to_doc(fold(entries))
    assert v2.from_doc(doc).classification == c
    assert reclassify(fold(entries), v2.taxonomy).classification == c


def test_dropping_a_rule_reclassifies_and_loads_from_a_file(tmp_path: Path) -> None:
    entries = ONE_PER_CLASS["verifier-flaky"]
    data = shipped_data()
    rules = [r for r in data["rules"] if r["id"] != "verifier-flaky"]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**data, "version": "no-flaky.v1", "rules": rules}))
    taxonomy = Taxonomy.load(path)
    assert (
        fold(entries, FailureClassifications(taxonomy)).classification.failure_class == "verifier"
    )


def test_repair_loop_as_a_rule_condition() -> None:
    rule = {"id": "loop", "class": "tool", "explain": "looping", "when": {"repair_loop": True}}
    taxonomy = Taxonomy.model_validate(insert_rule(shipped_data(), 1, rule))
    entries = Run().error("model.x", "s").error("model.x", "s").error("model.x", "s").finish(F)
    c = fold(entries, FailureClassifications(taxonomy)).classification
    assert (c.failure_class, c.rule) == ("tool", "loop") and "repair loop: s x3" in c.explanation


def test_any_all_not_combine_conditions() -> None:
    when = {"all": [{"not": {"finished": False}}, {"any": [{"error": {"category": ["zzz"]}}, {}]}]}
    rule = {"id": "always-when-finished", "class": "unknown", "explain": "x", "when": when}
    taxonomy = Taxonomy.model_validate(insert_rule(shipped_data(), 0, rule))
    projection = FailureClassifications(taxonomy)
    assert fold(ONE_PER_CLASS["none"], projection).classification.rule == "always-when-finished"
    assert fold(Run().entries, projection).classification.rule == "in-progress"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rules": [{"id": "a", "class": "unknown", "explain": "", "when": {"eror": {}}}]}, "eror"),
        ({"rules": [{"id": "a", "class": "nope", "explain": "", "when": {}}]}, "nope"),
        (
            {
                "rules": [
                    {
                        "id": "a",
                        "class": "unknown",
                        "explain": "",
                        "when": {"tool": {"names": ["@x"]}},
                    }
                ]
            },
            "@x",
        ),
        ({"repair_loop": {"threshold": 1}}, "threshold"),
        ({"rules": []}, "rules"),
    ],
)
def test_invalid_taxonomies_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(TaxonomyError, match=r"mine\.json") as info:
        Taxonomy.parse(json.dumps({**shipped_data(), **change}), "mine.json")
    assert message in str(info.value)


def test_unreadable_taxonomy_files_raise(tmp_path: Path) -> None:
    with pytest.raises(TaxonomyError):
        Taxonomy.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TaxonomyError, match=r"bad\.json"):
        Taxonomy.load(tmp_path / "bad.json")


@pytest.mark.parametrize("expected", sorted(ONE_PER_CLASS))
def test_doc_round_trip(expected: str) -> None:
    state = fold(ONE_PER_CLASS[expected])
    doc = json.loads(json.dumps(PROJECTION.to_doc(state)))
    assert PROJECTION.from_doc(doc) == state


def test_only_needed_kinds_other_runs_and_duplicates_are_ignored() -> None:
    entries = Run().change().verify(FAILED).finish(F)
    assert not PROJECTION.accepts(entries[0])  # RUN_STARTED
    state = fold(entries)
    other = Run("run-2").error("policy.denied").entries[-1]
    assert PROJECTION.fold(state, other) == state
    assert PROJECTION.fold(state, entries[-1]) == state


def test_counts_by_fleet_and_class() -> None:
    states = [
        fold(ONE_PER_CLASS["tool"]),
        fold(Run("r2").error("tool.x").finish(F)),
        fold(Run("r3", "fleet-b").error("tool.x").finish(F)),
        fold(Run("r4", "fleet-b").error("tool.x").entries),
    ]
    assert counts(states) == {("fleet-a", "tool"): 2, ("fleet-b", "tool"): 2}
    assert counts(states, final_only=True)[("fleet-b", "tool")] == 1


def test_explain_names_class_rule_and_evidence() -> None:
    text = explain(fold(ONE_PER_CLASS["verifier-flaky"]))
    assert "class: verifier-flaky" in text and "rule verifier-flaky" in text
    assert "pass/fail flips on the same code" in text
    assert "check maven@3.9:OrderTest#totals FAILED" in text


def _honest(run: list[LedgerEntry]) -> list[LedgerEntry]:
    """The run without the simulator's outcome label, which only the test may read."""
    last = run[-1].model_copy(update={"metadata": {}, "parts": ()})
    return [*run[:-1], last]


@pytest.mark.parametrize("seed", [1, 2026])
def test_simulator_runs_get_their_outcome_class(seed: int) -> None:
    seen: set[str] = set()
    for run in simulate_runs(1, 28, seed=seed):
        label = run[-1].metadata["outcome"]
        expected = "none" if label == "success" else label
        c = fold(_honest(run)).classification
        assert c.failure_class == expected, explain(fold(run))
        seen.add(c.failure_class)
    assert seen == {"none", *OUTCOMES[1:]}


def test_simulator_repair_loops() -> None:
    loops = {
        run[-1].metadata["outcome"]
        for run in simulate_runs(1, 14, seed=3)
        if fold(run).classification.repair_loop
    }
    assert loops == {"model", "tool", "verifier"}


# -- taxonomy v2: limits, submissions and their evaluation, the error that ended the run ---------


def test_an_evaluation_verdict_after_a_submission_decides_its_class() -> None:
    submitted = Run().change()
    submitted.finish(RunStatus.SUBMITTED)
    assert fold(submitted.entries).classification.failure_class == "unevaluated"
    submitted.verify(FAILED, check="swe-bench-eval")  # the harness, after RUN_FINISHED
    c = fold(submitted.entries).classification
    assert (c.failure_class, c.rule, c.final) == ("verifier", "submitted-evaluation-failed", True)
    passed = Run().change()
    passed.finish(RunStatus.SUBMITTED)
    passed.verify(PASSED, check="swe-bench-eval")
    assert fold(passed.entries).classification.failure_class == "none"


def test_the_agents_own_checks_are_not_the_evaluation() -> None:
    own = Run().change().verify(PASSED)  # the agent ran the tests itself, then submitted
    assert fold(own.finish(RunStatus.SUBMITTED)).classification.failure_class == "unevaluated"


def test_a_step_limit_is_neither_a_budget_nor_a_timeout() -> None:
    c = fold(Run().change().finish(RunStatus.STEP_LIMIT)).classification
    assert (c.failure_class, c.rule) == ("step-limit", "step-limit")


def test_a_recovered_early_error_does_not_outrank_the_one_that_ended_the_run() -> None:
    # the sandbox ran out of memory early and was restarted; the model's output ended the run
    entries = Run().error("sandbox.oom").change().error("model.invalid_output").finish(F)
    assert fold(entries).classification.failure_class == "model"
    v1 = Taxonomy.parse(
        (
            Path(__file__).parents[2] / "projectors" / "data" / "failure_taxonomy.v1.json"
        ).read_bytes()
    )
    before = fold_all(FailureClassifications(v1), entries)
    assert before is not None and before.classification.failure_class == "sandbox"  # v1 did


def test_a_tool_outcome_the_log_did_not_record_is_not_a_failure() -> None:
    unknown = Run().change().tool("apply_patch", ToolResultStatus.UNKNOWN)
    c = fold(unknown.finish(F)).classification
    assert c.failure_class != "tool", c  # a failed apply_patch would make it "tool"
    failed = Run().change().tool("apply_patch", ToolResultStatus.FAILED)
    assert fold(failed.finish(F)).classification.failure_class == "tool"
