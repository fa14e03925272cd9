"""SWE-agent (``.traj``) and mini-swe-agent (``.traj.json``) trajectories as ledger runs.

One trajectory is one run that ends: ``info.exit_status`` gives the final status (``submitted``
→ ``SUBMITTED``: the patch was handed in, not yet evaluated; a step, cost or call limit →
``STEP_LIMIT`` or ``BUDGET_EXCEEDED``; anything else → ``FAILED``), the submitted patch is a
``DIFF_SNAPSHOT`` counted per file like ``git apply --numstat``, and ``info.model_stats`` is sent as
the run's reported totals (a ``JsonPart`` ``agentledger.run-totals@1``, kept beside the per-call
sums, never added to them).

* **mini-swe-agent**: each assistant message carries its call's ``extra.response`` (id, model,
  OpenAI-style ``usage`` whose ``prompt_tokens`` include the cached ones) and ``extra.cost``: one
  model call per response id, the cost as the provider-reported cost. Times are the messages'
  ``extra.timestamp`` (Unix seconds, so UTC); messages before the first one get its time.
  Versions that keep no ``extra.timestamp`` give each message its response's ``created``; a
  run with no time at all (one that timed out before any response) is imported with the file's
  modification time, marked ``import.time: unknown`` on its first entry and in the summary.
  Usage goes through :func:`~streams.importers.base.openai_usage` (reasoning or cache tokens
  reported apart are added and flagged, ``usage.cost`` read); model ids are not prefixed twice.
* **SWE-agent** (0.x and 1.x ``.traj``): there is no per-call usage (``model_stats`` is the only
  accounting, so no model-call entries are made and the run's tokens and cost are the reported
  totals) and no timestamps: every entry is given the file's modification time, marked
  ``import.time: unknown`` on the run's first entry. 1.x: the model from ``replay_config``
  (a JSON text), each step's tool from its assistant message's ``tool_calls``, message content as
  a list of text blocks; demonstration messages (``is_demo``) are not the run's task.
* **mini-swe-agent 1.x** (``trajectory_format`` ``mini-swe-agent-1``, text actions): the first
  user message is the task; an assistant message's one ```` ```bash ```` block is a ``bash`` tool
  call and the user message after it that call's result (its ``<returncode>``); a user message
  that answers no action (format-error feedback) is skipped and counted.
* The submitted patch is the truth for changed files (:func:`~streams.importers.base.patch_files`:
  new, deleted, renamed, empty and binary files kept).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from projectors.cost_metrics import CALLS_KEY, CALLS_UNKNOWN, RUN_TOTALS_REF
from schemas.models import (
    DiffPart,
    EntryKind,
    JsonPart,
    ModelCallStatus,
    RunStatus,
    TextPart,
    ToolResultPart,
    ToolResultStatus,
)
from streams.importers.base import (
    FileImporter,
    ImportedRun,
    ImportFormatError,
    Summary,
    count,
    exit_error,
    load_json,
    model_id,
    obj,
    openai_usage,
    patch_files,
    safe_id,
    skipping,
)


def _load(path: Path) -> dict[str, Any]:
    doc = load_json(path, "a trajectory")
    if not isinstance(doc, dict):
        raise ImportFormatError(f"{path}: not a JSON object; not a trajectory")
    if not isinstance(doc.get("info"), dict):  # (a trajectory is known by its messages/steps)
        doc["info"] = {}
    return doc


def end_status(exit_status: Any) -> RunStatus:
    """A trajectory's ``exit_status`` as a run status."""
    text = str(exit_status or "").lower()
    if text.startswith("submitted") or text == "submitted":
        return RunStatus.SUBMITTED
    if "cost" in text or "budget" in text:
        return RunStatus.BUDGET_EXCEEDED
    if "timeout" in text or "timed out" in text:  # e.g. mini's "Timeout" (the model's call)
        return RunStatus.TIMED_OUT
    if "limit" in text or "step" in text or "max" in text:
        return RunStatus.STEP_LIMIT
    return RunStatus.FAILED


