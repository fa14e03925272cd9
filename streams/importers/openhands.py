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

An **evaluation output** instance has ended: ``finish`` is a submission (``SUBMITTED``), its
``error`` ends it as ``FAILED`` (``STEP_LIMIT`` for the iteration limit), neither as ``UNKNOWN``;
its final patch (``test_result.git_patch``) is the truth for its files (edits then make no diff
snapshots; sandbox paths ``/workspace/<repo>/...`` are made relative), and its verdict
(``test_result``: ``report.resolved``, ``resolved``, ``result``, a ``final_score`` with checks)
is a ``VERIFIER_RESULT`` after ``RUN_FINISHED``, so the run's class says resolved or not.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from projectors.working_memory import AUTO_REPLY_KEY
from schemas.models import (
    DiffFile,
    DiffPart,
    EntryKind,
    FileChangeStatus,
    ModelCallStatus,
    RunStatus,
    TextPart,
    ToolResultPart,
    ToolResultStatus,
)
from streams.importers.base import (
    ImportedRun,
    ImportFormatError,
    Summary,
    Verdict,
    classify,
    model_id,
    obj,
    openai_usage,
    parse_time,
    patch_files,
    safe_id,
    skipping,
    tests_status_counts,
)

FORMAT = "openhands"


def discover(paths: Iterable[Path]) -> list[Path]:
    """Event files and evaluation outputs (``*.json``, ``*.jsonl``) under the paths; a V0
    on-disk session (``events/0.json`` ... beside ``metadata.json``) is one run: its folder."""
    found: list[Path] = []
    for path in paths:
        if not path.is_dir() or _is_session(path):
            found.append(path)
            continue
        sessions = sorted({p.parent.parent for p in path.rglob("events/*.json")})
        sessions = [p for p in sessions if _is_session(p)]
        sessions += sorted({p.parent for p in path.rglob("*.json") if _is_completion_log(p)})
        for candidate in sorted([*path.rglob("*.json"), *path.rglob("*.jsonl")]):
            if not any(candidate.is_relative_to(session) for session in sessions):
                found.append(candidate)
        found.extend(sessions)
    return list(dict.fromkeys(found))


def _is_session(path: Path) -> bool:
    return path.is_dir() and (path / "events").is_dir() and (path / "metadata.json").is_file()


def _is_completion_log(path: Path) -> bool:
    """An LLM completion log (``log_completions``: one call a file, ``messages`` and
    ``response``); small files only are opened to tell."""
    if path.suffix != ".json" or path.stat().st_size > 16 * 1024 * 1024:
        return False
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        return False
    return _completion(doc) is not None


def _completion(doc: Any) -> dict[str, Any] | None:
    if (
        isinstance(doc, dict)
        and isinstance(doc.get("response"), dict)
        and isinstance(doc.get("messages"), list)
        and "history" not in doc
    ):
        return doc
    return None


def import_file(
    path: Path, fleet_id: str, settled: bool = False
) -> tuple[list[ImportedRun], Summary]:
    """One file (or session folder) as runs, its layout recognised by content: a JSON list of
    events; an object holding them (``history``/``events``); an evaluation output (JSONL, one
    instance a line: a run each); a V0 session folder (one JSON file per event)."""
    summary = Summary(str(path))
    summary.notes.append("OpenHands timestamps carry no zone: read as UTC")
    if path.is_dir() and not _is_session(path):
        return _done([_completions(path, fleet_id, summary)], summary)
    if path.is_dir():
        events = _session_events(path)
        run = _run(events, f"oh-{path.name}", path.name, fleet_id, summary)
        return _done([run], summary)
    data = path.read_bytes()
    try:
        doc: Any = json.loads(data)
        instances = None
    except (ValueError, RecursionError) as exc:
        instances = _jsonl(data)
        if instances is None:
            raise ImportFormatError(f"{path}: not JSON ({exc})") from None
    if instances is not None:
        if not any(isinstance(i.get("history"), list) for i in instances):
            raise ImportFormatError(
                f"{path}: JSON lines, but no line holds a 'history'; not an OpenHands "
                "evaluation output"
            )
        models = [m for m in map(_model_of, instances) if m is not None]
        if models and len(models) < len(instances):
            summary.notes.append(
                f"{len(instances) - len(models)} instances name no model: taken as the file's "
                f"({models[0]})"
            )
        runs = [
            _instance(instance, n, path, fleet_id, summary, models[0] if models else "unknown")
            for n, instance in enumerate(instances)
        ]
        return _done(runs, summary)
    if isinstance(doc, dict) and isinstance(doc.get("history"), list) and _instance_id(doc):
        return _done([_instance(doc, 0, path, fleet_id, summary)], summary)
    held: Any = doc
    if isinstance(held, dict):  # a trajectory object holding its events
        held = held.get("history") or held.get("events")
    if not isinstance(held, list) or not any(isinstance(e, dict | list) for e in held):
        raise ImportFormatError(f"{path}: not a list of OpenHands events")
    return _done([_run(held, f"oh-{path.stem}", path.stem, fleet_id, summary)], summary)


