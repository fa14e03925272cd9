"""OpenHands event streams / trajectories (a JSON list of events) as ledger runs.

One file is one run (``oh-<file stem>``). OpenHands writes timestamps **without a zone**; they are
read as UTC (the summary says so).

**The double count**: an action and the observation it caused both carry the same
``tool_call_metadata.model_response`` (and its usage). A model call is counted once per response
id, where it first appears. Usage is LiteLLM's OpenAI shape, whose ``prompt_tokens`` already
include the cache reads and writes (``cache_read_input_tokens``, ``cache_creation_input_tokens``).
Latency is not recorded (unknown).

Mapping: a user ``message`` is a ``USER_TASK``; the model's text is an ``ASSISTANT_RESPONSE``;
actions with a tool call (``run``, ``edit``, ``read``, ...) are ``TOOL_CALL_REQUEST`` s and their
observations ``TOOL_CALL_RESULT`` s (``run``: the exit code); an edit observation with the file's
old and new content is a ``DIFF_SNAPSHOT`` of that file; ``finish`` ends the run as
``SUCCEEDED`` (the agent says it is done; no evaluation is in the file), an ``error`` agent state
as ``FAILED``, or ``STEP_LIMIT`` when the error says the iteration limit was reached.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from schemas.models import (
    DiffFile,
    DiffPart,
    EntryKind,
    FileChangeStatus,
    ModelCallStatus,
    RunStatus,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    ToolResultStatus,
)
from streams.importers.base import (
    ImportedRun,
    ImportFormatError,
    Summary,
    model_id,
    obj,
    openai_usage,
    parse_time,
    permission_of,
    sha256_digest,
    shorten,
)
from streams.importers.claude_code import classify

FORMAT = "openhands"


def discover(paths: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        found.extend(sorted(path.rglob("*.json")) if path.is_dir() else [path])
    return list(dict.fromkeys(found))


def import_file(
    path: Path, fleet_id: str, settled: bool = False
) -> tuple[list[ImportedRun], Summary]:
    try:
        events = json.loads(path.read_bytes())
    except ValueError as exc:
        raise ImportFormatError(f"{path}: not JSON ({exc})") from None
    if isinstance(events, dict):  # a trajectory object holding its events
        events = events.get("history") or events.get("events")
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ImportFormatError(f"{path}: not a list of OpenHands events")
    summary = Summary(str(path))
    summary.notes.append("OpenHands timestamps carry no zone: read as UTC")
    run = ImportedRun(f"oh-{path.stem}", fleet_id, path.stem, FORMAT)
    seen: set[str] = set()
    status: RunStatus | None = None
    at = None
    for event in events:
        at = parse_time(event.get("timestamp")) or at
        if at is None:
            summary.skipped["event without a timestamp"] += 1
            continue
        if not run.entries:
            run.add(EntryKind.RUN_STARTED, at, "start", [TextPart(text="run imported")])
        eid = str(event.get("id"))
        meta = obj(event.get("tool_call_metadata"))
        response = obj(meta.get("model_response"))
        if response and isinstance(response.get("id"), str):
            if response["id"] in seen:
                summary.duplicate_reports += 1
            else:
                seen.add(response["id"])
                _model_call(run, response, at, summary)
        action, observation = event.get("action"), event.get("observation")
        call_id = meta.get("tool_call_id") if isinstance(meta.get("tool_call_id"), str) else None
        if action == "message" and event.get("source") == "user":
            text = str(obj(event.get("args")).get("content") or event.get("message") or "")
            if text.strip():
                run.add(EntryKind.USER_TASK, at, f"e{eid}", [TextPart(text=text)])
        elif action == "finish":
            text = str(event.get("message") or "")
            if text.strip():
                run.add(EntryKind.ASSISTANT_RESPONSE, at, f"e{eid}", [TextPart(text=text)])
            status = RunStatus.SUCCEEDED
        elif action is not None and call_id is not None:
            name = str(meta.get("function_name") or action)
            part = ToolCallPart(
                tool_call_id=call_id,
                tool_name=name,
                permission_class=permission_of(name),
                arguments_hash=sha256_digest(event.get("args")),
                started_at=at,
            )
            run.add(EntryKind.TOOL_CALL_REQUEST, at, f"e{eid}", [part], tool_call_id=call_id)
        elif observation is not None and call_id is not None:
            _observation(run, event, call_id, at, eid)
        elif observation == "agent_state_changed":
            state = str(obj(event.get("extras")).get("agent_state") or "")
            if state == "error":
                reason = str(event.get("message") or event.get("content") or "").lower()
                limited = "iteration" in reason or "max_iterations" in reason
                status = RunStatus.STEP_LIMIT if limited else RunStatus.FAILED
            summary.skipped["agent_state_changed"] += 1
        else:
            summary.skipped[f"{action or observation}"] += 1
    if at is not None and status is not None:
        run.add(
            EntryKind.RUN_FINISHED,
            at,
            "finish",
            [TextPart(text=f"finished: {status.value}")],
            run_status=status,
        )
    summary.runs, summary.entries = (1 if run.entries else 0), len(run.entries)
    return ([run] if run.entries else []), summary


def _model_call(run: ImportedRun, response: dict[str, Any], at: Any, summary: Summary) -> None:
    usage = obj(response.get("usage"))
    normalized = openai_usage(usage)
    if normalized.input_tokens is None or normalized.output_tokens is None:
        summary.skipped["model response without usage"] += 1
        return
    model = str(response.get("model") or "unknown")
    provider = "anthropic" if "claude" in model else model.split("/", 1)[0]
    choice = obj((response.get("choices") or [{}])[0])
    part = normalized.part(
        provider=provider,
        model=model_id(provider, model),
        purpose="agent",
        provider_response_id=response["id"],
        finish_reason=str(choice.get("finish_reason")) if choice.get("finish_reason") else None,
        status=ModelCallStatus.OK,
        raw_usage_json=json.dumps(usage),
    )
    summary.notes += [note for note in normalized.notes if note not in summary.notes]
    run.add(
        EntryKind.MODEL_CALL,
        at,
        f"call-{response['id']}",
        [part],
        metadata={"import.usage": "; ".join(normalized.notes)} if normalized.notes else None,
    )
    text = obj(choice.get("message")).get("content")
    if isinstance(text, str) and text.strip():
        run.add(EntryKind.ASSISTANT_RESPONSE, at, f"text-{response['id']}", [TextPart(text=text)])
    summary.calls += 1
    summary.input_tokens += part.input_tokens
    summary.output_tokens += part.output_tokens


def _observation(run: ImportedRun, event: dict[str, Any], call_id: str, at: Any, eid: str) -> None:
    extras = obj(event.get("extras"))
    exit_code = obj(extras.get("metadata")).get("exit_code")
    code = exit_code if type(exit_code) is int else None
    failed = (code not in (None, 0)) or event.get("observation") == "error"
    content = event.get("content")
    text = content if isinstance(content, str) else str(event.get("message") or "")
    part = ToolResultPart(
        tool_call_id=call_id,
        status=ToolResultStatus.FAILED if failed else ToolResultStatus.SUCCEEDED,
        exit_code=code,
        timed_out=False,
        summary=shorten(text),
    )
    run.add(EntryKind.TOOL_CALL_RESULT, at, f"e{eid}", [part], tool_call_id=call_id)
    if event.get("observation") == "edit" and isinstance(extras.get("path"), str) and not failed:
        old, new = extras.get("old_content"), extras.get("new_content")
        if isinstance(new, str):
            before = old.splitlines() if isinstance(old, str) else []
            added = deleted = 0
            for line in difflib.unified_diff(before, new.splitlines(), lineterm="", n=0):
                if line.startswith("+") and not line.startswith("+++"):
                    added += 1
                elif line.startswith("-") and not line.startswith("---"):
                    deleted += 1
            created = not extras.get("prev_exist")
            diff = DiffFile(
                path=extras["path"],
                status=FileChangeStatus.ADDED if created else FileChangeStatus.MODIFIED,
                lines_added=added,
                lines_deleted=deleted,
                classification=classify(extras["path"]),
            )
            run.add(EntryKind.DIFF_SNAPSHOT, at, f"e{eid}-diff", [DiffPart(files=(diff,))])
