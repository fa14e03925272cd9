"""Claude Code session logs (``~/.claude/projects/<project>/<session>.jsonl``) as ledger runs.

One session file is one run (``cc-<sessionId>``); a subagent's sidechain file
(``<session>/subagents/agent-<id>.jsonl``) is a run of its own, linked by
``metadata["parent_run_id"]``; the auto-compaction call written as a sidechain file
(``agent-acompact-*``) is one too, since its usage is billed and is in no other file.

**The double count**: Claude Code writes one API response as several lines (one per content
block: thinking, text, tool_use), each repeating ``message.id`` and ``usage``, with
``output_tokens`` growing as the response streams. A call is counted once per ``message.id``, with
the usage of its last line (the largest ``output_tokens``), placed where its first line is.

Mapping: a user line with text is a ``USER_TASK`` (the first is the task); assistant content
blocks are ``ASSISTANT_RESPONSE`` (text), ``AGENT_THOUGHT_SUMMARY`` (thinking) and
``TOOL_CALL_REQUEST`` (tool_use); a user line's ``tool_result`` block is a ``TOOL_CALL_RESULT``
(``is_error`` → FAILED); an Edit/Write result with a ``structuredPatch`` is also a
``DIFF_SNAPSHOT`` of that file (lines counted from the patch hunks); a ``compact_boundary``
system line is a ``COMPACTION``. Usage: provider ``anthropic``; input = input + cache writes +
cache reads, cached = cache reads, cache writes apart; reasoning and latency are not in the log,
so they are marked unknown (schema v3), never 0. Sessions record no end: the run stays open
(``RUNNING``) unless the caller knows better. Timestamps are UTC (``Z``) as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from projectors.working_memory import INTERRUPTION_KEY
from schemas.models import (
    DiffFile,
    DiffPart,
    EntryKind,
    FileChangeStatus,
    ModelCallStatus,
    TextPart,
    ToolResultPart,
    ToolResultStatus,
)
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
    skipping,
)

FORMAT = "claude-code"


def discover(paths: Iterable[Path]) -> list[Path]:
    """Session and subagent files under the given files or folders, parents before children."""
    return sorted(discover_files(paths, ".jsonl"), key=lambda p: (len(p.parts), str(p)))


def read_lines(path: Path, summary: Summary) -> list[dict[str, Any]]:
    """The file's JSON lines; a partly written last line is left for later, not rejected."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    out = []
    mended = 0
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except RecursionError:
            summary.skipped["JSON nested too deeply"] += 1
            continue
        except UnicodeDecodeError:  # a few bytes that are not UTF-8: the line, not the file's end
            try:
                doc = json.loads(raw.decode("utf-8", "replace"))
            except (ValueError, RecursionError):
                summary.skipped["not JSON"] += 1
                continue
            mended += 1
        except ValueError:
            last = i == len(lines) - 1  # no newline after it yet: still being written
            summary.skipped["partial last line (waiting)" if last else "not JSON"] += 1
            continue
        if isinstance(doc, dict):
            out.append(doc)
        else:
            summary.skipped["not a JSON object"] += 1
    if mended:
        summary.notes.append(f"{mended} lines held bytes that are not UTF-8: read as U+FFFD")
    return out


def import_file(
    path: Path, fleet_id: str, settled: bool = False
) -> tuple[list[ImportedRun], Summary]:
    """One session or subagent file as one run. ``settled`` (for a file still being written):
    leave out a response whose lines may still be coming (the last lines, if they are one
    assistant message), so its usage is taken whole, once."""
    summary = Summary(str(path))
    lines = read_lines(path, summary)
    if settled:
        lines = _settled(lines, summary)
    session = next((d["sessionId"] for d in lines if isinstance(d.get("sessionId"), str)), None)
    if session is None:
        raise ImportFormatError(f"{path}: no line has a sessionId; not a Claude Code session log")
    agent = _agent_id(path)
    run_id = f"cc-{session}" + (f"-agent-{agent}" if agent else "")
    run = ImportedRun(run_id, fleet_id, session, FORMAT)
    last_usage = _last_usage_by_id(lines)
    counted: set[str] = set()
    tool_names: dict[str, str] = {}
    started = False
    last_at = None
    untimed = 0
    for doc in lines:
        with skipping(summary, "line"):
            at = parse_time(doc.get("timestamp"))
            kind = doc.get("type")
            if at is None and kind in ("assistant", "user") and last_at is not None:
                # a message line that lost its time keeps the time of the line before: its
                # calls and tool results are not dropped (counted in the notes)
                at = last_at
                untimed += 1
            if at is None:  # summary (a session title), file-history-snapshot: no event
                summary.skipped[f"{kind or 'untyped'} (no timestamp)"] += 1
                continue
            last_at = at
            if not started:
                meta = {"claude_code.version": str(doc.get("version") or "?")}
                if doc.get("gitBranch"):
                    meta["git_branch"] = str(doc["gitBranch"])
                if agent:
                    meta["parent_run_id"] = f"cc-{session}"
                    meta["subagent_id"] = agent
                run.add(
                    EntryKind.RUN_STARTED,
                    at,
                    "start",
                    [TextPart(text="run imported")],
                    metadata=meta,
                )
                started = True
            if kind == "assistant":
                _assistant(run, doc, at, last_usage, counted, tool_names, summary)
            elif kind == "user":
                _user(run, doc, at, tool_names, summary)
            elif kind == "system" and doc.get("subtype") == "compact_boundary":
                _compaction(run, doc, at)
            else:
                summary.skipped[
                    f"{kind}{'/' + str(doc['subtype']) if doc.get('subtype') else ''}"
                ] += 1
    if not run.entries:
        return [], summary
    summary.runs = 1
    summary.entries = len(run.entries)
    summary.notes.append("Claude Code records no run end: the run is left open (RUNNING)")
    if untimed:
        summary.notes.append(
            f"{untimed} message lines had no timestamp: each was given the time of the line before"
        )
    return [run], summary


