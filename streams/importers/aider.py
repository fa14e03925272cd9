"""aider chat histories (``.aider.chat.history.md``) as ledger runs.

Each ``# aider chat started at ...`` session is a run (``aider-<file>-<n>``). The history is
Markdown for people: ``#### `` lines are the user's, ``> `` lines aider's own output, the rest
the model's answers. What it records of usage is one line per request::

    > Tokens: 12,566 sent, 84 received. Cost: $0.0019 request, $0.0019 session.

**The double count**: the ``session`` cost is a running total; each request's cost is the
``request`` one (summing session costs counts early requests many times). Counts may be rounded
by aider (``1.2k``): those calls say so in ``metadata["aider.rounded"]``. Cached and reasoning
tokens and latency are not recorded (unknown). The session's start time is the only time in the
file and has no zone: read as UTC, and every entry of the session gets it. Text before the first
session header has no time at all and is skipped (counted in the summary).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from schemas.models import EntryKind, ModelCallStatus, TextPart
from streams.importers.base import ImportedRun, Summary, Usage, discover_files

FORMAT = "aider"
_SESSION = re.compile(r"^# aider chat started at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
_MODEL = re.compile(r"^> (?:Main )?[Mm]odels?: (\S+)")
_TOKENS = re.compile(
    r"^> Tokens: ([\d.,]+k?) sent, ([\d.,]+k?) received\."
    r"(?: Cost: \$([\d.]+) (?:request|message), \$([\d.]+) session\.)?"
)


def discover(paths: Iterable[Path]) -> list[Path]:
    return discover_files(paths, ".md")


def _count(text: str) -> tuple[int, bool]:
    """aider's count text: ``12,566`` exactly, or ``1.2k`` rounded."""
    if text.endswith("k"):
        return round(float(text[:-1].replace(",", "")) * 1000), True
    return int(text.replace(",", "")), False


def import_file(
    path: Path, fleet_id: str, settled: bool = False
) -> tuple[list[ImportedRun], Summary]:
    summary = Summary(str(path))
    summary.notes.append("aider's session start has no zone: read as UTC, for every entry")
    runs: list[ImportedRun] = []
    run: ImportedRun | None = None
    at = datetime(1970, 1, 1, tzinfo=UTC)
    model = "unknown"
    user: list[str] = []
    answer: list[str] = []

    def flush() -> None:
        if run is None:
            return
        if user and "".join(user).strip():
            run.add(
                EntryKind.USER_TASK, at, f"u{len(run.entries)}", [TextPart(text="\n".join(user))]
            )
        if answer and "".join(answer).strip():
            text = "\n".join(answer).strip()
            run.add(EntryKind.ASSISTANT_RESPONSE, at, f"a{len(run.entries)}", [TextPart(text=text)])
        user.clear()
        answer.clear()

    for n, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
        line = raw.rstrip()
        started = _SESSION.match(line)
        if started:
            flush()
            at = datetime.fromisoformat(started.group(1)).replace(tzinfo=UTC)
            run = ImportedRun(f"aider-{path.stem}-{len(runs) + 1}", fleet_id, path.stem, FORMAT)
            runs.append(run)
            run.add(EntryKind.RUN_STARTED, at, "start", [TextPart(text="aider chat started")])
            model = "unknown"
            continue
        if run is None:
            summary.skipped["lines before the first session header (no time)"] += 1
            continue
        found_model = _MODEL.match(line)
        if found_model:
            model = found_model.group(1)
            continue
        tokens = _TOKENS.match(line)
        if tokens:
            flush()
            sent, rounded_in = _count(tokens.group(1))
            received, rounded_out = _count(tokens.group(2))
            cost = float(tokens.group(3)) if tokens.group(3) else None
            provider, name = model.split("/", 1) if "/" in model else (_provider(model), model)
            part = Usage(
                input_tokens=sent,
                cached_input_tokens=None,  # aider's line does not say
                cache_write_input_tokens=None,
                output_tokens=received,
                reasoning_tokens=None,
                cost_usd=cost,
            ).part(
                provider=provider,
                model=name,
                purpose="chat",
                status=ModelCallStatus.OK,
                raw_usage_json="null",
            )
            meta = {"aider.rounded": "true"} if rounded_in or rounded_out else {}
            run.add(EntryKind.MODEL_CALL, at, f"line-{n}", [part], metadata=meta)
            summary.calls += 1
            summary.input_tokens += sent
            summary.output_tokens += received
        elif line.startswith("#### "):
            if answer:
                flush()
            user.append(line[5:])
        elif line.startswith(">"):
            continue  # aider's own output (lint runs, commits, edits applied)
        else:
            answer.append(line)
    flush()
    empty = [r for r in runs if len(r.entries) == 1]
    if empty:
        summary.skipped["sessions with nothing after their header"] = len(empty)
    runs = [r for r in runs if len(r.entries) > 1]
    summary.runs, summary.entries = len(runs), sum(len(r.entries) for r in runs)
    return runs, summary


def _provider(model: str) -> str:
    name = model.lower()
    if name.startswith("claude"):
        return "anthropic"
    if name.startswith(("gpt", "o1", "o3", "o4")):
        return "openai"
    if name.startswith("gemini"):
        return "google"
    if name.startswith("deepseek"):
        return "deepseek"
    return "unknown"
