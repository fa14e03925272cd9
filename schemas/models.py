"""Pydantic mirror of the newest `avsc/ledger_entry.v<N>.avsc`, field by field.

Records become frozen models named like their Avro record, Avro enums become `StrEnum`s named like
the Avro enum, arrays become tuples, timestamp-micros becomes an aware UTC `datetime`. Parts carry a
`type` literal (e.g. "text") that stands for the Avro union branch (e.g. agentledger.TextPart).
Constructing a model directly raises pydantic's `ValidationError`; `parse_entry`, `from_avro`
and the codec raise `LedgerValidationError` instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PlainSerializer,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import CoreSchema, core_schema

from schemas.errors import LedgerValidationError

NAMESPACE = "agentledger"
_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1


# Times an agent can have lived in. Fixed bounds, not the clock: a replay years from now must
# accept and reject exactly what the live worker did.
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2100, 1, 1, tzinfo=UTC)
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(r'"(?:[^"\\]+|\\.)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def _to_utc(value: datetime) -> datetime:
    value = value.astimezone(UTC)
    if not EARLIEST <= value < LATEST:
        raise ValueError(f"must be from {EARLIEST.year} to {LATEST.year - 1}")
    return value


@lru_cache(maxsize=1 << 16)  # documents write the same entries' times again and again
def _iso_utc(value: datetime) -> str:
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def json_depth(text: str) -> int:
    """How deeply arrays and objects nest in JSON text (strings ignored), without recursing."""
    depth = deepest = 0
    for bracket in _JSON_BRACKET.findall(_JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _json_text(value: str) -> str:
    too_deep = ValueError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        json.loads(value)  # first: on valid JSON, json_depth's string pattern runs in linear time
    except RecursionError:
        raise too_deep from None
    except ValueError as exc:
        raise ValueError(f"not a JSON document: {exc}") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise too_deep
    return value


UtcDatetime = Annotated[
    AwareDatetime,
    AfterValidator(_to_utc),
    PlainSerializer(_iso_utc, return_type=str, when_used="json"),
]
# Identifiers that join, deduplicate or name things (entry, run, tool call, response ids): a
# charset with no spaces, quotes or control characters, so an id is never free text in disguise.
ID_MAX = 256  # a ledger id's longest (run, entry, session)
ID_PATTERN = rf"^[A-Za-z0-9_.:@/+=#~-]{{1,{ID_MAX}}}$"
Id = Annotated[str, Field(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)]
# Names that describe (tool names, paths, models, error signatures): printable text of any script,
# no control characters (a NUL in a name would stop PostgreSQL; a newline would forge log lines).
NAME_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]{1,4096}$"
Name = Annotated[str, Field(min_length=1, max_length=4096, pattern=NAME_PATTERN)]
# Fleet ids become topic names.
FLEET_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$"
FLEET_ID_RULE = (
    "a fleet id is 1-100 ASCII letters, digits, '_' or '-', starting with a letter or digit "
    "(it names the fleet's Kafka topics, <prefix>.ledger.<fleet>)"
)
FleetId = Annotated[str, Field(pattern=FLEET_ID_PATTERN)]
# W3C trace context: 16 and 8 bytes as lower-case hex.
TraceId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
SpanId = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
# Step and attempt ids and metadata keys name a place in a run or a property; nothing real needs
# an opaque token in them, so their format leaves no room for one (issue 27): words, numbers, hex
# groups (UUIDs, short hashes) and short mixes (`step1`, `v1beta1`, `k8s`) joined by separators.
# A run of letters and digits between separators is a word (lower case up to 32 letters, upper
# case up to 16, or Capitalised/camelCase words), up to 20 digits, up to 12 hex digits of one
# case, or up to 8 letters and digits of any kind; so `ghp_…`, `AKIA…`, `sk_live_…`, Slack's
# `xoxb-…` or a base64 blob do not fit. A UUID still does (real ids are UUIDs, and so are a few
# providers' keys): the detector checks every id too.
_NAME_RUN = (
    r"(?:[a-z]{1,32}|[A-Z]{1,16}|[A-Z]?[a-z]+(?:[A-Z][a-z]+)*|[0-9]{1,20}|[0-9a-f]{1,12}"
    r"|[0-9A-F]{1,12}|[A-Za-z0-9]{1,8})"
)
STEP_ID_PATTERN = rf"^{_NAME_RUN}(?:[_.:/#-]+{_NAME_RUN})*$"
STEP_ID_MAX = 128
StepId = Annotated[str, Field(min_length=1, max_length=STEP_ID_MAX, pattern=STEP_ID_PATTERN)]
METADATA_KEY_PATTERN = rf"^{_NAME_RUN}(?:[_.:/-]+{_NAME_RUN})*$"
METADATA_KEY_MAX = 64
MetadataKey = Annotated[
    str, Field(min_length=1, max_length=METADATA_KEY_MAX, pattern=METADATA_KEY_PATTERN)
]
# Free text a model or a person wrote, kept whole (NULs and all): never empty.
Text = Annotated[str, Field(min_length=1)]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Digest = Annotated[str, Field(pattern=r"^[a-z0-9-]+:[0-9a-f]+$")]
JsonText = Annotated[str, AfterValidator(_json_text)]
Int32 = Annotated[int, Field(ge=-(2**31), le=_INT_MAX)]
Count32 = Annotated[int, Field(ge=0, le=_INT_MAX)]
Line = Annotated[int, Field(ge=1, le=_INT_MAX)]
Count = Annotated[int, Field(ge=0, le=_LONG_MAX)]
Usd = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _AvroEnum(StrEnum):
    """An Avro enum: written to JSON as ``str(member)``, its value (a C call), not through
    pydantic's lookup of ``.value`` (a Python descriptor: ~0.25 µs a field, and documents have
    thousands). Validated and dumped to Python as before."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        schema: Any = handler(source)
        schema["serialization"] = core_schema.to_string_ser_schema(when_used="json")
        return schema  # type: ignore[no-any-return]