def _done(runs: list[ImportedRun | None], summary: Summary) -> tuple[list[ImportedRun], Summary]:
    kept = [r for r in runs if r is not None and r.entries]
    summary.runs, summary.entries = len(kept), sum(len(r.entries) for r in kept)
    return kept, summary


def _completions(folder: Path, fleet_id: str, summary: Summary) -> ImportedRun | None:
    """A folder of LLM completion logs as one run: a model call a file (its usage, the
    provider's per-call ``cost``, ``latency_sec``), in time order; the first file's prompt
    gives the instructions and the task, each response its text and tool calls."""
    logs = []
    for file in sorted(folder.glob("*.json")):
        try:
            doc = _completion(json.loads(file.read_bytes()))
        except (ValueError, RecursionError):
            doc = None
        if doc is None:
            summary.skipped["file that is not a completion log"] += 1
            continue
        logs.append(doc)
    if not logs:
        raise ImportFormatError(f"{folder}: no OpenHands session or completion logs in it")
    logs.sort(key=_stamp)
    run = ImportedRun(f"oh-llm-{folder.name}", fleet_id, folder.name, FORMAT)
    summary.notes.append("completion logs: one model call a file; tool results are not in them")
    seen: set[str] = set()
    for n, doc in enumerate(logs):
        with skipping(summary, "completion log"):
            stamp = doc.get("timestamp")
            at = datetime.fromtimestamp(stamp, UTC) if isinstance(stamp, int | float) else None
            if at is None:
                summary.skipped["completion log without a timestamp"] += 1
                continue
            if not run.entries:
                run.add(EntryKind.RUN_STARTED, at, "start", [TextPart(text="run imported")])
                for m, message in enumerate(doc["messages"]):
                    role = obj(message).get("role")
                    text = _content_text(obj(message).get("content"))
                    if role in ("system", "user") and text.strip():
                        kind = (
                            EntryKind.SYSTEM_INSTRUCTION
                            if role == "system"
                            else EntryKind.USER_TASK
                        )
                        run.add(kind, at, f"prompt-{m}", [TextPart(text=text)])
            response = doc["response"]
            rid = response.get("id") if isinstance(response.get("id"), str) else f"file-{n}"
            if rid in seen:
                summary.duplicate_reports += 1
                continue
            seen.add(rid)
            latency = doc.get("latency_sec")
            usage = openai_usage(obj(response.get("usage")), doc.get("cost"))
            if isinstance(latency, int | float) and latency >= 0:
                usage = replace(usage, latency_ms=round(latency * 1000))
            model = str(response.get("model") or "unknown")
            choice = obj((response.get("choices") or [{}])[0])
            part = usage.part(
                provider=_provider_of(model),
                model=_model_name(model),
                purpose="agent",
                provider_response_id=rid,
                finish_reason=str(choice["finish_reason"]) if choice.get("finish_reason") else None,
                status=ModelCallStatus.OK,
                raw_usage_json=json.dumps(obj(response.get("usage"))),
            )
            run.add(EntryKind.MODEL_CALL, at, f"call-{rid}", [part])
            summary.calls += 1
            summary.input_tokens += part.input_tokens
            summary.output_tokens += part.output_tokens
            message = obj(choice.get("message"))
            text = _content_text(message.get("content"))
            if text.strip():
                run.add(EntryKind.ASSISTANT_RESPONSE, at, f"text-{rid}", [TextPart(text=text)])
            for call in message.get("tool_calls") or []:
                function = obj(obj(call).get("function"))
                call_id = obj(call).get("id")
                if not isinstance(call_id, str):
                    continue
                name = str(function.get("name") or "tool")
                run.request(at, f"call-{call_id}", call_id, name, function.get("arguments"))
    return run


