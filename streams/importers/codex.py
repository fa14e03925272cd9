"""Codex rollout logs (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``) as ledger runs.

One rollout is one run (``codex-<session id>``). Timestamps are UTC (``Z``) as written.

**The double count**: ``token_count`` events carry the session's *cumulative*
``total_token_usage`` and the latest call's ``last_token_usage``, and some clients (Codex Desktop)
write an event again with the same total. A model call is a ``token_count`` whose total moved;
its usage is the difference of the totals (which equals ``last_token_usage`` whenever the client
is consistent). A repeated total adds nothing, and ``info: null`` events are skipped. Latency is
not in the log (marked unknown, schema v3).

Mapping: ``session_meta`` starts the run; ``event_msg/user_message`` is a ``USER_TASK``;
``response_item/message`` of the assistant an ``ASSISTANT_RESPONSE`` (``event_msg/agent_message``
repeats it and is skipped); ``function_call``/``custom_tool_call``/``web_search_call`` and their
outputs are tool calls and results, exit codes from ``exec_command_end`` or the output's
metadata; ``patch_apply_end`` (or, without it, the ``apply_patch`` input) is a ``DIFF_SNAPSHOT``
counted per file as ``git apply --numstat`` counts; ``compacted`` is a ``COMPACTION``. The run
is left open: a rollout records turns ending, not the session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from projectors.cost_metrics import CALLS_KEY, CALLS_UNKNOWN
from schemas import models as m
from streams.importers.base import (
    ImportedRun,
    ImportFormatError,
    Summary,
    Usage,
    classify,
    count,
    discover_files,
    obj,
    parse_time,
    patch_numstat,
    skipping,
)
from streams.importers.claude_code import read_lines

FORMAT = "codex"
_FIELDS = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens")


def discover(paths: Iterable[Path]) -> list[Path]:
    return discover_files(paths, ".jsonl")


def import_file(
    path: Path, fleet_id: str, settled: bool = False
) -> tuple[list[ImportedRun], Summary]:
    summary = Summary(str(path))
    lines = read_lines(path, summary)
    meta = next((d.get("payload") for d in lines if d.get("type") == "session_meta"), None)
    if not isinstance(meta, dict) or not isinstance(meta.get("id"), str):
        raise ImportFormatError(f"{path}: no session_meta line with an id; not a Codex rollout")
    run = ImportedRun(f"codex-{meta['id']}", fleet_id, meta["id"], FORMAT)
    exits = _exit_codes(lines)
    outputs = {"message", "function_call", "custom_tool_call", "reasoning"}
    spoke = any(obj(d.get("payload")).get("type") in outputs for d in lines)
    # the model spoke but the rollout keeps no token counts (Desktop 0.128: no token_count, no
    # turn_context): how many calls there were is unknown, and the ledger says so
    unmetered = spoke and not any(_has_usage(obj(d.get("payload"))) for d in lines)
    model = "unknown"
    total: dict[str, int | None] | None = None
    calls: dict[str, str] = {}  # call id -> tool name
    patched: set[str] = {
        str(d["payload"].get("call_id"))
        for d in lines
        if isinstance(d.get("payload"), dict) and d["payload"].get("type") == "patch_apply_end"
    }
    for n, doc in enumerate(lines):
        with skipping(summary, "line"):
            at = parse_time(doc.get("timestamp"))
            found = doc.get("payload")
            payload: dict[str, Any] = found if isinstance(found, dict) else {}
            kind = (
                f"{doc.get('type')}/{payload.get('type')}"
                if payload.get("type")
                else doc.get("type")
            )
            if at is None:
                summary.skipped[f"{kind} (no timestamp)"] += 1
                continue
            if not run.entries:
                found_git = meta.get("git")
                git: dict[str, Any] = found_git if isinstance(found_git, dict) else {}
                started = {
                    "codex.cli_version": str(meta.get("cli_version") or "?"),
                    "codex.originator": str(meta.get("originator") or "?"),
                }
                if git.get("commit_hash"):
                    started["base_sha"] = str(git["commit_hash"])
                if git.get("branch"):
                    started["git_branch"] = str(git["branch"])
                if unmetered:
                    started[CALLS_KEY] = CALLS_UNKNOWN
                run.add(
                    m.EntryKind.RUN_STARTED,
                    at,
                    "start",
                    [m.TextPart(text="run imported")],
                    metadata=started,
                )
            sid = f"l{n}"  # a line's position: rollouts are append-only
            if doc.get("type") == "turn_context":
                model = str(payload.get("model") or model)
                continue
            if doc.get("type") == "session_meta":
                continue
            ptype = payload.get("type")
            if ptype == "token_count":
                total = _token_count(run, payload, total, model, at, sid, summary)
            elif ptype == "user_message" and str(payload.get("message") or "").strip():
                run.add(m.EntryKind.USER_TASK, at, sid, [m.TextPart(text=payload["message"])])
            elif ptype == "message" and payload.get("role") == "assistant":
                text = "\n".join(
                    str(c.get("text") or "")
                    for c in payload.get("content") or []
                    if isinstance(c, dict)
                )
                if text.strip():
                    run.add(m.EntryKind.ASSISTANT_RESPONSE, at, sid, [m.TextPart(text=text)])
            elif ptype in ("function_call", "custom_tool_call") and isinstance(
                payload.get("call_id"), str
            ):
                name = str(payload.get("name") or "tool")
                calls[payload["call_id"]] = name
                arguments = payload.get("arguments", payload.get("input"))
                _request(run, payload["call_id"], name, arguments, at)
                if name == "apply_patch" and payload["call_id"] not in patched:
                    diff = _diff_from_patch_input(str(payload.get("input") or ""))
                    if diff is not None:
                        run.add(
                            m.EntryKind.DIFF_SNAPSHOT,
                            at,
                            f"{sid}-diff",
                            [diff],
                            tool_call_id=payload["call_id"],
                        )
            elif ptype in ("function_call_output", "custom_tool_call_output") and isinstance(
                payload.get("call_id"), str
            ):
                _result(run, payload, exits.get(payload["call_id"]), at, sid)
            elif ptype == "web_search_call":
                call_id = f"web-{n}"
                query = (payload.get("action") or {}).get("query")
                _request(run, call_id, "web_search", query, at)
                status = (
                    m.ToolResultStatus.SUCCEEDED
                    if payload.get("status") == "completed"
                    else m.ToolResultStatus.FAILED
                )
                part = m.ToolResultPart(
                    tool_call_id=call_id, status=status, timed_out=False, summary=str(query or "")
                )
                run.add(
                    m.EntryKind.TOOL_CALL_RESULT, at, f"{sid}-result", [part], tool_call_id=call_id
                )
            elif ptype == "patch_apply_end":
                diff = _diff_from_changes(payload.get("changes"))
                if diff is not None:
                    run.add(
                        m.EntryKind.DIFF_SNAPSHOT,
                        at,
                        sid,
                        [diff],
                        tool_call_id=str(payload.get("call_id")),
                    )
            elif doc.get("type") == "compacted":
                text = str(payload.get("message") or "conversation compacted")
                run.add(
                    m.EntryKind.COMPACTION,
                    at,
                    sid,
                    [m.TextPart(text=text or "conversation compacted")],
                    metadata={"replaces_through_seq": str(len(run.entries))},
                )
            elif ptype == "agent_message":
                summary.skipped["agent_message (repeats the assistant message)"] += 1
            else:
                summary.skipped[str(kind)] += 1
    if unmetered:
        summary.calls_known = False
        summary.notes.append(
            "the rollout keeps no token counts: its model calls, tokens and cost are unknown"
        )
    summary.runs = 1 if run.entries else 0
    summary.entries = len(run.entries)
    summary.notes.append("a Codex rollout records no session end: the run is left open (RUNNING)")
    return ([run] if run.entries else []), summary


def _exit_codes(lines: list[dict[str, Any]]) -> dict[str, int]:
    found: dict[str, int] = {}
    for doc in lines:
        p = doc.get("payload")
        if (
            isinstance(p, dict)
            and p.get("type") == "exec_command_end"
            and type(p.get("exit_code")) is int
        ):
            found[str(p.get("call_id"))] = p["exit_code"]
    return found


def _token_count(
    run: ImportedRun,
    payload: dict[str, Any],
    before: dict[str, int | None] | None,
    model: str,
    at: Any,
    sid: str,
    summary: Summary,
) -> dict[str, int | None] | None:
    info = payload.get("info")
    if not isinstance(info, dict) or not isinstance(info.get("total_token_usage"), dict):
        summary.skipped["token_count without usage (info null)"] += 1
        return before
    # a count the total does not hold (missing, renamed, not a count) is unknown, never 0
    total = {k: count(info["total_token_usage"].get(k)) for k in _FIELDS}
    known = any(v is not None for v in total.values())  # (totals all unknown: no repeat)
    if before is not None and total == before and known:
        summary.duplicate_reports += 1  # the same total again: no new call
        return before
    delta = {k: _delta(total[k], (before or {}).get(k, 0)) for k in _FIELDS}
    raw = info.get("last_token_usage") if isinstance(info.get("last_token_usage"), dict) else delta
    part = Usage(
        input_tokens=delta["input_tokens"],
        cached_input_tokens=delta["cached_input_tokens"],
        cache_write_input_tokens=None,
        output_tokens=delta["output_tokens"],
        reasoning_tokens=delta["reasoning_output_tokens"],
        cost_usd=None,
    ).part(
        provider="openai",
        model=model,
        purpose="agent",
        status=m.ModelCallStatus.OK,
        raw_usage_json=json.dumps(raw),
    )
    run.add(m.EntryKind.MODEL_CALL, at, sid, [part])
    summary.calls += 1
    summary.input_tokens += part.input_tokens
    summary.output_tokens += part.output_tokens
    return total


def _has_usage(payload: dict[str, Any]) -> bool:
    """A token_count event that holds a running total (``info: null`` holds none)."""
    info = payload.get("info") if payload.get("type") == "token_count" else None
    return isinstance(info, dict) and isinstance(info.get("total_token_usage"), dict)


def _delta(total: int | None, before: int | None) -> int | None:
    """What one call added to a running total (None: unknown, either side)."""
    return None if total is None or before is None else total - before


def _request(run: ImportedRun, call_id: str, name: str, arguments: Any, at: Any) -> None:
    run.request(at, f"call-{call_id}", call_id, name, arguments)


_EXITED = re.compile(r"^Process exited with code (\d{1,3})$", re.MULTILINE)


def _result(
    run: ImportedRun, payload: dict[str, Any], exit_code: int | None, at: Any, sid: str
) -> None:
    output = payload.get("output")
    text = output if isinstance(output, str) else json.dumps(output)
    if exit_code is None and isinstance(output, str) and output.startswith("{"):
        try:
            meta = json.loads(output).get("metadata") or {}
            exit_code = meta.get("exit_code") if type(meta.get("exit_code")) is int else None
            text = str(json.loads(output).get("output") or text)
        except (ValueError, AttributeError, RecursionError):  # (not JSON, or nested too deep)
            pass
    if exit_code is None and isinstance(text, str):  # Desktop 0.128: only in the output text
        said = _EXITED.search(text[:2000])
        exit_code = int(said.group(1)) if said else None
    status = (  # a call with no exit code anywhere (an MCP tool) has no recorded outcome
        m.ToolResultStatus.UNKNOWN
        if exit_code is None
        else m.ToolResultStatus.SUCCEEDED
        if exit_code == 0
        else m.ToolResultStatus.FAILED
    )
    part = m.ToolResultPart(
        tool_call_id=payload["call_id"],
        status=status,
        exit_code=exit_code,
        timed_out=False,
        summary=text,
    )
    run.add(m.EntryKind.TOOL_CALL_RESULT, at, sid, [part], tool_call_id=payload["call_id"])


_STATUS = {
    "add": m.FileChangeStatus.ADDED,
    "delete": m.FileChangeStatus.DELETED,
    "update": m.FileChangeStatus.MODIFIED,
}


def _diff_from_changes(changes: Any) -> m.DiffPart | None:
    """patch_apply_end's ``changes``: per file its type and unified diff (or content)."""
    if not isinstance(changes, dict) or not changes:
        return None
    files = []
    for path, change in sorted(changes.items()):
        if not isinstance(change, dict):
            continue
        kind = str(change.get("type") or "update")
        if isinstance(change.get("unified_diff"), str):
            counted = patch_numstat("--- a/x\n+++ b/x\n" + change["unified_diff"]).get("x", (0, 0))
        elif isinstance(change.get("content"), str):
            lines = len(change["content"].splitlines())
            counted = (lines, 0) if kind == "add" else (0, lines)
        else:
            counted = (0, 0)
        target = change.get("move_path") or path
        files.append(
            m.DiffFile(
                path=str(target),
                status=m.FileChangeStatus.RENAMED
                if change.get("move_path")
                else _STATUS.get(kind, m.FileChangeStatus.MODIFIED),
                lines_added=counted[0],
                lines_deleted=counted[1],
                classification=classify(str(target)),
                old_path=str(path) if change.get("move_path") else None,
            )
        )
    return m.DiffPart(files=tuple(files)) if files else None