class ActorType(_AvroEnum):
    USER = "USER"
    AGENT = "AGENT"
    TOOL = "TOOL"
    VERIFIER = "VERIFIER"
    JUDGE = "JUDGE"
    SYSTEM = "SYSTEM"
    HUMAN_REVIEWER = "HUMAN_REVIEWER"
    ORCHESTRATOR = "ORCHESTRATOR"
    UNKNOWN = "UNKNOWN"


class EntryKind(_AvroEnum):
    SYSTEM_INSTRUCTION = "SYSTEM_INSTRUCTION"
    DEVELOPER_INSTRUCTION = "DEVELOPER_INSTRUCTION"
    ORG_POLICY = "ORG_POLICY"
    REPOSITORY_INSTRUCTION = "REPOSITORY_INSTRUCTION"
    USER_TASK = "USER_TASK"
    AGENT_THOUGHT_SUMMARY = "AGENT_THOUGHT_SUMMARY"
    ASSISTANT_RESPONSE = "ASSISTANT_RESPONSE"
    TOOL_CALL_REQUEST = "TOOL_CALL_REQUEST"
    TOOL_CALL_RESULT = "TOOL_CALL_RESULT"
    FILE_OBSERVATION = "FILE_OBSERVATION"
    DIFF_OBSERVATION = "DIFF_OBSERVATION"
    VERIFIER_RESULT = "VERIFIER_RESULT"
    JUDGE_RESULT = "JUDGE_RESULT"
    APPROVAL_REQUEST = "APPROVAL_REQUEST"
    APPROVAL_DECISION = "APPROVAL_DECISION"
    RUN_SUMMARY = "RUN_SUMMARY"
    ERROR_EVENT = "ERROR_EVENT"
    RUN_STARTED = "RUN_STARTED"
    RUN_FINISHED = "RUN_FINISHED"
    MODEL_CALL = "MODEL_CALL"
    CONTEXT_PROJECTED = "CONTEXT_PROJECTED"
    DIFF_SNAPSHOT = "DIFF_SNAPSHOT"
    MEMORY_UPDATE_PROPOSED = "MEMORY_UPDATE_PROPOSED"
    COMPACTION = "COMPACTION"
    ARTIFACT_STORED = "ARTIFACT_STORED"
    UNKNOWN = "UNKNOWN"


