"""Secrets end to end: every secret of tests/secrets/corpus.py, in every free-text and name field
an entry has, published with the real CLI and folded by a real worker into every projection;
then not one of them in Kafka (ledger and dead-letter topics, every record's key, value and
headers), PostgreSQL (pg_dump), Redis (every key and value of the deployment's prefix), the
worker's log or any CLI output. Secrets in identifiers are refused, line by line, unechoed.

Assertion messages name a secret's family and where it was found, never the secret: CI logs are
kept.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import re2
import redis

from infra.settings import Settings
from projectors.registry import GROUPS, NAMES
from projectors.stores.redis import view_key
from schemas.codec import LedgerCodec
from schemas.factory import BASE_TIME, EntryBuilder, digest, sha256_hex
from schemas.json_form import to_json_text
from schemas.models import (
    METADATA_KEY_PATTERN,
    STEP_ID_PATTERN,
    Actor,
    ActorType,
    ArtifactRef,
    Causation,
    ContextItem,
    ContextItemKind,
    ContextItemsPart,
    DiffFile,
    DiffPart,
    EntryKind,
    ErrorPart,
    FileChangeStatus,
    FileClassification,
    FileSnippetPart,
    JsonPart,
    LedgerEntry,
    MemoryProposalPart,
    ModelCallStatus,
    ModelUsagePart,
    Part,
    PermissionClass,
    ProposedDecision,
    ProposedFact,
    ProposedProblem,
    Redaction,
    RedactionLevel,
    RedactionType,
    RunStatus,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    ToolResultStatus,
    TrustLevel,
    VerificationPart,
    VerificationStatus,
    Visibility,
)
from schemas.topics import dead_letter_topic, ledger_topic
from streams.deployment import PrivateDeployment
from streams.engine import SourceRecord
from streams.source import read_all
from tests.secrets.corpus import Secret, secrets

pytestmark = pytest.mark.integration

FLEETS = ["fleet-01", "fleet-02"]
SECRETS = secrets()
RUNS = 50  # 590 secrets in 50 runs of 11-12 secrets, 166-180 entries each
MARKER = "[REDACTED:"
DLQ_LIST = ("dlq", "list", "--json")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# How each run ends: final status and the category of its last error (None: no error).
OUTCOMES: tuple[tuple[RunStatus, str | None], ...] = (
    (RunStatus.FAILED, "tool.crash"),
    (RunStatus.FAILED, "sandbox.oom"),
    (RunStatus.FAILED, "provider.rate_limit"),
    (RunStatus.TIMED_OUT, "timeout.wall_clock"),
    (RunStatus.BUDGET_EXCEEDED, "budget.exceeded"),
    (RunStatus.FAILED, "context.overflow"),
    (RunStatus.SUCCEEDED, None),
    (RunStatus.POLICY_DENIED, "policy.network"),
    (RunStatus.FAILED, "verifier.test_failure"),
)


def _name(text: str) -> str:
    """The text as a name field allows it: no control characters, at most 4096 characters."""
    name = _CONTROL.sub(" ", text)
    assert len(name) <= 4096, "every corpus text fits a name field"
    return name


# --------------------------------------------------------------------------- the entries


@dataclass
class Corpus:
    """What the JSONL files hold: lines, entries per run, and where each secret was put."""

    lines: list[str] = field(default_factory=list)
    runs: dict[str, int] = field(default_factory=dict)  # run id -> entries
    fleets: dict[str, str] = field(default_factory=dict)  # run id -> fleet
    # entry id -> (secret index, the field paths that carry it)
    carriers: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)
    calls: dict[str, str] = field(default_factory=dict)  # run id -> its first secret model call

    @property
    def placements(self) -> int:
        return sum(len(paths) for _, paths in self.carriers.values())


class _Run:
    """One run's entries (gapless, from EntryBuilder), recording which fields carry a secret."""

    def __init__(self, corpus: Corpus, run_id: str, fleet: str, start_hours: int) -> None:
        self.corpus = corpus
        self.b = EntryBuilder(
            run_id,
            fleet_id=fleet,
            session_id=f"{run_id}-session",
            # a refused run's id holds a secret, which an attempt id's format cannot hold
            attempt_id=f"{run_id}-a1" if re.fullmatch(STEP_ID_PATTERN, f"{run_id}-a1") else "a1",
            start=BASE_TIME + timedelta(hours=start_hours),
        )
        self.run_id = run_id

    def next_time(self, later_s: int = 0) -> Any:
        return self.b.time(len(self.b.entries) + 1) + timedelta(seconds=later_s)

    def add(
        self,
        kind: EntryKind,
        parts: Sequence[Part],
        carrier: tuple[int, tuple[str, ...]] | None = None,
        *,
        parent: LedgerEntry | None = None,
        tool_call_id: str | None = None,
        metadata: dict[str, str] | None = None,
        **fields: Any,
    ) -> LedgerEntry:
        previous = parent or (self.b.entries[-1] if self.b.entries else None)
        causation = Causation(
            parent_entry_id=previous.entry_id if previous else None, tool_call_id=tool_call_id
        )
        entry = self.b.add(
            kind, tuple(parts), causation=causation, metadata=metadata or {}, **fields
        )
        if carrier is not None:
            self.corpus.carriers[entry.entry_id] = carrier
        return entry

    def close(self) -> None:
        self.corpus.lines += [to_json_text(e) for e in self.b.entries]
        self.corpus.runs[self.run_id] = len(self.b.entries)
        self.corpus.fleets[self.run_id] = self.b.fleet_id