def _finish(run: ImportedRun, info: dict[str, Any], at: datetime, summary: Summary) -> None:
    submission = info.get("submission")
    if isinstance(submission, str) and submission.strip():
        files = patch_files(submission)
        if files:
            run.add(EntryKind.DIFF_SNAPSHOT, at, "submission", [DiffPart(files=tuple(files))])
    stats = obj(info.get("model_stats"))
    totals: dict[str, Any] = {}
    cost = stats.get("instance_cost")
    if isinstance(cost, int | float):
        totals["cost_usd"] = str(Decimal(repr(float(cost))).quantize(Decimal("1e-12")).normalize())
        summary.reported_cost_usd = totals["cost_usd"]
    for ours, theirs in (
        ("input_tokens", "tokens_sent"),
        ("output_tokens", "tokens_received"),
        ("calls", "api_calls"),
    ):
        if type(stats.get(theirs)) is int:
            totals[ours] = stats[theirs]
    status = end_status(info.get("exit_status"))
    parts: list[Any] = [
        TextPart(text=f"exit status {info.get('exit_status')!s}"),
    ]
    if totals:
        parts.append(JsonPart(json_text=json.dumps(totals), schema_ref=RUN_TOTALS_REF))
    meta = {"exit_status": str(info.get("exit_status"))}
    if not (isinstance(submission, str) and submission.strip()):
        meta["submission"] = "empty"
    run.add(EntryKind.RUN_FINISHED, at, "finish", parts, run_status=status, metadata=meta)


def _listed(path: Path, key: str, what: str) -> tuple[dict[str, Any], list[Any]]:
    """The trajectory's document and its ``key`` list (without one it is no ``what``)."""
    doc = _load(path)
    found = doc.get(key)
    if not isinstance(found, list):
        raise ImportFormatError(f"{path}: no {key!r} list; not a {what}")
    return doc, found


# -- mini-swe-agent -------------------------------------------------------------------------