def _stamp(doc: dict[str, Any]) -> float:
    stamp = doc.get("timestamp")
    return float(stamp) if isinstance(stamp, int | float) else 0.0


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(c.get("text") or "") for c in content if isinstance(c, dict) and "text" in c
        )
    return ""


def _jsonl(data: bytes) -> list[dict[str, Any]] | None:
    """An evaluation output's instances (one JSON object a line), or None if it is not one."""
    out = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(doc, dict):
            return None
        out.append(doc)
    return out or None


def _session_events(folder: Path) -> list[Any]:
    """A V0 session's events, by their number (10 after 9, not after 1)."""
    files = [p for p in (folder / "events").glob("*.json") if p.stem.isdigit()]
    events = []
    for file in sorted(files, key=lambda p: int(p.stem)):
        try:
            events.append(json.loads(file.read_bytes()))
        except (ValueError, RecursionError):
            raise ImportFormatError(f"{file}: not JSON") from None
    return events


def _instance_id(doc: dict[str, Any]) -> str | None:
    value = doc.get("instance_id", doc.get("id"))
    return str(value) if isinstance(value, str | int) and str(value) else None


def _model_of(doc: dict[str, Any]) -> str | None:
    metadata = obj(doc.get("metadata"))
    model = metadata.get("model_name") or obj(metadata.get("llm")).get("model")
    return model if isinstance(model, str) and model else None


def _instance(
    doc: dict[str, Any],
    n: int,
    path: Path,
    fleet_id: str,
    summary: Summary,
    file_model: str = "unknown",
) -> ImportedRun | None:
    """One evaluation instance: its ``history`` (flat events, [action, observation] pairs, or
    V1 ``kind`` events) as a run ``oh-<file stem>-<instance id>``."""
    history = doc.get("history")
    if not isinstance(history, list):
        summary.skipped["instance without a history"] += 1
        return None
    instance = safe_id(_instance_id(doc) or f"line-{n + 1}")
    model = _model_of(doc) or file_model
    run_id = f"oh-{path.stem}-{instance}"
    return _run(history, run_id, instance, fleet_id, summary, model=model, evaluated=doc)


def _flat(events: Iterable[Any]) -> list[dict[str, Any]]:
    """Events in order: [action, observation] pairs (2024 outputs) taken apart."""
    out: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, list):
            out.extend(e for e in event if isinstance(e, dict))
        elif isinstance(event, dict):
            out.append(event)
    return out