def _usage(response_id: str, raw: dict[str, Any], names: str | None = None) -> ModelUsagePart:
    return ModelUsagePart(
        provider=names or "openai",
        model=names or "gpt-4.1",
        purpose=names or "coding",
        provider_response_id=response_id,
        input_tokens=int(raw["input_tokens"]),
        cached_input_tokens=0,
        output_tokens=int(raw["output_tokens"]),
        reasoning_tokens=0,
        latency_ms=2400,
        finish_reason=names or "stop",
        status=ModelCallStatus.OK,
        provider_reported_cost_usd=None,
        raw_usage_json=json.dumps(raw),
    )


def _artifact(name: str, content_type: str = "text/plain") -> ArtifactRef:
    return ArtifactRef(
        artifact_id=f"art-{name}",
        sha256=sha256_hex(name),
        size_bytes=2048,
        content_type=content_type,
        redaction_level=RedactionLevel.RESTRICTED,
    )


def _start(r: _Run, goal: str) -> None:
    r.add(
        EntryKind.RUN_STARTED,
        [TextPart(text=f"run started for task: {goal}")],
        metadata={
            "task_budget_usd": "0.50",
            "scope": "src/",
            "repository": "github.com/example/shop",
            "base_sha": "3f2a9c1",
        },
    )
    r.add(
        EntryKind.SYSTEM_INSTRUCTION, [TextPart(text="You are a coding agent. Obey the sandbox.")]
    )
    r.add(EntryKind.USER_TASK, [TextPart(text=goal)], metadata={"scope": "src/"})
    ctx = r.add(EntryKind.CONTEXT_PROJECTED, [ContextItemsPart(items=())])
    raw = {"input_tokens": 18000, "output_tokens": 900}
    call = r.add(EntryKind.MODEL_CALL, [_usage(f"{r.run_id}-resp-plan", raw)], parent=ctx)
    plan = "1. read the code 2. reproduce with a test 3. fix 4. run the tests"
    r.add(EntryKind.ASSISTANT_RESPONSE, [TextPart(text=plan)], parent=call, metadata={"plan": plan})
    _tool(r, "run_tests", ToolResultStatus.FAILED, "2 failed, 40 passed")
    files = (
        DiffFile(
            path="src/api/orders.py",
            status=FileChangeStatus.MODIFIED,
            lines_added=14,
            lines_deleted=3,
            classification=FileClassification.SOURCE,
        ),
    )
    r.add(EntryKind.DIFF_SNAPSHOT, [DiffPart(files=files, workspace_tree_hash=f"{r.run_id}-t0")])


def _tool(r: _Run, name: str, status: ToolResultStatus, summary: str) -> None:
    call_id = f"{r.run_id}-{name}-{len(r.b.entries)}"
    request = r.add(
        EntryKind.TOOL_CALL_REQUEST,
        [
            ToolCallPart(
                tool_call_id=call_id,
                tool_name=name,
                permission_class=PermissionClass.EXECUTE_SAFE,
                arguments_hash=digest(name),
                started_at=r.next_time(),
                finished_at=r.next_time(1),
            )
        ],
        tool_call_id=call_id,
    )
    failed = status is not ToolResultStatus.SUCCEEDED
    r.add(
        EntryKind.TOOL_CALL_RESULT,
        [
            ToolResultPart(
                tool_call_id=call_id,
                status=status,
                exit_code=1 if failed else 0,
                timed_out=False,
                summary=summary,
            )
        ],
        parent=request,
        tool_call_id=call_id,
    )


def _finish(r: _Run, status: RunStatus, category: str | None) -> None:
    if category is not None:
        message = f"{category}: the step could not complete"
        r.add(EntryKind.ERROR_EVENT, [ErrorPart(category=category, message=message)])
    r.add(EntryKind.RUN_FINISHED, [TextPart(text=f"run ended {status.value}")], run_status=status)