class MiniSweAgent(FileImporter):
    SUFFIX = ".traj.json"
    FORMAT = "mini-swe-agent"

    @staticmethod
    def import_file(
        path: Path, fleet_id: str, settled: bool = False
    ) -> tuple[list[ImportedRun], Summary]:
        doc, messages = _listed(path, "messages", "mini-swe-agent trajectory")
        summary = Summary(str(path))
        named = doc.get("instance_id")
        instance = safe_id(
            named if isinstance(named, str) and named else path.name.removesuffix(".traj.json")
        )
        run = ImportedRun(f"mini-{instance}", fleet_id, instance, MiniSweAgent.FORMAT)
        times = [_message_time(m) for m in messages]
        first = min((t for t in times if t is not None), default=None)
        time_note: dict[str, str] = {}
        if first is None:  # (e.g. a run that timed out before any response)
            first = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            time_note = {"import.time": "unknown: no record has a time; the file's mtime"}
            summary.notes.append(
                "no message has a time: entries carry the file's modification time, marked "
                "import.time=unknown"
            )
        at = first
        config = obj(doc["info"].get("config"))
        model_name = str(obj(config.get("model")).get("model_name") or "unknown/unknown")
        provider = model_name.split("/", 1)[0] if "/" in model_name else "unknown"
        version = str(doc["info"].get("mini_version") or "?")
        run.add(
            EntryKind.RUN_STARTED,
            at,
            "start",
            [TextPart(text="run imported")],
            metadata={"mini_swe_agent.version": version, **time_note},
        )
        seen: set[str] = set()
        tasked = False
        pending: str | None = None  # 1.x: the tool call id of a text action awaiting its output
        for n, message in enumerate(messages):
            with skipping(summary, "message"):
                if not isinstance(message, dict):
                    summary.skipped["not a message"] += 1
                    continue
                extra = obj(message.get("extra"))
                at = times[n] or at
                role = message.get("role")
                content = message.get("content")
                text: str = content if isinstance(content, str) else ""
                if role == "system":
                    run.add(EntryKind.SYSTEM_INSTRUCTION, at, f"m{n}", [TextPart(text=text or "-")])
                elif role == "user" and pending is not None:  # 1.x: the action's output
                    _text_result(run, pending, text, at, n)
                    pending = None
                elif role == "user" and not tasked:
                    run.add(EntryKind.USER_TASK, at, f"m{n}", [TextPart(text=text or "-")])
                    tasked = True
                elif role == "user":  # e.g. 1.x's "format error" feedback: no action ran
                    summary.skipped["user message after the task that answers no action"] += 1
                elif role == "assistant":
                    _mini_call(run, extra, provider, at, n, seen, summary)
                    if text.strip():
                        run.add(EntryKind.ASSISTANT_RESPONSE, at, f"m{n}", [TextPart(text=text)])
                    if not message.get("tool_calls"):
                        pending = _text_action(run, text, at, n)
                    for call in message.get("tool_calls") or []:
                        if isinstance(call, dict) and isinstance(call.get("id"), str):
                            fn = call.get("function") or {}
                            name = str(fn.get("name") or "tool")
                            run.request(
                                at, f"call-{call['id']}", call["id"], name, fn.get("arguments")
                            )
                elif role == "tool" and isinstance(message.get("tool_call_id"), str):
                    code = extra.get("returncode")
                    exit_code = code if type(code) is int else None
                    failed = exit_code not in (None, 0) or bool(extra.get("exception_info"))
                    part = ToolResultPart(
                        tool_call_id=message["tool_call_id"],
                        status=ToolResultStatus.FAILED if failed else ToolResultStatus.SUCCEEDED,
                        exit_code=exit_code,
                        timed_out=False,
                        summary=text,
                    )
                    run.add(
                        EntryKind.TOOL_CALL_RESULT,
                        at,
                        f"m{n}",
                        [part],
                        tool_call_id=message["tool_call_id"],
                    )
                elif role == "exit" and not _submitted(doc["info"]) and text.strip():
                    run.add(EntryKind.ERROR_EVENT, at, f"m{n}", [exit_error(text)])
                else:
                    summary.skipped[f"{role} message"] += 1
        _finish(run, doc["info"], at, summary)
        summary.runs, summary.entries = 1, len(run.entries)
        return [run], summary


# mini-swe-agent 1.x: the action is the assistant text's one ```bash block; the next user
# message is its output, ``<returncode>N</returncode>`` then ``<output>...</output>``.
_BASH_FENCE = "```bash"
_SPACE = re.compile(r"\s*")  # (one repeat with nothing after it: no backtracking)
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")


def bash_block(text: str) -> str | None:
    """The command of the first ```` ```bash ```` block, in linear time: the group that
    ``re.search(r"```bash\\s*\\n(.*?)\\n```", text, re.DOTALL)`` gives (that regex, used
    before, retried its lazy body from every fence and from every newline after one when no
    closing fence follows: 100,000 characters of unclosed fences took 11 s, a fence then 50,000
    newlines 13 s).

    The first fence whose whitespace holds a newline decides: the body runs from after the
    whitespace's last newline to the first newline-and-fence after it; with none, that last
    newline may itself open the closing fence (the body is then the whitespace after the
    newline before it). A fence that finds no close means no later fence can find one.
    """
    at = text.find(_BASH_FENCE)
    while at >= 0:
        space_at = at + len(_BASH_FENCE)
        space = _SPACE.match(text, space_at)  # (always matches, perhaps nothing)
        space_end = space.end() if space is not None else space_at
        last = text.rfind("\n", space_at, space_end)
        if last >= 0:
            close = text.find("\n```", last + 1)
            if close >= 0:
                return text[last + 1 : close]
            before = text.rfind("\n", space_at, last)
            if before >= 0 and text.startswith("```", last + 1):
                return text[before + 1 : last]
            return None
        at = text.find(_BASH_FENCE, space_end)
    return None


