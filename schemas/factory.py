"""Valid sample entries of every kind and part type for tests; deterministic (no clock, no RNG).

`EntryBuilder` numbers one run's entries 1, 2, 3, ... and derives ids and times from the sequence;
`sample_run()` is a coherent run that uses every entry kind, with tool calls balanced by results
and memory evidence that resolves to entries of the run.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from schemas import models as m

BASE_TIME = datetime(2026, 7, 4, 3, 0, 0, 123456, tzinfo=UTC)
A, T, V = m.ActorType, m.TrustLevel, m.Visibility
# Who typically publishes each kind, with which trust label and visibility.
PROFILES: dict[m.EntryKind, tuple[m.ActorType, m.TrustLevel, m.Visibility]] = {
    m.EntryKind.SYSTEM_INSTRUCTION: (A.SYSTEM, T.PLATFORM_TRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.DEVELOPER_INSTRUCTION: (A.SYSTEM, T.PLATFORM_TRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.ORG_POLICY: (A.SYSTEM, T.ORG_TRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.REPOSITORY_INSTRUCTION: (A.TOOL, T.REPOSITORY_UNTRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.USER_TASK: (A.USER, T.USER_TRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.AGENT_THOUGHT_SUMMARY: (A.AGENT, T.MODEL_GENERATED, V.AUDIT_ONLY),
    m.EntryKind.ASSISTANT_RESPONSE: (A.AGENT, T.MODEL_GENERATED, V.MODEL_VISIBLE),
    m.EntryKind.TOOL_CALL_REQUEST: (A.AGENT, T.MODEL_GENERATED, V.MODEL_VISIBLE),
    m.EntryKind.TOOL_CALL_RESULT: (A.TOOL, T.TOOL_TRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.FILE_OBSERVATION: (A.TOOL, T.REPOSITORY_UNTRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.DIFF_OBSERVATION: (A.TOOL, T.TOOL_TRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.VERIFIER_RESULT: (A.VERIFIER, T.TOOL_TRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.JUDGE_RESULT: (A.JUDGE, T.MODEL_GENERATED, V.HUMAN_VISIBLE),
    m.EntryKind.APPROVAL_REQUEST: (A.ORCHESTRATOR, T.PLATFORM_TRUSTED, V.HUMAN_VISIBLE),
    m.EntryKind.APPROVAL_DECISION: (A.HUMAN_REVIEWER, T.USER_TRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.RUN_SUMMARY: (A.AGENT, T.MODEL_GENERATED, V.HUMAN_VISIBLE),
    m.EntryKind.ERROR_EVENT: (A.SYSTEM, T.TOOL_TRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.RUN_STARTED: (A.ORCHESTRATOR, T.PLATFORM_TRUSTED, V.INTERNAL_ONLY),
    m.EntryKind.RUN_FINISHED: (A.ORCHESTRATOR, T.PLATFORM_TRUSTED, V.INTERNAL_ONLY),
    m.EntryKind.MODEL_CALL: (A.ORCHESTRATOR, T.PLATFORM_TRUSTED, V.AUDIT_ONLY),
    m.EntryKind.CONTEXT_PROJECTED: (A.ORCHESTRATOR, T.PLATFORM_TRUSTED, V.AUDIT_ONLY),
    m.EntryKind.DIFF_SNAPSHOT: (A.ORCHESTRATOR, T.TOOL_TRUSTED, V.MODEL_VISIBLE),
    m.EntryKind.MEMORY_UPDATE_PROPOSED: (A.AGENT, T.MODEL_GENERATED, V.MODEL_VISIBLE),
    m.EntryKind.COMPACTION: (A.ORCHESTRATOR, T.MODEL_GENERATED, V.MODEL_VISIBLE),
    m.EntryKind.ARTIFACT_STORED: (A.SYSTEM, T.TOOL_TRUSTED, V.AUDIT_ONLY),
    m.EntryKind.UNKNOWN: (A.UNKNOWN, T.UNKNOWN, V.INTERNAL_ONLY),
}


def sha256_hex(text: str) -> str:
    """SHA-256 of UTF-8 text as 64 lowercase hex digits."""
    return hashlib.sha256(text.encode()).hexdigest()


def digest(text: str) -> str:
    """`sha256:<hex>` digest of UTF-8 text (the `*_hash` field format)."""
    return f"sha256:{sha256_hex(text)}"


def artifact(name: str, content_type: str = "text/plain", size: int = 2048) -> m.ArtifactRef:
    """A reference to an artifact named `name`."""
    return m.ArtifactRef(
        artifact_id=f"art-{name}",
        sha256=sha256_hex(name),
        size_bytes=size,
        content_type=content_type,
        redaction_level=m.RedactionLevel.REVIEW,
    )


def artifact_part(name: str, content_type: str = "text/plain") -> m.ArtifactRefPart:
    """An artifact reference as a part."""
    return m.ArtifactRefPart(**artifact(name, content_type).model_dump())


def json_part(value: Any, schema_ref: str | None = None) -> m.JsonPart:
    """A JSON part holding `value`."""
    return m.JsonPart(json_text=json.dumps(value, sort_keys=True), schema_ref=schema_ref)


def file_snippet(path: str = "src/app/OrderService.java") -> m.FileSnippetPart:
    """A 3-line slice of `path`, inlined."""
    text = "class OrderService {\n  // ...\n}\n"
    return m.FileSnippetPart(
        path=path,
        line_start=20,
        line_end=22,
        commit_sha="f9a0c1d",
        content_hash=digest(text),
        text=text,
    )


def diff(with_artifact: bool = True) -> m.DiffPart:
    """A diff touching a source file, a test and a renamed config file."""
    files = (
        _diff_file("src/app/OrderService.java", m.FileClassification.SOURCE, 8, 3),
        _diff_file("src/test/app/OrderServiceTest.java", m.FileClassification.TEST, 2, 2),
        m.DiffFile(
            path="config/app.yaml",
            status=m.FileChangeStatus.RENAMED,
            lines_added=0,
            lines_deleted=0,
            classification=m.FileClassification.CONFIG,
            old_path="config/app.yml",
        ),
    )
    patch = artifact("patch", "text/x-diff") if with_artifact else None
    return m.DiffPart(
        files=files, diff_artifact=patch, base_sha="f9a0c1d", workspace_tree_hash="a91b2c3"
    )


def _diff_file(path: str, kind: m.FileClassification, added: int, deleted: int) -> m.DiffFile:
    return m.DiffFile(
        path=path,
        status=m.FileChangeStatus.MODIFIED,
        lines_added=added,
        lines_deleted=deleted,
        classification=kind,
    )


def tool_call(tool_call_id: str = "call-1", at: datetime = BASE_TIME) -> m.ToolCallPart:
    """A finished read-only repository search."""
    return m.ToolCallPart(
        tool_call_id=tool_call_id,
        tool_name="repo.search",
        permission_class=m.PermissionClass.READ_ONLY,
        arguments_hash=digest('{"query":"OrderService"}'),
        started_at=at,
        finished_at=at + timedelta(milliseconds=1500, microseconds=7),
    )


def tool_result(tool_call_id: str = "call-1") -> m.ToolResultPart:
    """A successful result with its full output as an artifact."""
    return m.ToolResultPart(
        tool_call_id=tool_call_id,
        status=m.ToolResultStatus.SUCCEEDED,
        exit_code=0,
        timed_out=False,
        summary="Found 2 matches in src/app.",
        artifact_refs=(artifact(f"{tool_call_id}-stdout"),),
    )


def verification(status: m.VerificationStatus = m.VerificationStatus.FAILED) -> m.VerificationPart:
    """A verifier result with a diagnostics artifact."""
    return m.VerificationPart(
        verifier="maven@3.9",
        profile="maven-compile-unit",
        status=status,
        diagnostics_ref=artifact("diagnostics", "application/json"),
        check_id="OrderServiceTest#totals",
    )


def error(category: str = "verifier.test_failure") -> m.ErrorPart:
    """An error with a grouping signature."""
    return m.ErrorPart(
        category=category, message="1 test failed", signature="OrderServiceTest#totals"
    )


def model_usage(response_id: str = "resp-1") -> m.ModelUsagePart:
    """One successful provider call with cached and reasoning tokens."""
    raw = {"input_tokens": 18420, "output_tokens": 1350, "input_tokens_details": {"cached": 12000}}
    return m.ModelUsagePart(
        provider="openai",
        model="gpt-5.1-codex",
        purpose="planning",
        provider_response_id=response_id,
        input_tokens=18420,
        cached_input_tokens=12000,
        output_tokens=1350,
        reasoning_tokens=600,
        latency_ms=18450,
        finish_reason="tool_calls",
        status=m.ModelCallStatus.OK,
        provider_reported_cost_usd=0.0421,
        raw_usage_json=json.dumps(raw),
    )


def context_items(*source_entry_ids: str) -> m.ContextItemsPart:
    """A manifest with one item per source entry plus a file slice."""
    items = [_context_item(entry_id) for entry_id in source_entry_ids]
    items.append(
        m.ContextItem(
            item_kind=m.ContextItemKind.FILE_SLICE,
            trust_level=m.TrustLevel.REPOSITORY_UNTRUSTED,
            visibility=m.Visibility.MODEL_VISIBLE,
            sha256=sha256_hex("slice"),
            tokens=2100,
            path="src/app/OrderService.java",
            line_start=20,
            line_end=92,
            section="repository_data",
        )
    )
    return m.ContextItemsPart(items=tuple(items))


def _context_item(entry_id: str) -> m.ContextItem:
    return m.ContextItem(
        item_kind=m.ContextItemKind.CONVERSATION_TURN,
        source_entry_id=entry_id,
        trust_level=m.TrustLevel.PLATFORM_TRUSTED,
        visibility=m.Visibility.MODEL_VISIBLE,
        sha256=sha256_hex(entry_id),
        tokens=120,
        section="recent_events",
    )


def memory_proposal(*evidence_refs: str) -> m.MemoryProposalPart:
    """One fact, problem and decision, each citing `evidence_refs`."""
    refs = evidence_refs or ("entry:run-1-e1",)
    return m.MemoryProposalPart(
        facts=(m.ProposedFact(fact="The repository uses Maven.", evidence_refs=refs),),
        problems=(m.ProposedProblem(problem="OrderServiceTest fails.", evidence_refs=refs),),
        decisions=(
            m.ProposedDecision(
                decision="Limit changes to service-a.", reason="Task scope.", evidence_refs=refs
            ),
        ),
    )


def every_part() -> tuple[m.Part, ...]:
    """One part of every part type, in Avro union order."""
    return (
        m.TextPart(text="hello"),
        json_part({"a": 1}, "sample@1"),
        artifact_part("log"),
        file_snippet(),
        diff(),
        tool_call(),
        tool_result(),
        verification(),
        error(),
        model_usage(),
        context_items("run-1-e1"),
        memory_proposal("entry:run-1-e1", "tool-call:call-1"),
    )


def parts_for(kind: m.EntryKind, tool_call_id: str = "call-1") -> tuple[m.Part, ...]:
    """Typical parts of an entry of `kind`."""
    special: dict[m.EntryKind, tuple[m.Part, ...]] = {
        m.EntryKind.REPOSITORY_INSTRUCTION: (file_snippet("AGENTS.md"),),
        m.EntryKind.AGENT_THOUGHT_SUMMARY: (m.TextPart(text="Inspect Maven modules first."),),
        m.EntryKind.TOOL_CALL_REQUEST: (tool_call(tool_call_id),),
        m.EntryKind.TOOL_CALL_RESULT: (tool_result(tool_call_id),),
        m.EntryKind.FILE_OBSERVATION: (file_snippet(),),
        m.EntryKind.DIFF_OBSERVATION: (diff(with_artifact=False),),
        m.EntryKind.VERIFIER_RESULT: (verification(),),
        m.EntryKind.JUDGE_RESULT: (
            verification(m.VerificationStatus.PASSED),
            m.TextPart(text="In scope."),
        ),
        m.EntryKind.APPROVAL_REQUEST: (json_part({"action": "open_pr"}, "approval-request@1"),),
        m.EntryKind.APPROVAL_DECISION: (json_part({"approved": True}, "approval-decision@1"),),
        m.EntryKind.ERROR_EVENT: (error(),),
        m.EntryKind.RUN_STARTED: (json_part({"repo": "org/service-a"}, "run-config@1"),),
        m.EntryKind.MODEL_CALL: (model_usage(),),
        m.EntryKind.CONTEXT_PROJECTED: (context_items(),),
        m.EntryKind.DIFF_SNAPSHOT: (diff(),),
        m.EntryKind.MEMORY_UPDATE_PROPOSED: (memory_proposal(),),
        m.EntryKind.COMPACTION: (
            m.TextPart(text="Summary of turns 1-9."),
            artifact_part("history"),
        ),
        m.EntryKind.ARTIFACT_STORED: (artifact_part("build-log"),),
    }
    return special.get(kind, (m.TextPart(text=f"{kind.value.lower()} text"),))


class EntryBuilder:
    """Builds one run's entries: gapless sequence numbers, ids and times derived from them."""

    def __init__(
        self,
        run_id: str = "run-1",
        *,
        fleet_id: str = "fleet-a",
        session_id: str = "session-1",
        attempt_id: str = "attempt-1",
        start: datetime = BASE_TIME,
    ) -> None:
        self.run_id, self.fleet_id, self.session_id = run_id, fleet_id, session_id
        self.attempt_id, self.start = attempt_id, start
        self.entries: list[m.LedgerEntry] = []

    def entry_id(self, sequence_no: int) -> str:
        """The id this builder gives the entry with `sequence_no`."""
        return f"{self.run_id}-e{sequence_no}"

    def step_id(self, sequence_no: int) -> str:
        """The step id this builder gives the entry with `sequence_no`: ``<run id>-step<n>``, or
        ``step-<n>`` for a run id that a step id's format cannot hold (a test's hostile one)."""
        step = f"{self.run_id}-step{sequence_no}"
        fits = len(step) <= m.STEP_ID_MAX and re.fullmatch(m.STEP_ID_PATTERN, step)
        return step if fits else f"step-{sequence_no}"

    def time(self, sequence_no: int) -> datetime:
        """The occurred_at this builder gives the entry with `sequence_no`."""
        return self.start + timedelta(seconds=sequence_no, microseconds=sequence_no)

    def add(
        self, kind: m.EntryKind, parts: tuple[m.Part, ...] | None = None, **fields: Any
    ) -> m.LedgerEntry:
        """Append the next entry of `kind`; `fields` override any envelope field."""
        entry = m.LedgerEntry.model_validate({**self._defaults(kind, parts), **fields})
        self.entries.append(entry)
        return entry

    def _defaults(self, kind: m.EntryKind, parts: tuple[m.Part, ...] | None) -> dict[str, Any]:
        seq = len(self.entries) + 1
        actor, trust, visibility = PROFILES[kind]
        run_level = kind in (m.EntryKind.RUN_STARTED, m.EntryKind.RUN_FINISHED)
        return {
            "entry_id": self.entry_id(seq),
            "fleet_id": self.fleet_id,
            "session_id": self.session_id,
            "run_id": self.run_id,
            "attempt_id": self.attempt_id,
            "step_id": None if run_level else self.step_id(seq),
            "sequence_no": seq,
            "occurred_at": self.time(seq),
            "actor": {"type": actor, "id": f"{actor.value.lower()}-1"},
            "kind": kind,
            "trust_level": trust,
            "visibility": visibility,
            "causation": self._causation(seq),
            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
            "span_id": f"{seq:016x}",
            "run_status": m.RunStatus.SUCCEEDED if kind is m.EntryKind.RUN_FINISHED else None,
            "parts": parts if parts is not None else parts_for(kind),
            "metadata": {"agent.phase": "sample"},
        }

    def _causation(self, seq: int) -> m.Causation:
        return m.Causation(parent_entry_id=self.entry_id(seq - 1) if seq > 1 else None)