class TrustLevel(_AvroEnum):
    PLATFORM_TRUSTED = "PLATFORM_TRUSTED"
    ORG_TRUSTED = "ORG_TRUSTED"
    USER_TRUSTED = "USER_TRUSTED"
    TOOL_TRUSTED = "TOOL_TRUSTED"
    REPOSITORY_UNTRUSTED = "REPOSITORY_UNTRUSTED"
    NETWORK_UNTRUSTED = "NETWORK_UNTRUSTED"
    MODEL_GENERATED = "MODEL_GENERATED"
    UNKNOWN = "UNKNOWN"


class Visibility(_AvroEnum):
    MODEL_VISIBLE = "MODEL_VISIBLE"
    AUDIT_ONLY = "AUDIT_ONLY"
    HUMAN_VISIBLE = "HUMAN_VISIBLE"
    INTERNAL_ONLY = "INTERNAL_ONLY"
    REDACTED = "REDACTED"


class RunStatus(_AvroEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    BLOCKED = "BLOCKED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    POLICY_DENIED = "POLICY_DENIED"
    STEP_LIMIT = "STEP_LIMIT"  # v3: stopped at its step or iteration limit
    SUBMITTED = "SUBMITTED"  # v3: submitted its result (e.g. a patch); a verdict may follow
    UNKNOWN = "UNKNOWN"


class RedactionLevel(_AvroEnum):
    PUBLIC = "PUBLIC"
    REVIEW = "REVIEW"
    RESTRICTED = "RESTRICTED"
    ENCRYPTED_RAW = "ENCRYPTED_RAW"
    UNKNOWN = "UNKNOWN"


class FileChangeStatus(_AvroEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    RENAMED = "RENAMED"
    UNKNOWN = "UNKNOWN"


class FileClassification(_AvroEnum):
    SOURCE = "SOURCE"
    TEST = "TEST"
    CONFIG = "CONFIG"
    GENERATED = "GENERATED"
    DOCUMENTATION = "DOCUMENTATION"
    UNKNOWN = "UNKNOWN"


class PermissionClass(_AvroEnum):
    READ_ONLY = "READ_ONLY"
    WORKSPACE_WRITE = "WORKSPACE_WRITE"
    EXECUTE_SAFE = "EXECUTE_SAFE"
    EXECUTE_PRIVILEGED = "EXECUTE_PRIVILEGED"
    NETWORK_ACCESS = "NETWORK_ACCESS"
    EXTERNAL_SIDE_EFFECT = "EXTERNAL_SIDE_EFFECT"
    UNKNOWN = "UNKNOWN"


class ToolResultStatus(_AvroEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    DENIED = "DENIED"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"


class VerificationStatus(_AvroEnum):
    PASSED = "PASSED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"
    UNKNOWN = "UNKNOWN"


class ModelCallStatus(_AvroEnum):
    OK = "OK"
    ERROR = "ERROR"
    TIMED_OUT = "TIMED_OUT"
    RATE_LIMITED = "RATE_LIMITED"
    CANCELLED = "CANCELLED"
    CONTENT_FILTERED = "CONTENT_FILTERED"
    UNKNOWN = "UNKNOWN"


class ContextItemKind(_AvroEnum):
    SYSTEM_INSTRUCTION = "SYSTEM_INSTRUCTION"
    DEVELOPER_INSTRUCTION = "DEVELOPER_INSTRUCTION"
    ORG_POLICY = "ORG_POLICY"
    PERMISSION_PROFILE = "PERMISSION_PROFILE"
    TASK_CONTRACT = "TASK_CONTRACT"
    REPOSITORY_INSTRUCTION = "REPOSITORY_INSTRUCTION"
    WORKING_MEMORY = "WORKING_MEMORY"
    REPOSITORY_MAP = "REPOSITORY_MAP"
    FILE_SLICE = "FILE_SLICE"
    TOOL_DEFINITION = "TOOL_DEFINITION"
    TOOL_CALL = "TOOL_CALL"
    TOOL_OUTPUT = "TOOL_OUTPUT"
    TOOL_OUTPUT_PLACEHOLDER = "TOOL_OUTPUT_PLACEHOLDER"
    DIFF = "DIFF"
    VERIFIER_RESULT = "VERIFIER_RESULT"
    CONVERSATION_TURN = "CONVERSATION_TURN"
    SUMMARY = "SUMMARY"
    UNKNOWN = "UNKNOWN"


class RedactionType(_AvroEnum):
    SECRET_PATTERN = "SECRET_PATTERN"
    CREDENTIAL = "CREDENTIAL"
    PII = "PII"
    HIGH_ENTROPY = "HIGH_ENTROPY"
    POLICY = "POLICY"
    UNKNOWN = "UNKNOWN"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _not_before(value: Any, info: ValidationInfo, earlier: str) -> Any:
    """Check `value >= info.data[earlier]` when both are present."""
    start = info.data.get(earlier)
    if value is not None and start is not None and value < start:
        raise ValueError(f"must not be before {earlier} ({start})")
    return value


class Actor(_Record):
    """The producer of an entry."""

    type: ActorType
    id: Name


class Causation(_Record):
    """The entry or tool call an entry answers."""

    parent_entry_id: Id | None = None
    tool_call_id: Id | None = None


class Redaction(_Record):
    """One removal made by the publisher's redactor; never the value."""

    type: RedactionType
    field: Name
    rule: Name | None = None


class ArtifactRef(_Record):
    """Reference to content in the artifact store."""

    artifact_id: Id
    sha256: Sha256Hex
    size_bytes: Count
    content_type: Name
    redaction_level: RedactionLevel


class TextPart(_Record):
    """Plain or markdown text, small enough to inline."""

    type: Literal["text"] = "text"
    text: str


class JsonPart(_Record):
    """A structured JSON document, serialized as a string."""

    type: Literal["json"] = "json"
    json_text: JsonText
    schema_ref: Name | None = None


class ArtifactRefPart(_Record):
    """Content stored in the artifact store rather than inline."""

    type: Literal["artifact_ref"] = "artifact_ref"
    artifact_id: Id
    sha256: Sha256Hex
    size_bytes: Count
    content_type: Name
    redaction_level: RedactionLevel

    def to_ref(self) -> ArtifactRef:
        """The same reference as a nested `ArtifactRef`."""
        return ArtifactRef(**self.model_dump(exclude={"type"}))


class FileSnippetPart(_Record):
    """A slice of a repository file the agent observed."""

    type: Literal["file_snippet"] = "file_snippet"
    path: Name
    line_start: Line
    line_end: Line
    commit_sha: Id | None = None
    content_hash: Digest
    text: str | None = None

    @field_validator("line_end")
    @classmethod
    def _end_after_start(cls, value: int, info: ValidationInfo) -> int:
        return int(_not_before(value, info, "line_start"))


class DiffFile(_Record):
    """One changed file in a diff."""

    path: Name
    status: FileChangeStatus
    lines_added: Count32
    lines_deleted: Count32
    classification: FileClassification
    old_path: Name | None = Field(default=None, validate_default=True)

    @field_validator("old_path")
    @classmethod
    def _renamed_has_old_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("status") is FileChangeStatus.RENAMED:
            raise ValueError("required when status is RENAMED")
        return value


class DiffPart(_Record):
    """Summary of a workspace diff; the patch itself is an artifact."""

    type: Literal["diff"] = "diff"
    files: tuple[DiffFile, ...]
    diff_artifact: ArtifactRef | None = None
    base_sha: Id | None = None
    workspace_tree_hash: Id | None = None


class ToolCallPart(_Record):
    """A tool call requested by the agent."""

    type: Literal["tool_call"] = "tool_call"
    tool_call_id: Id
    tool_name: Name
    permission_class: PermissionClass
    arguments_hash: Digest
    started_at: UtcDatetime
    finished_at: UtcDatetime | None = None
    approval_id: Id | None = None

    @field_validator("finished_at")
    @classmethod
    def _finished_after_start(cls, value: datetime | None, info: ValidationInfo) -> Any:
        return _not_before(value, info, "started_at")


class ToolResultPart(_Record):
    """The outcome of a tool call."""

    type: Literal["tool_result"] = "tool_result"
    tool_call_id: Id
    status: ToolResultStatus
    exit_code: Int32 | None = None
    timed_out: bool
    summary: str
    artifact_refs: tuple[ArtifactRef, ...] = ()


class VerificationPart(_Record):
    """The result of a verifier or judge check."""

    type: Literal["verification"] = "verification"
    verifier: Name
    profile: Name
    status: VerificationStatus
    diagnostics_ref: ArtifactRef | None = None
    check_id: Name | None = None


class ErrorPart(_Record):
    """An error the agent, a tool or the platform met."""

    type: Literal["error"] = "error"
    category: Name
    message: str
    signature: Name | None = None


# The usage fields a source may leave unreported (ModelUsagePart.unknown_fields, v3).
UsageField = Literal[
    "input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens", "latency_ms"
]


class ModelUsagePart(_Record):
    """One model provider call: normalized usage plus the provider's raw usage verbatim."""

    type: Literal["model_usage"] = "model_usage"
    provider: Name
    model: Name
    purpose: Name
    provider_response_id: Id | None = None
    input_tokens: Count
    cached_input_tokens: Count
    output_tokens: Count
    reasoning_tokens: Count
    latency_ms: Count
    finish_reason: Name | None = None
    status: ModelCallStatus
    provider_reported_cost_usd: Usd | None = None
    raw_usage_json: JsonText
    cache_write_input_tokens: Count | None = None  # v3
    # v3: the usage fields the source did not report; each is written as 0 for older readers and
    # read as unknown (never as zero) by everything that reads v3.
    unknown_fields: tuple[UsageField, ...] = ()

    @field_validator("cached_input_tokens")
    @classmethod
    def _cached_within_input(cls, value: int, info: ValidationInfo) -> int:
        return _at_most(value, info, "input_tokens")

    @field_validator("reasoning_tokens")
    @classmethod
    def _reasoning_within_output(cls, value: int, info: ValidationInfo) -> int:
        return _at_most(value, info, "output_tokens")

    @field_validator("cache_write_input_tokens")
    @classmethod
    def _writes_within_input(cls, value: int | None, info: ValidationInfo) -> int | None:
        return None if value is None else _at_most(value, info, "input_tokens")

    @field_validator("unknown_fields")
    @classmethod
    def _unknown_is_written_as_zero(
        cls, value: tuple[str, ...], info: ValidationInfo
    ) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("names a field twice")
        for name in value:
            if info.data.get(name, 0) != 0:
                raise ValueError(f"{name} is unknown, so it must be written as 0")
        return value

    def known(self, field: UsageField) -> bool:
        """Whether the source reported this usage field (v3; every field of older entries)."""
        return field not in self.unknown_fields


def _at_most(value: int, info: ValidationInfo, total: str) -> int:
    limit = info.data.get(total)
    if limit is not None and value > limit:
        raise ValueError(f"must not exceed {total} ({limit}), which includes it")
    return value


class ContextItem(_Record):
    """One item of a model context."""

    item_kind: ContextItemKind
    source_entry_id: Id | None = None
    trust_level: TrustLevel
    visibility: Visibility
    sha256: Sha256Hex
    tokens: Count
    path: Name | None = None
    line_start: Line | None = None
    line_end: Line | None = None
    tool_call_id: Id | None = None
    section: Name | None = None

    @field_validator("line_end")
    @classmethod
    def _end_after_start(cls, value: int | None, info: ValidationInfo) -> Any:
        return _not_before(value, info, "line_start")


class ContextItemsPart(_Record):
    """The manifest of what a model call saw: the whole item list, or (v2) a delta of the run's
    previous manifest (``base_entry_id``): its items without ``removed_items``, then ``items``."""

    type: Literal["context_items"] = "context_items"
    items: tuple[ContextItem, ...]
    base_entry_id: Id | None = None
    removed_items: tuple[Count, ...] = ()

    @field_validator("removed_items")
    @classmethod
    def _removed_of_a_base(cls, value: tuple[int, ...], info: ValidationInfo) -> Any:
        if value and info.data.get("base_entry_id") is None:
            raise ValueError("removed_items needs a base_entry_id")
        if len(set(value)) != len(value):
            raise ValueError("removed_items lists a position twice")
        return value


class ProposedFact(_Record):
    """A fact with its evidence refs (entry:<id>, tool-call:<id>, artifact:<id>)."""

    fact: Text
    evidence_refs: tuple[Id, ...]


class ProposedProblem(_Record):
    """An open problem with its evidence refs."""

    problem: Text
    evidence_refs: tuple[Id, ...]


class ProposedDecision(_Record):
    """A decision with its reason and evidence refs."""

    decision: Text
    reason: Text
    evidence_refs: tuple[Id, ...]


class MemoryProposalPart(_Record):
    """Working-memory updates proposed by the agent; the projector keeps evidence-bound ones."""

    type: Literal["memory_proposal"] = "memory_proposal"
    facts: tuple[ProposedFact, ...] = ()
    problems: tuple[ProposedProblem, ...] = ()
    decisions: tuple[ProposedDecision, ...] = ()


Part = Annotated[
    TextPart
    | JsonPart
    | ArtifactRefPart
    | FileSnippetPart
    | DiffPart
    | ToolCallPart
    | ToolResultPart
    | VerificationPart
    | ErrorPart
    | ModelUsagePart
    | ContextItemsPart
    | MemoryProposalPart,
    Field(discriminator="type"),
]

# In Avro union order; the order is part of the contract.
PART_TYPES: tuple[type[_Record], ...] = (
    TextPart,
    JsonPart,
    ArtifactRefPart,
    FileSnippetPart,
    DiffPart,
    ToolCallPart,
    ToolResultPart,
    VerificationPart,
    ErrorPart,
    ModelUsagePart,
    ContextItemsPart,
    MemoryProposalPart,
)


class LedgerEntry(_Record):
    """One append-only fact recorded by an agent fleet (the envelope)."""

    entry_id: Id
    fleet_id: FleetId
    session_id: Id
    run_id: Id
    attempt_id: StepId
    step_id: StepId | None = None
    sequence_no: Annotated[int, Field(ge=1, le=_LONG_MAX)]
    occurred_at: UtcDatetime
    actor: Actor
    kind: EntryKind
    trust_level: TrustLevel
    visibility: Visibility
    causation: Causation = Field(default_factory=Causation)
    trace_id: TraceId | None = None
    span_id: SpanId | None = None
    run_status: RunStatus | None = Field(default=None, validate_default=True)
    parts: tuple[Part, ...] = ()
    metadata: dict[MetadataKey, str] = Field(default_factory=dict)
    redactions: tuple[Redaction, ...] = ()

    @field_validator("run_status")
    @classmethod
    def _status_iff_finished(cls, value: RunStatus | None, info: ValidationInfo) -> Any:
        kind = info.data.get("kind")
        if kind is EntryKind.RUN_FINISHED and value is None:
            raise ValueError("required when kind is RUN_FINISHED")
        if value is not None and kind not in (None, EntryKind.RUN_FINISHED, EntryKind.UNKNOWN):
            raise ValueError(f"only allowed when kind is RUN_FINISHED, not {kind}")
        return value


def part_tag(part_type: type[_Record]) -> str:
    """The `type` literal of a part class, e.g. "text" for `TextPart`."""
    return str(part_type.model_fields["type"].default)


def avro_name(model: type[BaseModel]) -> str:
    """Full Avro name of the record a model mirrors, e.g. agentledger.TextPart."""
    return f"{NAMESPACE}.{model.__name__}"


_AVRO_NAME_BY_TAG = {part_tag(cls): avro_name(cls) for cls in PART_TYPES}
_TAG_BY_AVRO_NAME = {name: tag for tag, name in _AVRO_NAME_BY_TAG.items()}
_ENTRIES: TypeAdapter[list[LedgerEntry]] = TypeAdapter(list[LedgerEntry])


def to_avro(entry: LedgerEntry) -> dict[str, Any]:
    """The fastavro record of an entry; parts in fastavro's (record name, record) tuple notation."""
    return avro_record(entry.model_dump())


def avro_record(dumped: dict[str, Any]) -> dict[str, Any]:
    """Turn `LedgerEntry.model_dump()` output into a fastavro record (mutates and returns it)."""
    dumped["parts"] = [_part_to_avro(part) for part in dumped["parts"]]
    return dumped


def _part_to_avro(part: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    tag = part.pop("type")
    return _AVRO_NAME_BY_TAG[tag], part


def from_avro(record: Mapping[str, Any]) -> LedgerEntry:
    """Build an entry from a record read with `return_record_name=True`; LedgerValidationError."""
    return parse_entry(model_input(record))


def model_input(record: Mapping[str, Any]) -> dict[str, Any]:
    """A fastavro record reshaped for `LedgerEntry` validation (parts get their `type` key)."""
    data = dict(record)
    data["parts"] = [_part_from_avro(part) for part in record.get("parts", ())]
    return data


def _part_from_avro(part: Any) -> Any:
    if isinstance(part, tuple) and len(part) == 2 and part[0] in _TAG_BY_AVRO_NAME:
        return {"type": _TAG_BY_AVRO_NAME[part[0]], **part[1]}
    return part  # left for validation to reject with a clear location


def parse_entry(data: Mapping[str, Any]) -> LedgerEntry:
    """Validate a python-shaped mapping into an entry; raises LedgerValidationError."""
    try:
        return LedgerEntry.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
    except RecursionError:  # a value nested past Python's limit (an enum's repr of a deep list)
        raise _TOO_DEEP from None


def parse_entries(items: list[dict[str, Any]]) -> list[LedgerEntry]:
    """Validate many python-shaped mappings in one call; raises LedgerValidationError."""
    try:
        return _ENTRIES.validate_python(items)
    except ValidationError as exc:
        raise validation_error(exc) from None
    except RecursionError:  # a value nested past Python's limit (an enum's repr of a deep list)
        raise _TOO_DEEP from None


def parse_entry_json(text: str | bytes) -> LedgerEntry:
    """Validate JSON-form text strictly (ISO timestamps, enum symbols); LedgerValidationError."""
    try:
        return LedgerEntry.model_validate_json(text, strict=True)
    except ValidationError as exc:
        raise validation_error(exc) from None
    except RecursionError:  # a value nested past Python's limit (an enum's repr of a deep list)
        raise _TOO_DEEP from None


_TOO_DEEP = LedgerValidationError("entry", "a value is nested too deeply")


def _field_names() -> frozenset[str]:
    names = {"[key]"}
    models: tuple[type[BaseModel], ...] = (
        LedgerEntry,
        Actor,
        Causation,
        Redaction,
        ArtifactRef,
        DiffFile,
        ContextItem,
        ProposedFact,
        ProposedProblem,
        ProposedDecision,
        *PART_TYPES,
    )
    for model in models:
        names.update(model.model_fields)
    names.update(part_tag(cls) for cls in PART_TYPES)
    return frozenset(names)


_FIELD_NAMES = _field_names()
# Errors whose pydantic message quotes the input; said in our words instead.
# The rule a pattern stands for, in words (a user should not have to read a regex).
_PATTERN_RULES = {
    FLEET_ID_PATTERN: FLEET_ID_RULE,
    ID_PATTERN: "an id is 1-256 of A-Z a-z 0-9 and _ . : @ / + = # ~ - (no spaces or quotes)",
    NAME_PATTERN: "a name is 1-4096 printable characters (no control characters or newlines)",
    STEP_ID_PATTERN: (
        f"a step or attempt id is 1-{STEP_ID_MAX} characters: words, numbers, hex groups and "
        "short mixes of letters and digits joined by _ . : / # - (each run between separators "
        "a word, at most 20 digits, 12 hex digits or 8 mixed letters and digits), never an "
        "opaque token"
    ),
    METADATA_KEY_PATTERN: (
        f"a metadata key is 1-{METADATA_KEY_MAX} characters: words, numbers, hex groups and short "
        "mixes of letters and digits joined by _ . : / - (each run between separators a word, at "
        "most 20 digits, 12 hex digits or 8 mixed letters and digits), never an opaque token"
    ),
}

_OWN_WORDS = {
    "union_tag_invalid": "unknown part type",
    "union_tag_not_found": "a part needs its 'type'",
}


def validation_error(exc: ValidationError) -> LedgerValidationError:
    """The first pydantic error as a LedgerValidationError naming its field path.

    Never the offending value: a key nobody declared (an unknown field, a metadata key) shows as
    ``<key>``, and messages that would quote the input are replaced, since a rejected value may be
    a secret and errors reach logs and terminals.
    """
    errors = exc.errors(include_url=False)
    first = errors[0]
    field = ".".join(_loc_item(item) for item in first["loc"]) or "entry"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    message = _OWN_WORDS.get(first["type"], first["msg"])
    if first["type"] == "string_pattern_mismatch":
        pattern = first.get("ctx", {}).get("pattern", "")
        message = _PATTERN_RULES.get(pattern, message)
    if first["type"] == "union_tag_invalid":
        expected = first.get("ctx", {}).get("expected_tags", "")
        message = f"{message} (expected one of {expected})"
    return LedgerValidationError(field, f"{message}{more}")


def _loc_item(item: int | str) -> str:
    return str(item) if isinstance(item, int) or item in _FIELD_NAMES else "<key>"