def _text_action(run: ImportedRun, text: str, at: datetime, n: int) -> str | None:
    """A 1.x text action (its bash block) as a tool call; its id, or None when there is none."""
    command = bash_block(text)
    if command is None:
        return None
    call_id = f"m{n}-bash"
    run.request(at, f"call-{call_id}", call_id, "bash", {"command": command})
    return call_id


def _text_result(run: ImportedRun, call_id: str, text: str, at: datetime, n: int) -> None:
    code = _RETURNCODE.search(text)
    exit_code = int(code[1]) if code is not None else None
    timed_out = exit_code is None and "timed out" in text.lower()
    status = ToolResultStatus.SUCCEEDED
    if timed_out:
        status = ToolResultStatus.TIMED_OUT
    elif exit_code not in (None, 0):
        status = ToolResultStatus.FAILED
    part = ToolResultPart(
        tool_call_id=call_id,
        status=status,
        exit_code=exit_code,
        timed_out=timed_out,
        summary=text,
    )
    run.add(EntryKind.TOOL_CALL_RESULT, at, f"m{n}", [part], tool_call_id=call_id)


def _submitted(info: dict[str, Any]) -> bool:
    return end_status(info.get("exit_status")) is RunStatus.SUBMITTED


def _message_time(message: Any) -> datetime | None:
    """A message's time: ``extra.timestamp`` (mini 1.x/2.x), else its response's ``created``
    (the only time some versions keep)."""
    extra = obj(obj(message).get("extra"))
    return _unix(extra.get("timestamp")) or _unix(obj(extra.get("response")).get("created"))


def _unix(value: Any) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return datetime.fromtimestamp(value, UTC)
    return None


def _mini_call(
    run: ImportedRun,
    extra: dict[str, Any],
    provider: str,
    at: datetime,
    n: int,
    seen: set[str],
    summary: Summary,
) -> None:
    response = extra.get("response") if isinstance(extra.get("response"), dict) else None
    if response is None:  # a call that failed leaves no response (api_calls counts it)
        summary.skipped["assistant message without a response"] += 1
        return
    # a response whose usage is missing or renamed: a call all the same, its usage unknown
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    rid = response.get("id") if isinstance(response.get("id"), str) else None
    if rid is not None and rid in seen:
        summary.duplicate_reports += 1
        return
    if rid is not None:
        seen.add(rid)
    normalized = openai_usage(usage, extra.get("cost"))
    choices = response.get("choices") or [{}]
    finish = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
    part = normalized.part(
        provider=provider,
        model=model_id(provider, str(response.get("model") or "unknown")),
        purpose="agent",
        provider_response_id=rid,
        finish_reason=str(finish) if finish else None,
        status=ModelCallStatus.OK,
        raw_usage_json=json.dumps(usage),
    )
    summary.notes += [note for note in normalized.notes if note not in summary.notes]
    run.add(
        EntryKind.MODEL_CALL,
        at,
        f"call-{rid or n}",
        [part],
        metadata={"import.usage": "; ".join(normalized.notes)} if normalized.notes else None,
    )
    summary.calls += 1
    summary.input_tokens += part.input_tokens
    summary.output_tokens += part.output_tokens


# -- SWE-agent ------------------------------------------------------------------------------