def _run(
    events: Iterable[Any],
    run_id: str,
    session: str,
    fleet_id: str,
    summary: Summary,
    model: str = "unknown",
    evaluated: dict[str, Any] | None = None,
) -> ImportedRun:
    """``evaluated``: the evaluation output's instance whose history this is (its run has ended;
    ``finish`` is a submission; ``error``, ``test_result`` and the final patch are read)."""
    run = ImportedRun(run_id, fleet_id, session, FORMAT)
    patch = _final_patch(evaluated) if evaluated is not None else None
    seen: set[str] = set()
    status: RunStatus | None = None
    at = None
    events = list(events)
    paired = any(isinstance(e, list) for e in events)  # 2024 outputs: no tool call ids
    flat = _flat(events)
    if len(flat) < sum(len(e) if isinstance(e, list) else 1 for e in events):
        summary.skipped["event that is not a JSON object"] += sum(
            len(e) if isinstance(e, list) else 1 for e in events
        ) - len(flat)
    for event in flat:
        with skipping(summary, "event"):
            at = parse_time(event.get("timestamp")) or at
            if at is None:
                summary.skipped["event without a timestamp"] += 1
                continue
            if not run.entries:
                run.add(EntryKind.RUN_STARTED, at, "start", [TextPart(text="run imported")])
            eid = str(event.get("id"))
            if paired and event.get("source") == "agent" and isinstance(event.get("action"), str):
                _unmetered_call(run, f"llm-e{eid}", None, model, at, summary)  # one per action
            if isinstance(event.get("kind"), str):  # OpenHands V1 (software-agent-sdk) events
                status = _v1_event(run, event, at, eid, seen, model, summary) or status
                continue
            meta = obj(event.get("tool_call_metadata"))
            response = obj(meta.get("model_response"))
            if response and isinstance(response.get("id"), str):
                if response["id"] in seen:
                    summary.duplicate_reports += 1
                else:
                    seen.add(response["id"])
                    _model_call(run, response, at, summary)
            action, observation = event.get("action"), event.get("observation")
            call_id = (
                meta.get("tool_call_id") if isinstance(meta.get("tool_call_id"), str) else None
            )
            if (
                call_id is None
                and paired
                and event.get("source") == "agent"
                and action != "message"
            ):
                cause = event.get("cause") if observation is not None else event.get("id")
                call_id = f"event-{cause}" if isinstance(cause, int | str) else None
            if action == "message" and event.get("source") == "user":
                text = str(obj(event.get("args")).get("content") or event.get("message") or "")
                if text.strip():
                    _user_message(run, at, f"e{eid}", text)
            elif action == "finish":
                text = str(event.get("message") or "")
                if text.strip():
                    run.add(EntryKind.ASSISTANT_RESPONSE, at, f"e{eid}", [TextPart(text=text)])
                status = RunStatus.SUCCEEDED if evaluated is None else RunStatus.SUBMITTED
            elif isinstance(action, str) and call_id is not None:
                name = str(meta.get("function_name") or action)
                run.request(at, f"e{eid}", call_id, name, event.get("args"))
            elif isinstance(observation, str) and call_id is not None and _asked(run, call_id):
                _observation(
                    run, event, call_id, at, eid, edits=patch is None, sandbox=evaluated is not None
                )
            elif observation == "agent_state_changed":
                state = str(obj(event.get("extras")).get("agent_state") or "")
                if state == "error":
                    reason = str(event.get("message") or event.get("content") or "").lower()
                    limited = "iteration" in reason or "max_iterations" in reason
                    status = RunStatus.STEP_LIMIT if limited else RunStatus.FAILED
                summary.skipped["agent_state_changed"] += 1
            else:
                summary.skipped[_kind_of(action, observation)] += 1
    if evaluated is not None and at is not None:
        status = _evaluated_status(evaluated, status, summary)
        if patch is not None and (files := patch_files(patch)):
            run.add(EntryKind.DIFF_SNAPSHOT, at, "patch", [DiffPart(files=tuple(files))])
    if at is not None and status is not None:
        run.add(
            EntryKind.RUN_FINISHED,
            at,
            "finish",
            [TextPart(text=f"finished: {status.value}")],
            run_status=status,
        )
    if evaluated is not None and at is not None and run.entries:
        verdict = _verdict(evaluated)
        if verdict is None:
            summary.notes.append(
                f"{session}: its test_result holds no verdict (e.g. 0 of 0 checks): not evaluated"
            )
        else:
            run.add(EntryKind.VERIFIER_RESULT, at, verdict.source_id(), verdict.parts())
    return run


def _final_patch(doc: dict[str, Any]) -> str | None:
    """The instance's final patch (``test_result.git_patch``, older outputs' ``git_patch``)."""
    for holder in (obj(doc.get("test_result")), doc):
        patch = holder.get("git_patch")
        if isinstance(patch, str):
            return patch
    return None