def still_streaming(path: Path) -> bool:
    """Whether the file's last line is an assistant message line with no stop reason yet: its
    response may have more lines to come (each with a larger usage). Reads the file's end
    only. A message that ends without a stop reason (Claude Code writes some so) is taken once
    the follower's bound on waiting passes."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 256 * 1024))
            tail = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
        doc = json.loads(tail)
    except (OSError, ValueError, RecursionError):  # (JSON nested past Python's limit)
        return False
    message = doc.get("message") if isinstance(doc, dict) else None
    return (
        doc.get("type") == "assistant"
        and isinstance(message, dict)
        and message.get("stop_reason") is None
    )


def _settled(lines: list[dict[str, Any]], summary: Summary) -> list[dict[str, Any]]:
    last = len(lines)
    tail = _message_id(lines[-1]) if lines else None
    while tail is not None and last and _message_id(lines[last - 1]) == tail:
        last -= 1
    if last < len(lines):
        summary.skipped["response still being written (waiting)"] += len(lines) - last
    return lines[:last]


def _message_id(doc: dict[str, Any]) -> str | None:
    message = doc.get("message") if doc.get("type") == "assistant" else None
    mid = message.get("id") if isinstance(message, dict) else None
    return mid if isinstance(mid, str) else None


def _agent_id(path: Path) -> str | None:
    name = path.stem
    return name.removeprefix("agent-") if name.startswith("agent-") else None


def _last_usage_by_id(lines: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], str]]:
    """Per ``message.id``: the usage of its last line (largest output), and its stop reason; an
    id no line gives a usage of: an empty usage (a call whose usage is unknown)."""
    found: dict[str, tuple[dict[str, Any], str]] = {}
    for doc in lines:
        message = doc.get("message") if doc.get("type") == "assistant" else None
        if not isinstance(message, dict):
            continue
        mid = message.get("id")
        if not isinstance(mid, str):
            continue
        if not isinstance(message.get("usage"), dict):  # a response whose usage is not kept:
            if mid not in found:  # a call all the same, its usage unknown (never 0)
                found[mid] = ({}, str(message.get("stop_reason") or ""))
            continue
        usage = message["usage"]
        before = found.get(mid)
        if before is None or _int(usage.get("output_tokens")) >= _int(
            before[0].get("output_tokens")
        ):
            found[mid] = (usage, str(message.get("stop_reason") or (before and before[1]) or ""))
    return found


def _int(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def _assistant(
    run: ImportedRun,
    doc: dict[str, Any],
    at: Any,
    last_usage: dict[str, tuple[dict[str, Any], str]],
    counted: set[str],
    tool_names: dict[str, str],
    summary: Summary,
) -> None:
    message = obj(doc.get("message"))
    mid = message.get("id")
    uid = str(doc.get("uuid") or mid)
    if isinstance(mid, str) and mid in last_usage:
        if mid in counted:
            summary.duplicate_reports += 1
        else:
            counted.add(mid)
            usage, stop = last_usage[mid]
            _model_call(run, message, mid, usage, stop, at, summary)
    for i, block in enumerate(message.get("content") or []):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and str(block.get("text") or "").strip():
            run.add(EntryKind.ASSISTANT_RESPONSE, at, f"{uid}#{i}", [TextPart(text=block["text"])])
        elif kind == "thinking" and str(block.get("thinking") or "").strip():
            text = TextPart(text=block["thinking"])
            run.add(EntryKind.AGENT_THOUGHT_SUMMARY, at, f"{uid}#{i}", [text])
        elif kind == "tool_use" and isinstance(block.get("id"), str):
            name = str(block.get("name") or "tool")
            tool_names[block["id"]] = name
            run.request(at, block["id"], block["id"], name, block.get("input"))
        elif kind in ("text", "thinking", "redacted_thinking"):
            summary.skipped[f"empty {kind} block"] += 1
        else:
            summary.skipped[f"assistant {kind} block"] += 1


def _model_call(
    run: ImportedRun,
    message: dict[str, Any],
    mid: str,
    usage: dict[str, Any],
    stop: str,
    at: Any,
    summary: Summary,
) -> None:
    # a count the usage lacks (or holds as no count) is unknown, never 0; the cache counts are
    # 0 when absent, as the API wrote usage before prompt caching (input and output only)
    uncached, output = count(usage.get("input_tokens")), count(usage.get("output_tokens"))
    written = _int(usage.get("cache_creation_input_tokens"))
    read = _int(usage.get("cache_read_input_tokens"))
    part = Usage(
        input_tokens=None if uncached is None else uncached + written + read,
        cached_input_tokens=read,
        cache_write_input_tokens=written,
        output_tokens=output,
        reasoning_tokens=None,  # Claude Code's logs do not say
        cost_usd=None,
    ).part(
        provider="anthropic",
        model=str(message.get("model") or "unknown"),
        purpose="compaction"
        if run.run_id.endswith("acompact") or "-acompact" in run.run_id
        else "agent",
        provider_response_id=mid,
        finish_reason=stop or None,
        status=ModelCallStatus.OK,
        raw_usage_json=json.dumps(usage),
    )
    run.add(EntryKind.MODEL_CALL, at, f"call-{mid}", [part])
    summary.calls += 1
    summary.input_tokens += part.input_tokens
    summary.output_tokens += part.output_tokens  # (0 when unknown: the report says so)


def _user(
    run: ImportedRun, doc: dict[str, Any], at: Any, tool_names: dict[str, str], summary: Summary
) -> None:
    message = obj(doc.get("message"))
    content = message.get("content")
    uid = str(doc.get("uuid"))
    if isinstance(content, str):
        if content.strip() and not doc.get("isMeta"):
            run.add(EntryKind.USER_TASK, at, uid, [TextPart(text=content)], **_notice(content))
        else:
            summary.skipped["meta or empty user line"] += 1
        return
    for i, block in enumerate(content or []):
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str):
            call_id = block["tool_use_id"]
            failed = bool(block.get("is_error"))
            result = ToolResultPart(
                tool_call_id=call_id,
                status=ToolResultStatus.FAILED if failed else ToolResultStatus.SUCCEEDED,
                exit_code=None,  # not in the log
                timed_out=False,
                summary=_text_of(block.get("content")),
            )
            run.add(EntryKind.TOOL_CALL_RESULT, at, f"{uid}#{i}", [result], tool_call_id=call_id)
            diff = _diff_of(doc.get("toolUseResult"), tool_names.get(call_id, ""))
            if diff is not None and not failed:
                run.add(
                    EntryKind.DIFF_SNAPSHOT, at, f"{uid}#{i}-diff", [diff], tool_call_id=call_id
                )
        elif block.get("type") == "text" and str(block.get("text") or "").strip():
            if doc.get("isMeta"):
                summary.skipped["meta user text"] += 1
            else:
                text = block["text"]
                run.add(
                    EntryKind.USER_TASK, at, f"{uid}#{i}", [TextPart(text=text)], **_notice(text)
                )
        else:
            summary.skipped[f"user {block.get('type')} block"] += 1


_INTERRUPTED = re.compile(r"\[Request interrupted by user[^\]\n]{0,40}\]")


def _notice(text: str) -> dict[str, Any]:
    """A user line that is Claude Code's interruption notice is marked so: it is not a goal."""
    if _INTERRUPTED.fullmatch(text.strip()):
        return {"metadata": {INTERRUPTION_KEY: "true"}}
    return {}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(c.get("text") if isinstance(c, dict) else c) for c in content)
    return "" if content is None else str(content)