class SweAgent(FileImporter):
    SUFFIX = ".traj"
    FORMAT = "swe-agent"

    @staticmethod
    def import_file(
        path: Path, fleet_id: str, settled: bool = False
    ) -> tuple[list[ImportedRun], Summary]:
        doc, steps = _listed(path, "trajectory", "SWE-agent trajectory")
        summary = Summary(str(path))
        summary.notes.append(
            "SWE-agent .traj has no timestamps: every entry is given the file's modification "
            "time (UTC); it has no per-call usage: tokens and cost are the reported run totals"
        )
        at = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        stem = path.name.removesuffix(".traj")
        run = ImportedRun(f"swe-{stem}", fleet_id, stem, SweAgent.FORMAT)
        info = obj(doc.get("info"))
        about = {
            "import.time": "unknown: SWE-agent keeps no times; the file's mtime",
            "swe_agent.version": str(info.get("swe_agent_version") or "0.x"),
        }
        model = _swe_model(doc)
        if model is not None:
            about["swe_agent.model"] = model
        # no per-call usage: how many calls (and their tokens and cost) is unknown, never 0; the
        # agent's own run totals (model_stats) are sent at the end, beside them
        about[CALLS_KEY] = CALLS_UNKNOWN
        summary.calls_known = False
        run.add(EntryKind.RUN_STARTED, at, "start", [TextPart(text="run imported")], metadata=about)
        listed = doc.get("history")
        history = [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
        for n, message in enumerate(history):
            if message.get("role") == "assistant":
                break  # the steps below carry the rest
            if message.get("is_demo"):  # a demonstration shown to the model, not this run's task
                summary.skipped["demonstration message"] += 1
                continue
            text = _text_of(message.get("content"))
            kind = (
                EntryKind.SYSTEM_INSTRUCTION
                if message.get("role") == "system"
                else EntryKind.USER_TASK
            )
            if text.strip():
                run.add(kind, at, f"h{n}", [TextPart(text=text)])
        # 1.x: each step's assistant message names its tool (bash, str_replace_editor, submit)
        tool_names = [_tool_name(m) for m in history if m.get("role") == "assistant"]
        for n, step in enumerate(steps):
            with skipping(summary, "step"):
                if not isinstance(step, dict):
                    summary.skipped["not a step"] += 1
                    continue
                thought = str(step.get("thought") or step.get("response") or "")
                if thought.strip():
                    run.add(EntryKind.ASSISTANT_RESPONSE, at, f"s{n}", [TextPart(text=thought)])
                action = str(step.get("action") or "").strip()
                if not action:
                    continue
                call_id = f"step-{n}"
                named = tool_names[n] if n < len(tool_names) else None
                name = named or action.split()[0]
                run.request(at, f"s{n}-call", call_id, name, action)
                result = ToolResultPart(
                    tool_call_id=call_id,
                    status=ToolResultStatus.UNKNOWN,  # a 0.x step records no outcome
                    exit_code=None,
                    timed_out=False,
                    summary=str(step.get("observation") or ""),
                )
                run.add(
                    EntryKind.TOOL_CALL_RESULT, at, f"s{n}-result", [result], tool_call_id=call_id
                )
        _finish(run, doc["info"], at, summary)
        stats = obj(doc["info"].get("model_stats"))
        sent, received = count(stats.get("tokens_sent")), count(stats.get("tokens_received"))
        # the agent's own run totals, shown only when it reported both (else: unknown, never 0)
        summary.tokens_reported = sent is not None and received is not None
        summary.input_tokens, summary.output_tokens = sent or 0, received or 0
        summary.runs, summary.entries = 1, len(run.entries)
        return [run], summary


def _text_of(content: Any) -> str:
    """A message's text: a string, or (SWE-agent 1.x) a list of ``{"type": "text"}`` blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text") or "")
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


def _tool_name(message: dict[str, Any]) -> str | None:
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls and isinstance(calls[0], dict):
        name = obj(calls[0].get("function")).get("name")
        return name if isinstance(name, str) and name else None
    return None


def _swe_model(doc: dict[str, Any]) -> str | None:
    """The model of a 1.x run: only in ``replay_config`` (a JSON text) at agent.model.name."""
    config = doc.get("replay_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except (ValueError, RecursionError):
            return None
    name = obj(obj(obj(config).get("agent")).get("model")).get("name")
    return name if isinstance(name, str) and name else None