def _carry(r: _Run, k: int, s: Secret, j: int) -> None:
    """Secret ``k``'s text in every free-text and name field, over 14 entries of a run."""
    t, n, v = s.text, _name(s.text), s.value
    rid = r.run_id
    task = r.add(
        EntryKind.USER_TASK,
        [TextPart(text=t)],
        (k, ("parts[0].text", "actor.id", "metadata.note", "metadata.api_key")),
        actor=Actor(type=ActorType.USER, id=n),
        metadata={"note": t, "api_key": v},
    )
    items = (
        ContextItem(
            item_kind=ContextItemKind.FILE_SLICE,
            trust_level=TrustLevel.REPOSITORY_UNTRUSTED,
            visibility=Visibility.MODEL_VISIBLE,
            sha256=sha256_hex(t),
            tokens=len(t) // 4 + 1,
            path=n,
            line_start=1,
            line_end=t.count("\n") + 1,
            section="repository_data",
        ),
        ContextItem(
            item_kind=ContextItemKind.CONVERSATION_TURN,
            source_entry_id=task.entry_id,
            trust_level=TrustLevel.USER_TRUSTED,
            visibility=Visibility.MODEL_VISIBLE,
            sha256=sha256_hex(t),
            tokens=len(t) // 4 + 1,
            section=n,
        ),
    )
    ctx = r.add(
        EntryKind.CONTEXT_PROJECTED,
        [ContextItemsPart(items=items)],
        (k, ("parts[0].items[0].path", "parts[0].items[1].section")),
    )
    raw = {"input_tokens": 4000 + 10 * j, "output_tokens": 300, "debug": t}
    call = r.add(
        EntryKind.MODEL_CALL,
        [
            _usage(f"{rid}-resp-{j}", raw),
            _usage(f"{rid}-resp-{j}-b", {"input_tokens": 10, "output_tokens": 1}, n),
        ],
        (
            k,
            (
                "parts[0].raw_usage_json",
                "parts[1].provider",
                "parts[1].model",
                "parts[1].purpose",
                "parts[1].finish_reason",
            ),
        ),
        parent=ctx,
    )
    r.corpus.calls.setdefault(rid, call.entry_id)
    r.add(
        EntryKind.ASSISTANT_RESPONSE,
        [TextPart(text=t)],
        (k, ("parts[0].text", "metadata.plan")),
        parent=call,
        metadata={"plan": t},
    )
    call_id = f"{rid}-call-{j}"
    request = r.add(
        EntryKind.TOOL_CALL_REQUEST,
        [
            ToolCallPart(
                tool_call_id=call_id,
                tool_name=n,
                permission_class=PermissionClass.EXECUTE_SAFE,
                arguments_hash=digest(t),
                started_at=r.next_time(),
                finished_at=r.next_time(1),
            )
        ],
        (k, ("parts[0].tool_name",)),
        tool_call_id=call_id,
    )
    failed = j % 3 == 0
    result = r.add(
        EntryKind.TOOL_CALL_RESULT,
        [
            ToolResultPart(
                tool_call_id=call_id,
                status=ToolResultStatus.FAILED if failed else ToolResultStatus.SUCCEEDED,
                exit_code=1 if failed else 0,
                timed_out=False,
                summary=t,
                artifact_refs=(_artifact(f"{call_id}-out", n),),
            )
        ],
        (k, ("parts[0].summary", "parts[0].artifact_refs[0].content_type")),
        parent=request,
        tool_call_id=call_id,
    )
    lines = t.count("\n") + 1
    r.add(
        EntryKind.FILE_OBSERVATION,
        [
            FileSnippetPart(
                path=n,
                line_start=1,
                line_end=lines,
                commit_sha="3f2a9c1",
                content_hash=digest(t),
                text=t,
            ),
            FileSnippetPart(
                path="config/.env", line_start=1, line_end=lines, content_hash=digest(t), text=t
            ),
        ],
        (k, ("parts[0].path", "parts[0].text", "parts[1].text")),
        parent=result,
        tool_call_id=call_id,
    )
    files = (
        DiffFile(
            path=n,
            status=FileChangeStatus.MODIFIED,
            lines_added=3,
            lines_deleted=1,
            classification=FileClassification.CONFIG,
        ),
        DiffFile(
            path=f"src/app/moved_{j}.py",
            status=FileChangeStatus.RENAMED,
            lines_added=0,
            lines_deleted=0,
            classification=FileClassification.SOURCE,
            old_path=n,
        ),
    )
    r.add(
        EntryKind.DIFF_SNAPSHOT,
        [
            DiffPart(
                files=files,
                diff_artifact=_artifact(f"{rid}-patch-{j}", n),
                base_sha="3f2a9c1",
                workspace_tree_hash=f"{rid}-t{j}",
            )
        ],
        (
            k,
            (
                "parts[0].files[0].path",
                "parts[0].files[1].old_path",
                "parts[0].diff_artifact.content_type",
            ),
        ),
    )
    verifier = r.add(
        EntryKind.VERIFIER_RESULT,
        [
            VerificationPart(
                verifier=n,
                profile=n,
                status=VerificationStatus.PASSED if j % 2 else VerificationStatus.FAILED,
                diagnostics_ref=_artifact(f"{rid}-diag-{j}", n),
                check_id=n,
            )
        ],
        (
            k,
            (
                "parts[0].verifier",
                "parts[0].profile",
                "parts[0].check_id",
                "parts[0].diagnostics_ref.content_type",
            ),
        ),
    )
    r.add(
        EntryKind.ERROR_EVENT,
        [ErrorPart(category=n, message=t, signature=n)],
        (k, ("parts[0].category", "parts[0].message", "parts[0].signature")),
    )
    proposal = MemoryProposalPart(
        facts=(ProposedFact(fact=t, evidence_refs=(f"entry:{result.entry_id}",)),),
        problems=(ProposedProblem(problem=t, evidence_refs=(f"entry:{verifier.entry_id}",)),),
        decisions=(
            ProposedDecision(decision=t, reason=t, evidence_refs=(f"tool-call:{call_id}",)),
        ),
    )
    r.add(
        EntryKind.MEMORY_UPDATE_PROPOSED,
        [proposal],
        (
            k,
            (
                "parts[0].facts[0].fact",
                "parts[0].problems[0].problem",
                "parts[0].decisions[0].decision",
                "parts[0].decisions[0].reason",
            ),
        ),
    )
    request_doc = json.dumps({"action": "deploy", "log": t, "api_key": v})
    approval = r.add(
        EntryKind.APPROVAL_REQUEST,
        [JsonPart(json_text=request_doc, schema_ref=n), JsonPart(json_text=json.dumps(t))],
        (
            k,
            (
                "parts[0].json_text.log",
                "parts[0].json_text.api_key",
                "parts[0].schema_ref",
                "parts[1].json_text",
            ),
        ),
    )
    r.add(
        EntryKind.APPROVAL_DECISION,
        [JsonPart(json_text=json.dumps({"approved": True, "comment": t}))],
        (k, ("parts[0].json_text.comment",)),
        parent=approval,
        metadata={"decision": "APPROVED"},
    )
    r.add(
        EntryKind.JUDGE_RESULT,
        [
            VerificationPart(verifier="judge@1", profile="scope", status=VerificationStatus.PASSED),
            TextPart(text=t),
        ],
        (k, ("parts[1].text", "redactions[0].field", "redactions[0].rule")),
        redactions=(Redaction(type=RedactionType.POLICY, field=n, rule=n),),
    )