def _diff_of(result: Any, tool: str) -> DiffPart | None:
    """A DIFF_SNAPSHOT part for an Edit/Write result with a structured patch."""
    if not isinstance(result, dict) or not isinstance(result.get("filePath"), str):
        return None
    hunks = result.get("structuredPatch")
    created = result.get("type") == "create"
    if not isinstance(hunks, list) and not created:
        return None
    added = deleted = 0
    for line in _patch_lines(hunks or []):
        if line.startswith("+"):
            added += 1
        elif line.startswith("-"):
            deleted += 1
    if created and not hunks:
        added = len(str(result.get("content") or "").splitlines())
    if not (added or deleted or created):
        return None
    status = FileChangeStatus.ADDED if created else FileChangeStatus.MODIFIED
    path = result["filePath"]
    return DiffPart(
        files=(
            DiffFile(
                path=path,
                status=status,
                lines_added=added,
                lines_deleted=deleted,
                classification=classify(path),
            ),
        )
    )


def _patch_lines(hunks: list[Any]) -> Iterator[str]:
    for hunk in hunks:
        if isinstance(hunk, dict):
            for line in hunk.get("lines") or []:
                if isinstance(line, str):
                    yield line


def _compaction(run: ImportedRun, doc: dict[str, Any], at: Any) -> None:
    meta = doc.get("compactMetadata") or {}
    trigger = meta.get("trigger", "?")
    before = meta.get("preTokens")
    text = f"conversation compacted ({trigger}" + (
        f", {before:,} tokens before)" if isinstance(before, int) else ")"
    )
    through = str(len(run.entries))
    run.add(
        EntryKind.COMPACTION,
        at,
        str(doc.get("uuid")),
        [TextPart(text=text)],
        metadata={"replaces_through_seq": through},
    )