def sample_entry(kind: m.EntryKind = m.EntryKind.USER_TASK, **fields: Any) -> m.LedgerEntry:
    """A valid first entry of `kind` in run-1; `fields` override envelope fields."""
    return EntryBuilder().add(kind, **fields)


def entry_with_every_part() -> m.LedgerEntry:
    """A valid entry carrying every part type and a redaction."""
    redaction = m.Redaction(type=m.RedactionType.SECRET_PATTERN, field="AWS_SECRET_ACCESS_KEY")
    return sample_entry(m.EntryKind.RUN_SUMMARY, parts=every_part(), redactions=(redaction,))


def sample_run(run_id: str = "run-1") -> list[m.LedgerEntry]:
    """A coherent run using every entry kind (except UNKNOWN), sequence 1..N."""
    builder = EntryBuilder(run_id)
    _instructions(builder)
    _first_turn(builder)
    _verification(builder)
    _wrap_up(builder)
    return builder.entries


def _add_all(builder: EntryBuilder, *kinds: m.EntryKind) -> None:
    for kind in kinds:
        builder.add(kind)


def _instructions(b: EntryBuilder) -> None:
    _add_all(
        b,
        m.EntryKind.RUN_STARTED,
        m.EntryKind.SYSTEM_INSTRUCTION,
        m.EntryKind.DEVELOPER_INSTRUCTION,
    )
    _add_all(b, m.EntryKind.ORG_POLICY, m.EntryKind.USER_TASK, m.EntryKind.REPOSITORY_INSTRUCTION)