def _chunks(items: Sequence[int], count: int) -> Iterator[Sequence[int]]:
    size, extra = divmod(len(items), count)
    at = 0
    for i in range(count):
        step = size + (1 if i < extra else 0)
        yield items[at : at + step]
        at += step


def build_corpus() -> Corpus:
    """Every corpus secret in every field, in RUNS runs over both fleets."""
    corpus = Corpus()
    for i, chunk in enumerate(_chunks(range(len(SECRETS)), RUNS)):
        r = _Run(corpus, f"sec-run-{i:02d}", FLEETS[i % len(FLEETS)], i)
        _start(r, "Rotate the leaked credentials in the deployment config")
        for j, k in enumerate(chunk, start=1):
            _carry(r, k, SECRETS[k], j)
        _finish(r, *OUTCOMES[i % len(OUTCOMES)])
        r.close()
    return corpus


@dataclass
class Refused:
    """A JSONL file with secrets in identifiers: the lines to refuse and the field of each."""

    lines: list[str]
    refused: dict[int, str]  # line number (from 1) -> field path the report names
    refused_runs: set[str]
    valid: Corpus  # the valid run after them


def _bare(pattern: str, count: int, skip: set[int]) -> list[int]:
    """Corpus secrets that stand alone and fit an identifier's charset."""
    fits = re.compile(pattern)
    found = [
        k
        for k, s in enumerate(SECRETS)
        if s.text == s.value and fits.match(s.value) and k not in skip
    ]
    return found[:count]


def build_refused() -> Refused:
    """Three-entry runs whose first entry holds a secret in an identifier (published with
    --partial, the rest of such a run is held back, so nothing of it is sent), then one valid
    run."""
    picked = _bare(r"^[A-Za-z0-9_.:@/+=#~-]{8,200}$", 5, set())
    run_key, entry_key, session_key, call_key, ref_key = picked
    (meta_key,) = _bare(METADATA_KEY_PATTERN, 1, set(picked))
    lines: list[str] = []
    refused: dict[int, str] = {}
    runs: set[str] = set()

    def run(run_id: str, why: str, first_parts: Sequence[Part] = (), **first: Any) -> None:
        r = _Run(Corpus(), run_id, FLEETS[0], 100)
        r.add(EntryKind.RUN_STARTED, first_parts or [TextPart(text="run started")], **first)
        r.add(EntryKind.USER_TASK, [TextPart(text="Fix the pagination bug")])
        r.add(EntryKind.RUN_FINISHED, [TextPart(text="done")], run_status=RunStatus.FAILED)
        runs.add(run_id)
        for i, e in enumerate(r.b.entries):
            lines.append(to_json_text(e))
            if i == 0:
                refused[len(lines)] = why

    # every entry of that run holds it; its entry ids embed the run id, so the first identifier
    # found may be either (the entry id since the generalised rules of issue 27's fourth round)
    run(SECRETS[run_key].value, "run_id|entry_id")
    for n in (len(lines) - 1, len(lines)):
        refused[n] = "run_id|entry_id"
    run("refused-entry-id", "entry_id", entry_id=SECRETS[entry_key].value)
    refused[len(lines) - 1] = "causation.parent_entry_id"  # the next entry cites it
    run("refused-session-id", "session_id", session_id=SECRETS[session_key].value)
    call = ToolCallPart(
        tool_call_id=SECRETS[call_key].value,
        tool_name="shell",
        permission_class=PermissionClass.EXECUTE_SAFE,
        arguments_hash=digest("x"),
        started_at=BASE_TIME,
    )
    run("refused-tool-call-id", "parts[0].tool_call_id", [call])
    proposal = MemoryProposalPart(
        facts=(ProposedFact(fact="the build fails", evidence_refs=(SECRETS[ref_key].value,)),)
    )
    run("refused-evidence-ref", "parts[0].facts[0].evidence_refs[0]", [proposal])
    run("refused-metadata-key", "metadata.<key>", metadata={SECRETS[meta_key].value: "x"})
    valid = Corpus()
    ok = _Run(valid, "sec-run-after-refused", FLEETS[1], 101)
    _start(ok, "Publish after refused lines")
    _carry(ok, meta_key, SECRETS[meta_key], 1)  # the metadata-key secret, now in text: redacted
    _finish(ok, RunStatus.SUCCEEDED, None)
    ok.close()
    return Refused(lines + valid.lines, refused, runs, valid)