def _diff_from_patch_input(text: str) -> m.DiffPart | None:
    """Codex's own patch format (``*** Begin Patch`` / ``*** Update File: p`` / ``+``/``-``
    lines), as the Desktop client writes it without a patch_apply_end."""
    files: dict[str, list[Any]] = {}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        for marker, status in (
            ("*** Add File: ", m.FileChangeStatus.ADDED),
            ("*** Update File: ", m.FileChangeStatus.MODIFIED),
            ("*** Delete File: ", m.FileChangeStatus.DELETED),
        ):
            if line.startswith(marker):
                current = line[len(marker) :].strip()
                files[current] = [status, 0, 0, None]
                break
        else:
            if current is None:
                continue
            if line.startswith("*** Move to: "):
                files[current][3] = line[len("*** Move to: ") :].strip()
            elif line.startswith("*** "):
                current = None if line.startswith("*** End") else current
            elif line.startswith("+"):
                files[current][1] += 1
            elif line.startswith("-"):
                files[current][2] += 1
    out = []
    for path, (status, added, deleted, moved) in files.items():
        out.append(
            m.DiffFile(
                path=moved or path,
                status=m.FileChangeStatus.RENAMED if moved else status,
                lines_added=added,
                lines_deleted=deleted,
                classification=classify(moved or path),
                old_path=path if moved else None,
            )
        )
    return m.DiffPart(files=tuple(out)) if out else None
