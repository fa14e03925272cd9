"""What every importer shares: a run being built from a real agent's log, and its summary.

An importer is a pure function from a log file's bytes to :class:`ImportedRun` s: the ledger
entries of each run the file holds, numbered 1, 2, 3, ... in the order the file records them, with
entry ids derived from the source's own ids (so importing the same file again yields the same
entries, and the publisher sends only what the ledger does not hold yet). I/O is at the edge:
:mod:`streams.importers.publish` reads the files and publishes.

Times: every format here writes UTC timestamps with a ``Z`` (stated per importer); a timestamp
without a zone is read as UTC only where the format documents it as UTC, and the importer says so
in its summary.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from projectors.cost_metrics import CALLS_KEY, CALLS_UNKNOWN
from schemas.factory import PROFILES
from schemas.models import (
    Actor,
    ActorType,
    Causation,
    DiffFile,
    EntryKind,
    ErrorPart,
    FileChangeStatus,
    FileClassification,
    JsonPart,
    LedgerEntry,
    ModelUsagePart,
    Part,
    PermissionClass,
    RunStatus,
    ToolCallPart,
    UsageField,
    VerificationPart,
    VerificationStatus,
    validation_error,
)

# Tool output kept inline in a TOOL_CALL_RESULT's summary; a longer one goes to the artifact
# store when published (its start stays inline with the artifact's handle).
MAX_SUMMARY_CHARS = 4000


class RepeatedRecordError(ValueError):
    """A record with the id of one already imported from the file: the first is kept. ``same``:
    it says the same (a line written twice); else it is another record under that id."""

    def __init__(self, same: bool) -> None:
        super().__init__("a record repeated" if same else "another record under a used id")
        self.same = same


class ImportFormatError(ValueError):
    """The file is not of the format asked for (the message says what was expected)."""


@dataclass
class Summary:
    """What one import of one file found: counts, and what was skipped and why."""

    path: str
    runs: int = 0
    entries: int = 0
    calls: int = 0
    calls_known: bool = True  # False: the log shows model output but keeps no usage at all
    # the tokens are the run's totals as its agent reported them (SWE-agent's model_stats), not
    # summed from calls: shown although the calls are unknown
    tokens_reported: bool = False
    # runs whose log shows the model's replies but keeps no usage (mark_unmetered): the file's
    # calls, tokens and cost leave them out (lower bounds), or are unknown when no call is known
    runs_unmetered: int = 0
    duplicate_reports: int = 0  # usage reports of a call already counted (the format's trap)
    input_tokens: int = 0
    output_tokens: int = 0
    reported_cost_usd: str | None = None
    # records not imported, by why: kinds the ledger has no use for, and records that could not
    # be mapped (``unmapped`` of them: a field missing or of another type; the import exits 1)
    skipped: Counter[str] = field(default_factory=Counter)
    unmapped: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def _tokens_known(self) -> bool:
        return self.calls_known or self.tokens_reported

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "runs": self.runs,
            "entries": self.entries,
            "calls": self.calls if self.calls_known else None,  # unknown, never 0
            "duplicate_reports": self.duplicate_reports,
            "input_tokens": self.input_tokens if self._tokens_known else None,
            "output_tokens": self.output_tokens if self._tokens_known else None,
            "reported_cost_usd": self.reported_cost_usd,
            "skipped": dict(sorted(self.skipped.items())),
            "unmapped": self.unmapped,
            "runs_calls_unknown": self.runs_unmetered,
            "notes": self.notes,
        }


@dataclass
class ImportedRun:
    """One run's entries as imported (numbered from 1 in source order)."""

    run_id: str
    fleet_id: str
    session_id: str
    source: str  # the format, e.g. "claude-code"
    entries: list[LedgerEntry] = field(default_factory=list)
    _ids: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # entry id -> what it holds

    def add(
        self,
        kind: EntryKind,
        at: datetime,
        source_id: str,
        parts: tuple[Part, ...] | list[Part] = (),
        *,
        actor: ActorType | None = None,
        actor_id: str | None = None,
        tool_call_id: str | None = None,
        run_status: RunStatus | None = None,
        metadata: dict[str, str] | None = None,
    ) -> LedgerEntry:
        """Append the next entry; ``source_id`` (the source's own id for what this entry records)
        makes its entry id, so a second import of the same file yields the same entry."""
        entry_id = stable_id(f"{self.source}:{self.run_id}", source_id)
        held = (kind, tuple(parts), tool_call_id, run_status)
        first = self._ids.get(entry_id)
        if first is not None:  # the same record again (a log written twice), or another one
            raise RepeatedRecordError(same=first == held)
        self._ids[entry_id] = held
        profile_actor, trust, visibility = PROFILES[kind]
        who = actor or profile_actor
        parent = self.entries[-1].entry_id if self.entries else None
        entry = LedgerEntry(
            entry_id=entry_id,
            fleet_id=self.fleet_id,
            session_id=self.session_id,
            run_id=self.run_id,
            attempt_id="import-1",
            sequence_no=len(self.entries) + 1,
            occurred_at=at,
            actor=Actor(type=who, id=actor_id or f"{self.source}-{who.value.lower()}"),
            kind=kind,
            trust_level=trust,
            visibility=visibility,
            causation=Causation(parent_entry_id=parent, tool_call_id=tool_call_id),
            run_status=run_status,
            parts=tuple(parts),
            metadata={"import.source": self.source, **(metadata or {})},
        )
        self.entries.append(entry)
        return entry

    def request(
        self,
        at: datetime,
        source_id: str,
        call_id: str,
        name: str,
        arguments: Any,
        finished_at: datetime | None = None,
    ) -> LedgerEntry:
        """Append a tool call request: the tool, its permission class (by name) and the hash of
        its arguments (never the arguments themselves)."""
        part = ToolCallPart(
            tool_call_id=call_id,
            tool_name=name,
            permission_class=permission_of(name),
            arguments_hash=sha256_digest(arguments),
            started_at=at,
            finished_at=finished_at,
        )
        return self.add(EntryKind.TOOL_CALL_REQUEST, at, source_id, [part], tool_call_id=call_id)