def _evaluated_status(doc: dict[str, Any], status: RunStatus | None, summary: Summary) -> RunStatus:
    """How an evaluated instance ended: its ``error`` (the iteration limit: ``STEP_LIMIT``),
    else what its events said, else ``UNKNOWN`` (it ended, but nothing says how; not running)."""
    error = doc.get("error")
    if isinstance(error, str) and error.strip():
        text = error.lower()
        limited = "iteration" in text or "max_iterations" in text or "step limit" in text
        return RunStatus.STEP_LIMIT if limited else RunStatus.FAILED
    if status is None:
        summary.notes.append("an instance ended with no finish and no error: status UNKNOWN")
        return RunStatus.UNKNOWN
    return RunStatus.SUBMITTED if status is RunStatus.SUCCEEDED else status  # (V1's finish)


def _verdict(doc: dict[str, Any]) -> Verdict | None:
    """The evaluation's verdict in ``test_result`` (or ``report``): SWE-bench style
    ``report.resolved`` / ``resolved``, a boolean ``result``, or a ``final_score`` with checks
    (all of them passed: resolved; no checks at all: no verdict)."""
    result = obj(doc.get("test_result"))
    report = obj(result.get("report")) or obj(doc.get("report"))
    for holder in (report, result):
        if isinstance(holder.get("resolved"), bool):
            return Verdict(holder["resolved"], "openhands-eval", tests_status_counts(holder))
    if isinstance(result.get("result"), bool):
        return Verdict(result["result"], "openhands-eval")
    score = obj(result.get("final_score"))
    total, got = score.get("total"), score.get("result")
    if type(total) is int and type(got) is int and total > 0:
        return Verdict(got >= total, "openhands-eval", {"score": got, "total": total})
    return None


def _unmetered_call(
    run: ImportedRun, source_id: str, rid: str | None, model: str, at: Any, summary: Summary
) -> None:
    """A model call the output shows (an action the model chose) but keeps no usage of: its
    tokens and cost are unknown, never 0."""
    provider = _provider_of(model)
    part = openai_usage({}).part(
        provider=provider,
        model=_model_name(model),
        purpose="agent",
        provider_response_id=rid,
        status=ModelCallStatus.OK,
        raw_usage_json="{}",
    )
    run.add(EntryKind.MODEL_CALL, at, source_id, [part])
    summary.calls += 1
    if _UNMETERED not in summary.notes:
        summary.notes.append(_UNMETERED)


_UNMETERED = "the output keeps no usage: each model call's tokens and cost are unknown"


def _model_name(model: str) -> str:
    """The model's own name, without routing prefixes (``litellm_proxy/neulab/gpt-4o`` ->
    ``gpt-4o``) when the provider is known from it."""
    name = model.rsplit("/", 1)[-1]
    return name if _provider_of(name) != "unknown" else model_id("", model)


def _provider_of(model: str) -> str:
    """The provider a model id names (``litellm_proxy/neulab/gpt-4o``: the model's own name
    decides; ``gpt-4o-2024-05-13``: openai)."""
    name = model.rsplit("/", 1)[-1].lower()
    if name.startswith(("gpt-", "o1", "o3", "o4", "chatgpt")):
        return "openai"
    if name.startswith("claude"):
        return "anthropic"
    if name.startswith("gemini"):
        return "google"
    return model.split("/", 1)[0] if "/" in model else "unknown"