def _first_turn(b: EntryBuilder) -> None:
    b.add(m.EntryKind.CONTEXT_PROJECTED, (context_items(*(e.entry_id for e in b.entries[1:])),))
    b.add(m.EntryKind.MODEL_CALL, (model_usage(f"{b.run_id}-resp-1"),))
    b.add(m.EntryKind.AGENT_THOUGHT_SUMMARY)
    _tool_round(b, f"{b.run_id}-call-1")
    b.add(m.EntryKind.FILE_OBSERVATION, causation=m.Causation(tool_call_id=f"{b.run_id}-call-1"))
    b.add(m.EntryKind.ARTIFACT_STORED)
    _tool_round(b, f"{b.run_id}-call-2")


def _verification(b: EntryBuilder) -> None:
    _add_all(
        b, m.EntryKind.DIFF_OBSERVATION, m.EntryKind.DIFF_SNAPSHOT, m.EntryKind.VERIFIER_RESULT
    )
    verifier = b.entries[-1]
    b.add(m.EntryKind.ERROR_EVENT)
    refs = (f"entry:{b.entry_id(1)}", f"tool-call:{b.run_id}-call-1", f"entry:{verifier.entry_id}")
    b.add(m.EntryKind.MEMORY_UPDATE_PROPOSED, (memory_proposal(*refs),))


def _wrap_up(b: EntryBuilder) -> None:
    _add_all(b, m.EntryKind.COMPACTION, m.EntryKind.JUDGE_RESULT, m.EntryKind.APPROVAL_REQUEST)
    _add_all(
        b, m.EntryKind.APPROVAL_DECISION, m.EntryKind.ASSISTANT_RESPONSE, m.EntryKind.RUN_SUMMARY
    )
    b.add(m.EntryKind.RUN_FINISHED)


def _tool_round(builder: EntryBuilder, tool_call_id: str) -> None:
    at = builder.time(len(builder.entries) + 1)
    request = builder.add(
        m.EntryKind.TOOL_CALL_REQUEST,
        (tool_call(tool_call_id, at),),
        causation=m.Causation(
            tool_call_id=tool_call_id, parent_entry_id=builder.entries[-1].entry_id
        ),
    )
    builder.add(
        m.EntryKind.TOOL_CALL_RESULT,
        (tool_result(tool_call_id),),
        causation=m.Causation(parent_entry_id=request.entry_id, tool_call_id=tool_call_id),
    )