# --------------------------------------------------------------------------- the search


def _copy_escaped(text: str) -> str:
    """How PostgreSQL's COPY text format writes a value."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def _forms(value: str) -> set[bytes]:
    """Every form a secret could take in the stores: itself, as a name (control characters as
    spaces), JSON-escaped (ASCII or not), Python repr, HTML-escaped, as PostgreSQL COPY and SQL
    literals write them, and as bytea hex."""
    forms = {value, _name(value)}
    forms |= {json.dumps(f)[1:-1] for f in list(forms)}
    forms |= {json.dumps(f, ensure_ascii=False)[1:-1] for f in list(forms)}
    forms |= {repr(f)[1:-1] for f in list(forms)}
    forms |= {html.escape(f) for f in list(forms)}
    forms |= {_copy_escaped(f) for f in list(forms)}
    forms |= {f.replace("'", "''") for f in list(forms)}
    encoded = {f.encode() for f in forms}
    encoded.add(value.encode().hex().encode())
    return encoded


class Searcher:
    """Every form of every secret, searched in named haystacks; hits are (family, where)."""

    def __init__(self, corpus: Sequence[Secret]) -> None:
        by_needle: dict[bytes, set[int]] = defaultdict(set)
        for k, s in enumerate(corpus):
            for needle in _forms(s.value):
                by_needle[needle].add(k)
        self.needles = sorted(by_needle.items(), key=lambda item: item[0])
        # One RE2 pass (a DFA over every needle) says whether any is there at all; only then
        # is each needle looked for on its own. 1,281 separate scans of 135 MB took 20 s.
        options = re2.Options()
        options.max_mem = 1 << 30
        self.any = re2.compile(b"|".join(re2.escape(n) for n, _ in self.needles), options)
        self.families = [s.family for s in corpus]
        self.bytes_searched: dict[str, int] = defaultdict(int)

    def find(self, haystack: bytes) -> list[int]:
        """The corpus indices of the secrets with a form in ``haystack``."""
        if self.any.search(haystack) is None:
            return []
        return sorted({k for needle, ks in self.needles if needle in haystack for k in ks})

    def search(self, store: str, where: str, haystack: bytes) -> list[tuple[str, str]]:
        self.bytes_searched[store] += len(haystack)
        return [(self.families[k], where) for k in self.find(haystack)]

    def scrub(self, text: str) -> str:
        """Text safe to print: every secret form replaced by its family."""
        data = text.encode(errors="replace")
        for needle, ks in sorted(self.needles, key=lambda item: -len(item[0])):
            if needle in data:
                data = data.replace(needle, f"<secret:{self.families[min(ks)]}>".encode())
        return data.decode(errors="replace")


def _report(hits: Iterable[tuple[str, str]], limit: int = 60) -> str:
    ordered = sorted(set(hits))
    shown = "\n".join(f"  {family} @ {where}" for family, where in ordered[:limit])
    more = f"\n  ... and {len(ordered) - limit} more" if len(ordered) > limit else ""
    return f"{len(ordered)} secret hits (family @ where):\n{shown}{more}"


def _record_bytes(record: SourceRecord) -> bytes:
    parts = [record.key or b"", record.value or b""]
    for name, value in record.headers:
        parts += [name.encode(), value or b""]
    return b"\n\x00\n".join(parts)


def _search_topics(searcher: Searcher, records: Sequence[SourceRecord]) -> list[tuple[str, str]]:
    """One search over all of a topic's bytes; on a hit, record by record to say where."""
    by_topic: dict[str, list[SourceRecord]] = defaultdict(list)
    for rec in records:
        by_topic[rec.topic].append(rec)
    hits: list[tuple[str, str]] = []
    for topic, recs in sorted(by_topic.items()):
        blob = b"\n\x00\x00\n".join(_record_bytes(r) for r in recs)
        if searcher.search("kafka", topic, blob):
            for rec in recs:
                where = f"{topic}/{rec.partition}/{rec.offset}"
                hits += [(searcher.families[k], where) for k in searcher.find(_record_bytes(rec))]
    return hits


def _pg_dump(dsn: str, *extra: str) -> bytes:
    binary = "/usr/lib/postgresql/15/bin/pg_dump"
    if not os.path.exists(binary):
        binary = shutil.which("pg_dump") or "pg_dump"
    proc = subprocess.run(
        [binary, "--no-owner", *extra, "--dbname", dsn],
        capture_output=True,
        timeout=120,
        check=False,
    )
    code = proc.returncode  # not the process itself: its repr would hold the dump
    assert code == 0, f"pg_dump failed: {proc.stderr.decode(errors='replace')[:500]}"
    return proc.stdout