class FileImporter:
    """An importer whose logs are the files whose name ends with ``SUFFIX``."""

    SUFFIX: ClassVar[str]

    @classmethod
    def discover(cls, paths: Iterable[Path]) -> list[Path]:
        return discover_files(paths, cls.SUFFIX)


def discover_files(paths: Iterable[Path], suffix: str) -> list[Path]:
    """The files named, and under each folder named those whose name ends with ``suffix``
    (sorted); each once, in that order."""
    found: list[Path] = []
    for path in paths:
        found.extend(sorted(path.rglob(f"*{suffix}")) if path.is_dir() else [path])
    return list(dict.fromkeys(found))


def load_json(path: Path, what: str) -> Any:
    """The JSON document in ``path``; a file that is not JSON is not ``what``."""
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise ImportFormatError(f"{path}: not JSON ({exc}); not {what}") from None


def obj(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (logs are read defensively)."""
    return value if isinstance(value, dict) else {}


def stable_id(scope: str, source_id: str) -> str:
    """An entry id from a source id: readable when the source id is a plain id, else hashed; both
    within the contract's id charset and length."""
    text = f"{scope}:{source_id}"
    if len(text) <= 200 and all(c.isalnum() or c in "_.:@/+=#~-" for c in text):
        return text
    return f"{scope[:120]}:h{hashlib.sha256(text.encode()).hexdigest()[:40]}"


def safe_id(text: str) -> str:
    """A run or session id from a name a log gives: itself when it is a plain id (the
    contract's charset and length), else a readable part and a hash of the whole."""
    if 0 < len(text) <= 120 and all(c.isalnum() or c in "_.:@/+=#~-" for c in text):
        return text
    clean = "".join(c if c.isalnum() or c in "_.-" else "-" for c in text)[:60].strip("-")
    return f"{clean or 'run'}-h{hashlib.sha256(text.encode('utf-8', 'replace')).hexdigest()[:16]}"


def sha256_digest(value: Any) -> str:
    """``sha256:<hex>`` of a value's canonical JSON (tool arguments)."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def parse_time(text: Any, zone_note: str | None = None) -> datetime | None:
    """An ISO timestamp; one without a zone is read as UTC (the importer says so in ``zone_note``);
    None when not a time."""
    if not isinstance(text, str) or not text:
        return None
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


# Tools by what they may do; a tool not named here is taken as the most privileged (fail safe).
TOOL_PERMISSIONS: dict[str, PermissionClass] = {
    **dict.fromkeys(
        ["Read", "Glob", "Grep", "LS", "TaskOutput", "TodoWrite", "NotebookRead", "view"],
        PermissionClass.READ_ONLY,
    ),
    **dict.fromkeys(
        ["Edit", "MultiEdit", "Write", "NotebookEdit", "apply_patch", "str_replace_editor"],
        PermissionClass.WORKSPACE_WRITE,
    ),
    **dict.fromkeys(
        ["WebFetch", "WebSearch", "web_search", "web_search_call"], PermissionClass.NETWORK_ACCESS
    ),
}


def permission_of(tool_name: str) -> PermissionClass:
    return TOOL_PERMISSIONS.get(tool_name, PermissionClass.EXECUTE_PRIVILEGED)


def classify(path: str) -> FileClassification:
    """A file's class by its path (tests, config, docs, generated, else source)."""
    lower = path.lower()
    name = lower.rsplit("/", 1)[-1]
    if "/test" in lower or name.startswith("test_") or "_test." in name or ".test." in name:
        return FileClassification.TEST
    if name.endswith((".md", ".rst", ".txt")):
        return FileClassification.DOCUMENTATION
    if name.endswith((".lock", ".min.js")) or "/generated/" in lower:
        return FileClassification.GENERATED
    if name.endswith((".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".exs", ".env")):
        return FileClassification.CONFIG
    return FileClassification.SOURCE


@dataclass
class _PatchFile:
    path: str | None = None
    old_path: str | None = None
    status: FileChangeStatus = FileChangeStatus.MODIFIED
    added: int = 0
    deleted: int = 0


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def patch_files(patch: str) -> list[DiffFile]:
    """The files a unified diff changes, as ``git apply --numstat`` sees them: each file's lines
    added and deleted (a hunk is as long as its header says; CRLF line ends are line ends), its
    status from the git headers (new, deleted, renamed, else modified), paths relative to the
    repository root. A file with no hunks (a new empty file, a mode change) or a binary one is
    kept with 0/0 lines: it changed."""
    files: list[_PatchFile] = []
    current: _PatchFile | None = None
    old_left = new_left = 0  # lines the open hunk still has
    for raw in patch.splitlines():
        line = raw.rstrip("\r")
        if (old_left > 0 or new_left > 0) and current is not None:
            if line.startswith("+"):
                current.added += 1
                new_left -= 1
                continue
            if line.startswith("-"):
                current.deleted += 1
                old_left -= 1
                continue
            if line.startswith("\\"):
                continue
            if line.startswith(" ") or not line:
                old_left, new_left = old_left - 1, new_left - 1
                continue
            old_left = new_left = 0  # a short hunk: what follows is not part of it
        if line.startswith("diff --git "):
            current = _PatchFile()
            current.old_path, current.path = _git_header_paths(line[len("diff --git ") :])
            files.append(current)
        elif line.startswith("--- "):
            if current is None or current.added or current.deleted:  # a plain diff's next file
                current = _PatchFile()
                files.append(current)
            old = _patch_path(line[4:])
            if old is None:
                current.status = FileChangeStatus.ADDED
            else:
                current.old_path = old
        elif line.startswith("+++ ") and current is not None:
            new = _patch_path(line[4:])
            if new is None:
                current.status = FileChangeStatus.DELETED
            else:
                current.path = new
        elif (hunk := _HUNK.match(line)) is not None and current is not None:
            old_left = int(hunk[1]) if hunk[1] is not None else 1
            new_left = int(hunk[2]) if hunk[2] is not None else 1
        elif current is not None and line.startswith("new file mode"):
            current.status = FileChangeStatus.ADDED
        elif current is not None and line.startswith("deleted file mode"):
            current.status = FileChangeStatus.DELETED
        elif current is not None and line.startswith("rename from "):
            current.old_path = line[len("rename from ") :]
            current.status = FileChangeStatus.RENAMED
        elif current is not None and line.startswith("rename to "):
            current.path = line[len("rename to ") :]
            current.status = FileChangeStatus.RENAMED
    out: dict[str, DiffFile] = {}
    for f in files:
        deleted = f.status is FileChangeStatus.DELETED
        path = (f.old_path if deleted else f.path) or f.path or f.old_path
        if not path:
            continue
        renamed = f.status is FileChangeStatus.RENAMED and f.old_path not in (None, path)
        status = FileChangeStatus.MODIFIED if f.status is FileChangeStatus.RENAMED else f.status
        out[path] = DiffFile(
            path=path,
            status=FileChangeStatus.RENAMED if renamed else status,
            lines_added=f.added,
            lines_deleted=f.deleted,
            classification=classify(path),
            old_path=f.old_path if renamed else None,
        )
    return list(out.values())


def _git_header_paths(text: str) -> tuple[str | None, str | None]:
    """``a/X b/Y`` of a ``diff --git`` line (the paths may be quoted)."""
    if text.startswith('"'):
        parts = [p for p in text.split('"') if p.strip()]
        if len(parts) >= 2:
            return _patch_path(parts[0]), _patch_path(parts[-1])
    half = text.find(" b/")
    if text.startswith("a/") and half > 0:
        return text[2:half], text[half + 3 :]
    return None, None


def patch_numstat(patch: str) -> dict[str, tuple[int, int]]:
    """Lines added and deleted per file of a unified diff (see :func:`patch_files`); files by
    their new path (the old path for a deletion)."""
    return {f.path: (f.lines_added, f.lines_deleted) for f in patch_files(patch)}


def _patch_path(text: str) -> str | None:
    path = text.split("\t", 1)[0].strip()
    if path == "/dev/null":
        return None
    return path[2:] if path.startswith(("a/", "b/")) else path


# -- provider usage, as real providers report it ------------------------------------------------


_USAGE_FIELDS: tuple[UsageField, ...] = (
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "latency_ms",
)


@dataclass(frozen=True)
class Usage:
    """One call's usage normalized from an OpenAI-style ``usage`` object (OpenAI, litellm,
    OpenRouter, Portkey, DeepSeek, Anthropic through litellm). ``None``: not reported (unknown,
    never zero). ``notes``: what was normalized, for the entry's metadata and the summary."""

    input_tokens: int | None
    cached_input_tokens: int | None
    cache_write_input_tokens: int | None
    output_tokens: int | None
    reasoning_tokens: int | None
    cost_usd: float | None
    notes: tuple[str, ...] = ()

    latency_ms: int | None = None

    @property
    def unknown(self) -> tuple[UsageField, ...]:
        """The counts the source did not report, in the part's field order (a total unknown
        makes its part unknown too)."""
        unknown = {
            "input_tokens": self.input_tokens is None,
            "cached_input_tokens": self.input_tokens is None or self.cached_input_tokens is None,
            "output_tokens": self.output_tokens is None,
            "reasoning_tokens": self.output_tokens is None or self.reasoning_tokens is None,
            "latency_ms": self.latency_ms is None,
        }
        return tuple(f for f in _USAGE_FIELDS if unknown[f])

    def part(self, **fields: Any) -> ModelUsagePart:
        """The ledger's usage part: unknown counts written as 0 and named in ``unknown_fields``."""
        unknown = self.unknown

        def known(name: UsageField, value: int | None) -> int:
            return 0 if name in unknown or value is None else value

        return ModelUsagePart(
            input_tokens=known("input_tokens", self.input_tokens),
            cached_input_tokens=known("cached_input_tokens", self.cached_input_tokens),
            cache_write_input_tokens=None
            if self.input_tokens is None
            else self.cache_write_input_tokens,
            output_tokens=known("output_tokens", self.output_tokens),
            reasoning_tokens=known("reasoning_tokens", self.reasoning_tokens),
            latency_ms=self.latency_ms or 0,
            provider_reported_cost_usd=self.cost_usd,
            unknown_fields=unknown,
            **fields,
        )


def count(value: Any) -> int | None:
    """A token count as a log holds it (an int, or a float with no fraction); None otherwise."""
    if type(value) is float and value.is_integer():
        value = int(value)
    return value if type(value) is int and value >= 0 else None


def openai_usage(usage: dict[str, Any], cost: Any = None) -> Usage:
    """Normalize a usage object. Providers differ in what includes what: OpenAI counts cached
    prompt tokens inside ``prompt_tokens`` and reasoning inside ``completion_tokens``; some
    (Portkey, Anthropic through older litellm) report reasoning, cache reads or cache writes
    apart. The ledger's counts include their parts, so a part larger than its total is taken
    as reported apart and added to it, with a note; nothing is refused. ``cost``: a per-call
    cost the log holds elsewhere (``usage.cost``, OpenRouter's, is read here)."""
    prompt = count(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = count(usage.get("completion_tokens", usage.get("output_tokens")))
    in_details = obj(usage.get("prompt_tokens_details") or usage.get("input_tokens_details"))
    out_details = obj(usage.get("completion_tokens_details") or usage.get("output_tokens_details"))
    cached = _first_count(
        in_details.get("cached_tokens"),
        usage.get("cache_read_input_tokens"),
        usage.get("prompt_cache_hit_tokens"),
    )
    written = _first_count(
        usage.get("cache_creation_input_tokens"), in_details.get("cache_write_tokens")
    )
    reasoning = _first_count(out_details.get("reasoning_tokens"), usage.get("reasoning_tokens"))
    notes: list[str] = []
    if prompt is not None:
        reported = prompt
        if (cached or 0) > prompt:  # reads apart (and so writes too)
            prompt += cached or 0
        if (cached or 0) + (written or 0) > prompt:  # writes apart
            prompt += written or 0
        if prompt != reported:
            notes.append("cache tokens reported apart from prompt tokens: added to input")
    if completion is not None and reasoning is not None and reasoning > completion:
        completion += reasoning
        notes.append("reasoning tokens reported apart from completion tokens: added to output")
    given = cost if cost is not None else usage.get("cost")
    cost_usd = (  # to the 1e-12 dollar: a log's float noise (0.016626000000000002) dropped
        round(float(given), 12)
        if isinstance(given, int | float) and not isinstance(given, bool) and given >= 0
        else None
    )
    return Usage(prompt, cached, written, completion, reasoning, cost_usd, tuple(notes))


def _first_count(*values: Any) -> int | None:
    return next((c for c in map(count, values) if c is not None), None)


def model_id(provider: str, model: str) -> str:
    """A model id without its provider doubled in front (``google/google/x`` -> ``google/x``,
    ``openrouter/openrouter/x`` -> ``openrouter/x``) or a trailing slash."""
    model = model.strip().strip("/") or "unknown"
    prefix = f"{provider}/"
    while model.startswith(prefix + prefix):
        model = model[len(prefix) :]
    parts = model.split("/")
    while len(parts) > 2 and parts[0] == parts[1]:
        parts = parts[1:]
    return "/".join(parts)


_MODEL_OUTPUT = frozenset({EntryKind.ASSISTANT_RESPONSE, EntryKind.AGENT_THOUGHT_SUMMARY})


def mark_unmetered(runs: Iterable[ImportedRun], summary: Summary) -> None:
    """A run whose log shows model output but holds no model call keeps no usage: how many
    calls it made is unknown (its RUN_STARTED says so), never 0. Found trying the product: a
    log whose 46 calls were all refused by the ledger contract was shown as "no model calls"."""
    for run in runs:
        kinds = {e.kind for e in run.entries}
        first = run.entries[0] if run.entries else None
        if (
            first is None
            or first.kind is not EntryKind.RUN_STARTED
            or EntryKind.MODEL_CALL in kinds
            or not kinds & _MODEL_OUTPUT
            or CALLS_KEY in first.metadata
        ):
            continue
        run.entries[0] = first.model_copy(
            update={"metadata": {**first.metadata, CALLS_KEY: CALLS_UNKNOWN}}
        )
        summary.runs_unmetered += 1
    if summary.runs_unmetered and not summary.calls:  # no call of the file is known
        summary.calls_known = False


# litellm's exception names (mini-swe-agent's exit message starts with one) and the Python
# clients' (an OpenTelemetry span's exception.type): whose fault it was
_PROVIDER_ERRORS = (
    "InternalServerError",
    "ServiceUnavailableError",
    "APIConnectionError",
    "APIError",
    "RateLimitError",
    "BadGatewayError",
)


_CLIENTS = ("litellm.", "openai.", "anthropic.", "httpx.", "google.", "mistralai.", "groq.")


def exit_error(text: str) -> ErrorPart:
    """The error that ended a run, as ``Type: message`` (mini-swe-agent's ``exit`` message,
    e.g. ``litellm.InternalServerError: ...``; a failed OpenTelemetry root span's exception or
    status), by whose fault: one rule for every importer."""
    head = text.split(":", 1)[0]
    if "Timeout" in head:
        # a model call's (mini-swe-agent's `Timeout` status, a provider client's timeout class)
        # or else one of the agent's own (Python's TimeoutError of a tool or sandbox: found by
        # a review once OpenTelemetry root spans came to this rule)
        provider = head == "Timeout" or "APITimeout" in head or head.startswith(_CLIENTS)
        category = "timeout.provider" if provider else "timeout"
    elif any(name in head for name in _PROVIDER_ERRORS):
        category = "provider"
    elif "ContextWindow" in head:
        category = "context"
    else:
        category = "agent"
    return ErrorPart(category=category, message=text[:4000])


@contextmanager
def skipping(summary: Summary, what: str = "record") -> Iterator[None]:
    """Map one record; one the importer cannot map (a field missing, of another type, a value
    the ledger contract refuses) is skipped and counted with its reason, named by field, never
    by value. A file of another format still raises ImportFormatError."""
    try:
        yield
    except ImportFormatError:
        raise
    except RepeatedRecordError as exc:  # the first is kept; a second that says the same is no loss
        if exc.same:
            summary.skipped[f"repeated {what} (the same as an earlier one, counted once)"] += 1
        else:
            summary.skipped[
                f"{what} with the id of an earlier, different one (the first kept)"
            ] += 1
            summary.unmapped += 1
    except ValidationError as exc:
        summary.skipped[
            f"{what} breaking the ledger contract at {validation_error(exc).field}"
        ] += 1
        summary.unmapped += 1
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as exc:
        summary.skipped[f"{what} the importer cannot map ({type(exc).__name__})"] += 1
        summary.unmapped += 1


# -- evaluation verdicts ----------------------------------------------------------------------

EVAL_PROFILE = "swe-bench-eval"  # names an evaluation: failure-classifications reclassifies on it
VERDICT_REF = "agentledger.eval-verdict@1"


@dataclass(frozen=True)
class Verdict:
    """An evaluation's verdict on a run: resolved or not, by which harness, with its details
    (e.g. the test counts of a SWE-bench report)."""

    resolved: bool
    harness: str  # e.g. "swe-bench", "openhands-eval"
    details: dict[str, Any] = field(default_factory=dict)

    def parts(self) -> list[Part]:
        status = VerificationStatus.PASSED if self.resolved else VerificationStatus.FAILED
        check = VerificationPart(
            verifier=self.harness, profile=EVAL_PROFILE, status=status, check_id="eval-resolved"
        )  # (the check's key is verifier:check_id; "eval" in it names an evaluation)
        body = {"resolved": self.resolved, **self.details}
        return [check, JsonPart(json_text=json.dumps(body, sort_keys=True), schema_ref=VERDICT_REF)]

    def source_id(self) -> str:
        """The verdict's own id: the same verdict on a run (from any report that gives it: an
        instance's report and a run-level one agree) is one entry; a changed verdict another."""
        return f"verdict-{self.harness}-{'resolved' if self.resolved else 'unresolved'}"


def tests_status_counts(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    """A SWE-bench report's ``tests_status``: per category, how many tests succeeded and failed."""
    out: dict[str, dict[str, int]] = {}
    for category, result in obj(report.get("tests_status")).items():
        result = obj(result)
        out[str(category)] = {
            key: len(result[key])
            for key in ("success", "failure")
            if isinstance(result.get(key), list)
        }
    return out