def _id_like(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _asked(run: ImportedRun, call_id: str) -> bool:
    """Whether the run holds the request of this call (a result needs one)."""
    return any(e.causation.tool_call_id == call_id for e in reversed(run.entries[-50:]))


def _kind_of(action: Any, observation: Any) -> str:
    """A short name of what was skipped (never a whole event)."""
    for value in (action, observation):
        if isinstance(value, str) and value:
            return value[:60]
        if isinstance(value, dict) and isinstance(value.get("kind"), str):
            return str(value["kind"])[:60]
    return "event of no known kind"


def _v1_event(
    run: ImportedRun,
    event: dict[str, Any],
    at: Any,
    eid: str,
    seen: set[str],
    model: str,
    summary: Summary,
) -> RunStatus | None:
    """An OpenHands V1 event (``kind``): an ActionEvent is a tool call (and, once per
    ``llm_response_id``, a model call whose usage the output does not keep: unknown, never 0);
    an ObservationEvent its result; a user MessageEvent the task."""
    kind = event["kind"]
    call_id = event.get("tool_call_id") if _id_like(event.get("tool_call_id")) else None
    name = str(event.get("tool_name") or "tool")
    if kind == "ActionEvent" and call_id is not None:
        rid = event.get("llm_response_id")
        if isinstance(rid, str) and rid not in seen:
            seen.add(rid)
            _unmetered_call(run, f"call-{rid}", rid, model, at, summary)
        elif isinstance(rid, str):
            summary.duplicate_reports += 1
        thought = event.get("thought")
        text = (
            " ".join(str(t.get("text") or "") for t in thought if isinstance(t, dict))
            if isinstance(thought, list)
            else str(thought or "")
        )
        if text.strip():
            run.add(EntryKind.ASSISTANT_RESPONSE, at, f"e{eid}-thought", [TextPart(text=text)])
        run.request(at, f"e{eid}", call_id, name, event.get("action"))
        return RunStatus.SUCCEEDED if name == "finish" else None
    if kind == "ObservationEvent" and call_id is not None and _asked(run, call_id):
        observation = obj(event.get("observation"))
        code = observation.get("exit_code")
        exit_code = code if type(code) is int else None
        failed = exit_code not in (None, 0) or bool(observation.get("error"))
        output = observation.get("output", observation.get("content"))
        result = ToolResultPart(
            tool_call_id=call_id,
            status=ToolResultStatus.FAILED if failed else ToolResultStatus.SUCCEEDED,
            exit_code=exit_code,
            timed_out=False,
            summary=output if isinstance(output, str) else json.dumps(output),
        )
        run.add(EntryKind.TOOL_CALL_RESULT, at, f"e{eid}", [result], tool_call_id=call_id)
        return None
    if kind == "MessageEvent" and event.get("source") == "user":
        message = obj(event.get("llm_message"))
        content = message.get("content")
        text = (
            " ".join(str(c.get("text") or "") for c in content if isinstance(c, dict))
            if isinstance(content, list)
            else str(content or "")
        )
        if text.strip():
            _user_message(run, at, f"e{eid}", text)
            return None
    summary.skipped[kind[:60]] += 1
    return None


# OpenHands' evaluation harness answers in the user's place whenever the agent asks
# (codeact_user_response: "Please continue working on the task on whatever approach you think is
# suitable..."): a user message, but not the task
_AUTO_REPLY = re.compile(r"^\s*Please continue working on the task\b", re.IGNORECASE)


def _user_message(run: ImportedRun, at: Any, source_id: str, text: str) -> None:
    """A user message as a USER_TASK; the harness's automatic reply is marked (not the goal)."""
    meta = {AUTO_REPLY_KEY: "true"} if _AUTO_REPLY.match(text) else None
    run.add(EntryKind.USER_TASK, at, source_id, [TextPart(text=text)], metadata=meta)


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


def _observation(
    run: ImportedRun,
    event: dict[str, Any],
    call_id: str,
    at: Any,
    eid: str,
    edits: bool = True,
    sandbox: bool = False,
) -> None:
    """A tool's observation; an edit's file change is a ``DIFF_SNAPSHOT`` unless ``edits`` is
    off (the run has a final patch, which is the truth for its files). ``sandbox``: an
    evaluation's, whose repository is ``/workspace/<repo>/``: paths are made relative to it."""
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
        summary=text,
    )
    run.add(EntryKind.TOOL_CALL_RESULT, at, f"e{eid}", [part], tool_call_id=call_id)
    if (
        edits
        and event.get("observation") == "edit"
        and isinstance(extras.get("path"), str)
        and not failed
    ):
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
                path=_relative(extras["path"]) if sandbox else extras["path"],
                status=FileChangeStatus.ADDED if created else FileChangeStatus.MODIFIED,
                lines_added=added,
                lines_deleted=deleted,
                classification=classify(extras["path"]),
            )
            run.add(EntryKind.DIFF_SNAPSHOT, at, f"e{eid}-diff", [DiffPart(files=(diff,))])


def _relative(path: str) -> str:
    """A sandbox path relative to its repository: ``/workspace/<repo>/a/b.py`` is ``a/b.py``."""
    parts = path.split("/")
    if path.startswith("/workspace/") and len(parts) > 3:
        return "/".join(parts[3:])
    return path