def _search_dump(searcher: Searcher, label: str, dump: bytes) -> list[tuple[str, str]]:
    """Search a dump table by table (COPY blocks or INSERT statements name the table)."""
    tables: dict[str, list[bytes]] = defaultdict(list)
    current = "schema"
    for line in dump.split(b"\n"):
        if line.startswith(b"COPY "):
            current = line.split(b" ")[1].decode()
        elif line.startswith(b"INSERT INTO "):
            current = line.split(b" ")[2].decode()
        elif line == b"\\.":
            current = "schema"
        tables[current].append(line)
    hits: list[tuple[str, str]] = []
    for table, lines in sorted(tables.items()):
        hits += searcher.search("postgresql", f"{label}:{table}", b"\n".join(lines))
    return hits


def _redis_dump(client: redis.Redis, prefix: str) -> dict[str, bytes]:
    """Every key under ``prefix:`` with all its values, as bytes."""
    keys = sorted(client.scan_iter(match=f"{prefix}:*", count=1000))
    types = client.pipeline()
    for key in keys:
        types.type(key)
    reads = client.pipeline()
    kinds = [t.decode() if isinstance(t, bytes) else str(t) for t in types.execute()]
    for key, kind in zip(keys, kinds, strict=True):
        if kind == "string":
            reads.get(key)
        elif kind == "hash":
            reads.hgetall(key)
        elif kind == "list":
            reads.lrange(key, 0, -1)
        elif kind == "set":
            reads.smembers(key)
        elif kind == "zset":
            reads.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            reads.xrange(key)
        else:
            raise AssertionError(f"Redis key of type {kind}: read it here too")
    out: dict[str, bytes] = {}
    for key, kind, value in zip(keys, kinds, reads.execute(), strict=True):
        out[key.decode()] = key + b"\n" + kind.encode() + b"\n" + _flatten(value)
    return out


def _flatten(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str | int | float):
        return str(value).encode()
    if isinstance(value, dict):
        return b"\n".join(_flatten(k) + b"\n" + _flatten(v) for k, v in value.items())
    if isinstance(value, list | tuple | set):
        return b"\n".join(_flatten(v) for v in value)
    return repr(value).encode()


# --------------------------------------------------------------------------- the deployment


