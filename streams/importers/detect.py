"""``agentledger import auto PATH...``: each file's format recognised by its content, so a folder
of mixed logs (Claude Code sessions, Codex rollouts, OpenHands outputs, SWE-agent and
mini-swe-agent trajectories, aider histories, OTLP exports) imports in one command.

Recognition reads what each format must hold (a Codex rollout's ``session_meta`` line, a Claude
Code line's ``sessionId``, a trajectory's ``messages``/``trajectory``, ...), never the file name
alone; a file named on the command line that is no known format is skipped with that reason;
files found while searching folders that are no log (a README, a config) are left out and
counted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from streams.importers import aider, claude_code, codex, openhands
from streams.importers.base import ImportedRun, ImportFormatError, Summary
from streams.importers.otel import OtelFiles, spans_from_otlp_json
from streams.importers.swe_agent import MiniSweAgent, SweAgent

FORMAT = "auto"
_HEAD = 256 * 1024  # bytes read to tell a JSON-lines file
_WHOLE = 64 * 1024 * 1024  # a JSON document this big or smaller is parsed whole to tell
_CODEX_TYPES = {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}
_CLAUDE_TYPES = {"user", "assistant", "summary", "system", "file-history-snapshot"}
_AIDER = re.compile(rb"(?m)^# aider chat started at ")


def detect(path: Path) -> str | None:
    """The format of the log at ``path`` (a file, or an OpenHands session or completion-log
    folder), or None when it is none this version imports."""
    if path.is_dir():
        if openhands._is_session(path) or any(
            openhands._is_completion_log(p) for p in sorted(path.glob("*.json"))[:3]
        ):
            return openhands.FORMAT
        return None
    try:
        with path.open("rb") as f:
            head = f.read(_HEAD)
    except OSError:
        return None
    if path.suffix == ".md" or head.lstrip().startswith(b"#"):
        return aider.FORMAT if _AIDER.search(head) else None
    first = _first_line(head)
    if isinstance(first, dict) and not _is_whole_object(head):
        return _of_line(first)
    if path.stat().st_size > _WHOLE:
        return None
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, RecursionError, OSError):
        return _of_line(first) if isinstance(first, dict) else None
    return _of_document(doc, path)


def _first_line(head: bytes) -> Any:
    for raw in head.split(b"\n", 50)[:50]:
        if raw.strip():
            try:
                return json.loads(raw)
            except (ValueError, RecursionError):
                return None
    return None


def _is_whole_object(head: bytes) -> bool:
    """Whether the head is one JSON document on one line (not JSON lines)."""
    return head.strip().count(b"\n") == 0


def _of_line(line: dict[str, Any]) -> str | None:
    kind = line.get("type")
    if kind in _CODEX_TYPES and "payload" in line:
        return codex.FORMAT
    if "sessionId" in line or (
        kind in _CLAUDE_TYPES and any(k in line for k in ("uuid", "leafUuid", "messageId"))
    ):
        return claude_code.FORMAT
    if isinstance(line.get("history"), list):
        return openhands.FORMAT  # an evaluation output, one instance a line
    if isinstance(line.get("messages"), list) and isinstance(line.get("info"), dict):
        return MiniSweAgent.FORMAT
    return None


def _of_document(doc: Any, path: Path) -> str | None:
    if isinstance(doc, dict):
        if isinstance(doc.get("trajectory"), list):
            return SweAgent.FORMAT
        if isinstance(doc.get("messages"), list) and (
            isinstance(doc.get("info"), dict) or "trajectory_format" in doc
        ):
            return MiniSweAgent.FORMAT
        if spans_from_otlp_json(doc):
            return OtelFiles.FORMAT
        if isinstance(doc.get("history"), list) or isinstance(doc.get("events"), list):
            return openhands.FORMAT
        return _of_line(doc)
    if isinstance(doc, list) and doc:
        items = [e for e in doc[:20] if isinstance(e, dict | list)]
        flat = [x for e in items for x in (e if isinstance(e, list) else [e])]
        if any(isinstance(e, dict) and ("action" in e or "observation" in e) for e in flat):
            return openhands.FORMAT
        if spans_from_otlp_json(doc[:20]):
            return OtelFiles.FORMAT
        if any(isinstance(e, dict) and "kind" in e and "source" in e for e in flat):
            return openhands.FORMAT
    return None


def _broken(path: Path) -> bool:
    """A file named as a JSON log (``.json``, ``.jsonl``, ``.traj``) that parses as neither."""
    if path.suffix not in (".json", ".jsonl", ".traj") or not path.is_file():
        return False
    try:
        data = path.read_bytes()
    except OSError:
        return True
    try:
        json.loads(data)
        return False
    except (ValueError, RecursionError):
        pass
    lines = [line for line in data.split(b"\n") if line.strip()]
    try:
        for line in lines:
            json.loads(line)
    except (ValueError, RecursionError):
        return True
    return not lines


class AutoImporter:
    """An importer for a mix of formats: each file imported by the format its content is."""

    FORMAT = FORMAT

    def __init__(self) -> None:
        self.ignored: list[Path] = []  # files under the folders that are no known log
        self._formats: dict[Path, str] = {}  # what discover recognised (a format stays put)

    def _detect(self, path: Path) -> str | None:
        name = self._formats.get(path) or detect(path)
        if name is not None:
            self._formats[path] = name
        return name

    def discover(self, paths: Iterable[Path]) -> list[Path]:
        roots = list(paths)
        named = [p for p in roots if not p.is_dir() or self._detect(p) is not None]
        found = [*named]
        for root in (p for p in roots if p.is_dir() and p not in named):
            folders = [f for f in openhands.discover([root]) if f.is_dir()]
            for candidate in sorted(p for p in root.rglob("*") if p.is_file()):
                if any(candidate.is_relative_to(f) for f in folders):
                    continue
                if self._detect(candidate) is not None or _broken(candidate):
                    found.append(candidate)  # (a broken log is skipped with its reason)
                else:
                    self.ignored.append(candidate)
            found += folders
        # parents before children (a Claude Code session before its subagents' files)
        unique = list(dict.fromkeys(found))
        return sorted(unique, key=lambda p: (len(p.parts), str(p)))

    def import_file(
        self, path: Path, fleet_id: str, settled: bool = False
    ) -> tuple[list[ImportedRun], Summary]:
        from streams.importers import FORMATS

        name = self._detect(path)
        if name is None and not path.read_bytes().strip():
            raise ImportFormatError(f"{path}: empty file (nothing to import)")
        if name is None and _broken(path):
            raise ImportFormatError(f"{path}: neither JSON nor JSON lines (cut short or corrupt)")
        if name is None:
            raise ImportFormatError(
                f"{path}: not a log of any format this version imports "
                f"({', '.join(sorted(FORMATS))})"
            )
        runs, summary = FORMATS[name].import_file(path, fleet_id, settled)
        summary.notes.insert(0, f"recognised as {name}")
        return runs, summary