class Deployment(PrivateDeployment):
    def applied(self) -> dict[tuple[str, str], int]:
        """(projection, run) -> applied sequence number, live builds."""
        with psycopg.connect(self.settings.pg_address) as conn:
            rows = conn.execute(
                "SELECT projection, run_id, applied_seq FROM al_run_state "
                "JOIN al_live USING (projection, build)"
            ).fetchall()
        return {(str(p), str(r)): int(s) for p, r, s in rows}

    def live_builds(self) -> dict[str, str]:
        with psycopg.connect(self.settings.pg_address) as conn:
            rows = conn.execute("SELECT projection, build FROM al_live").fetchall()
        return {str(p): str(b) for p, b in rows}

    def cli(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        env = {**self.env(), "COLUMNS": "400"}
        return subprocess.run(
            [sys.executable, "-m", "infra.main", *args],
            env=env,
            capture_output=True,
            timeout=180,
            check=False,
        )


@pytest.fixture
def deployment(services: Settings, tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(services, "secrets", FLEETS, tmp_path / "logs")
    asyncio.run(d.create())
    yield d
    d.drop()


def _wait_applied(
    d: Deployment, expected: dict[str, int], searcher: Searcher, timeout_s: float
) -> None:
    want = {(p, r): n for p in NAMES for r, n in expected.items()}
    deadline = time.monotonic() + timeout_s
    behind: list[tuple[str, str]] = []
    while time.monotonic() < deadline:
        got = d.applied()
        behind = sorted(k for k, n in want.items() if got.get(k) != n)
        if not behind:
            return
        time.sleep(0.5)
    log = searcher.scrub(d.log_of("w").read_text(errors="replace"))[-3000:]
    raise AssertionError(f"{len(behind)} (projection, run) not applied, e.g. {behind[:5]}\n{log}")


def _wait_redis(d: Deployment, expected: dict[str, int], timeout_s: float) -> None:
    builds = d.live_builds()
    client = redis.Redis.from_url(d.settings.redis_address)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            pipe = client.pipeline()
            keys = [
                (projection, run_id)
                for projection in GROUPS["agent"]
                for run_id in sorted(expected)
            ]
            for projection, run_id in keys:
                key = view_key(d.settings.redis_prefix, projection, builds[projection], run_id)
                pipe.hget(key, "seq")
            seqs = pipe.execute()
            behind = [
                k for k, s in zip(keys, seqs, strict=True) if s != str(expected[k[1]]).encode()
            ]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(behind)} Redis views behind, e.g. {behind[:5]}")
            time.sleep(0.3)
    finally:
        client.close()


def _publish(d: Deployment, path: Path) -> subprocess.CompletedProcess[bytes]:
    return d.cli("publish", "--partial", str(path))


def _output(proc: subprocess.CompletedProcess[bytes]) -> bytes:
    return proc.stdout + b"\n" + proc.stderr


def _search_cli(searcher: Searcher, label: str, out: bytes) -> list[tuple[str, str]]:
    """CLI output as printed, and with its line breaks removed (a terminal renderer may fold a
    long value over lines)."""
    return searcher.search("cli", label, out) + searcher.search(
        "cli", f"{label} (unwrapped)", out.replace(b"\n", b"")
    )


def _verdict(leaks: list[tuple[str, str]], unrecorded: list[tuple[str, str, str]]) -> None:
    if leaks or unrecorded:
        raise AssertionError(
            f"{_report(leaks)}\ncarriers without a redaction record: {unrecorded[:40]}"
        )


# --------------------------------------------------------------------------- the test


def test_no_corpus_secret_reaches_kafka_postgres_redis_logs_or_cli(
    deployment: Deployment, tmp_path: Path
) -> None:
    d = deployment
    started = time.monotonic()
    searcher = Searcher(SECRETS)
    planted = b"\n".join(f"<{s.value}>".encode() for s in SECRETS)
    assert searcher.find(planted) == list(range(len(SECRETS))), "the search finds each secret"
    leaks: list[tuple[str, str]] = []
    corpus = build_corpus()
    refused = build_refused()
    carriers = {**corpus.carriers, **refused.valid.carriers}
    assert corpus.placements >= len(SECRETS) * 40
    assert {k for k, _ in corpus.carriers.values()} == set(range(len(SECRETS)))

    # 1-2. the JSONL, one file per fleet published side by side, and the refused-ids file
    files: list[Path] = []
    for fleet in FLEETS:
        path = tmp_path / f"secrets-{fleet}.jsonl"
        lines = [line for line, run_id in _line_runs(corpus) if corpus.fleets[run_id] == fleet]
        path.write_text("\n".join(lines) + "\n")
        files.append(path)
    bad = tmp_path / "secrets-in-identifiers.jsonl"
    bad.write_text("\n".join(refused.lines) + "\n")
    with ThreadPoolExecutor(3) as pool:
        published = list(pool.map(lambda p: _publish(d, p), [*files, bad]))
    for path, proc in zip(files, published[:2], strict=True):
        out = _output(proc)
        code = proc.returncode  # never the process in an assertion: its repr holds the output
        assert code == 0, f"{path.name}: {searcher.scrub(out.decode())[-2000:]}"
        leaks += _search_cli(searcher, f"publish {path.name}", out)
    counts = [
        int(m) for p in published[:2] for m in re.findall(rb"published (\d+) entries", p.stdout)
    ]
    assert sum(counts) == sum(corpus.runs.values())

    # 3. secrets in identifiers: those lines refused (exit 2), by line and field, unechoed
    proc = published[2]
    leaks += _search_cli(searcher, f"publish {bad.name}", _output(proc))
    stderr = searcher.scrub(proc.stderr.decode(errors="replace"))
    code = proc.returncode
    assert code == 2, stderr[-2000:]
    reported = dict(re.findall(r"^line (\d+): (\S+):", stderr, re.M))
    assert set(reported) == {str(n) for n in refused.refused}, stderr[-3000:]
    for n, f in refused.refused.items():
        assert reported[str(n)] in f.split("|"), stderr[-3000:]
        alternatives = "|".join(re.escape(one) for one in f.split("|"))
        assert re.search(rf"^line {n}: (?:{alternatives}): looks like a secret", stderr, re.M)
    valid_sent = sum(refused.valid.runs.values())
    stdout = searcher.scrub(proc.stdout.decode(errors="replace"))
    assert f"published {valid_sent} entries" in stdout
    expected = {**corpus.runs, **refused.valid.runs}
    published_s = time.monotonic() - started

    # 4. a worker folds everything into every projection (PostgreSQL, then the Redis views)
    d.start_worker("w")
    d.wait_partitions("w")
    _wait_applied(d, expected, searcher, timeout_s=240)
    _wait_redis(d, expected, timeout_s=30)
    applied_s = time.monotonic() - started

    # 5. the read commands, as a user runs them
    runs = ["sec-run-00", "sec-run-01", "sec-run-06", "sec-run-49", "sec-run-after-refused"]
    first, second = runs[0], runs[1]
    commands: list[tuple[str, ...]] = [
        ("memory", first, "--json"),
        ("memory", first),
        ("memory", first, "--at", "40", "--json"),
        ("context", first, "--render"),
        ("context", first, "--json"),
        ("context", first, "--call", corpus.calls[first], "--json"),
        ("timeline", first, "--json"),
        ("timeline", first),
        ("failures", first, "--json"),
        ("memory", second, "--json"),
        ("context", second, "--render"),
        ("timeline", second, "--json"),
        ("failures", second, "--json"),
    ]
    for run_id in runs[2:]:
        commands += [("memory", run_id, "--json"), ("context", run_id, "--render")]
    commands += [
        ("costs", "--by", "run", "--json"),
        ("costs", "--by", "model", "--json"),
        ("failures", "--json"),
        DLQ_LIST,
        ("replay-package", first, "--out", str(tmp_path / "package")),
    ]
    with ThreadPoolExecutor(4) as pool:
        outputs = dict(zip(commands, pool.map(lambda c: d.cli(*c), commands), strict=True))
    for command, proc in outputs.items():
        label = " ".join(command).replace(str(tmp_path), "TMP")
        out = _output(proc)
        code = proc.returncode
        assert code == 0, f"{label}: {searcher.scrub(out.decode())[-1500:]}"
        leaks += _search_cli(searcher, label, out)
    for path in sorted((tmp_path / "package").rglob("*")):
        if path.is_file():
            leaks += searcher.search("cli", f"replay-package/{path.name}", path.read_bytes())
    dead = [(x["error_class"], x["source"]) for x in json.loads(outputs[DLQ_LIST].stdout)]
    assert not dead, "dead letters (error class, source)"

    read_s = time.monotonic() - started

    # 6a. Kafka: every record of the ledger and dead-letter topics, key, value and headers
    ledger = [ledger_topic(d.settings.topic_prefix, f) for f in FLEETS]
    letters = [dead_letter_topic(d.settings.topic_prefix, f) for f in FLEETS]
    records = asyncio.run(read_all(d.settings.kafka_address, ledger))
    dlq_records = asyncio.run(read_all(d.settings.kafka_address, letters))
    assert len(records) == sum(expected.values())
    leaks += _search_topics(searcher, [*records, *dlq_records])
    # 6b. PostgreSQL: a plain-text dump (schema and COPY data) and the data as INSERT statements
    dsn = d.settings.pg_address
    dumps = {
        "pg_dump": _pg_dump(dsn),
        "pg_dump --inserts": _pg_dump(dsn, "--data-only", "--inserts"),
    }
    for label, dump in dumps.items():
        leaks += _search_dump(searcher, label, dump)
    # 6c. Redis: every key under the deployment's prefix, every value
    client = redis.Redis.from_url(d.settings.redis_address)
    try:
        dumped = _redis_dump(client, d.settings.redis_prefix)
    finally:
        client.close()
    assert len(dumped) >= len(expected) * len(GROUPS["agent"])
    for key, blob in sorted(dumped.items()):
        leaks += searcher.search("redis", key, blob)
    # 6d. the worker's log
    leaks += searcher.search("log", d.log_of("w").name, d.log_of("w").read_bytes())
    # what was searched holds the redacted material (so an empty store cannot pass)
    marker = MARKER.encode()
    unmarked_stores = [
        store
        for store, found in (
            ("kafka", any(marker in (r.value or b"") for r in records)),
            *((label, marker in dump) for label, dump in dumps.items()),
            ("redis", any(marker in blob for blob in dumped.values())),
        )
        if not found
    ]
    assert not unmarked_stores, f"no {MARKER} marker in {unmarked_stores}"

    searched_s = time.monotonic() - started

    # 7. redaction is visible: recorded per field (type + field + rule), markers in the views
    entries = LedgerCodec().decode_many([r.value for r in records if r.value is not None])
    by_id = {e.entry_id: e for e in entries}
    assert set(by_id) >= set(carriers)
    sent_refused = len({e.run_id for e in entries} & refused.refused_runs)
    assert sent_refused == 0, "entries of refused runs were sent"
    unrecorded: list[tuple[str, str, str]] = []
    for entry_id, (k, paths) in sorted(carriers.items()):
        fields = [r.field for r in by_id[entry_id].redactions if r.rule]
        for p in paths:
            if not any(f == p or f.startswith((f"{p}.", f"{p}[")) for f in fields):
                unrecorded.append((SECRETS[k].family, by_id[entry_id].kind.value, p))
    recorded = [r for e in entries for r in e.redactions]
    assert len(recorded) >= corpus.placements - len(unrecorded)
    assert {r.type for r in recorded} <= {
        RedactionType.SECRET_PATTERN,
        RedactionType.CREDENTIAL,
        RedactionType.POLICY,  # the input's own records, kept (their field and rule redacted)
    }
    elapsed = time.monotonic() - started
    print(
        f"\nsecrets e2e: {len(SECRETS)} secrets x {corpus.placements / len(SECRETS):.0f} fields = "
        f"{corpus.placements} placements in {sum(expected.values())} entries of "
        f"{len(expected)} runs; {len(refused.refused)} lines refused; {len(recorded)} "
        f"redaction records; {len(searcher.needles)} needles; bytes searched: "
        f"{dict(searcher.bytes_searched)}; published {published_s:.1f} s, applied "
        f"{applied_s:.1f} s, read {read_s:.1f} s, searched {searched_s:.1f} s, "
        f"total {elapsed:.1f} s"
    )
    # every view of a run shows markers; a failure explanation quotes redacted evidence
    views = [c for c in outputs if c[0] in ("memory", "context", "timeline")]
    views += [("failures", first, "--json"), ("failures", second, "--json")]
    views.append(("costs", "--by", "model", "--json"))
    unmarked = [" ".join(c) for c in views if MARKER.encode() not in outputs[c].stdout]
    assert not unmarked, f"no {MARKER} marker in: {unmarked}"
    _verdict(leaks, unrecorded)


def _line_runs(corpus: Corpus) -> Iterator[tuple[str, str]]:
    for line in corpus.lines:
        yield line, json.loads(line)["run_id"]
