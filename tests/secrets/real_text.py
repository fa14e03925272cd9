"""A false-positive corpus of real text: agent logs from shared/samples and stdlib Python code.

None of it holds a live secret (see shared/samples/README.md), so whatever a detector redacts in
it is a false positive. Items are "entry-sized": one JSONL line, one element of a JSON file's top
list (or one event, span, trajectory step or message), one aider message, or a ~4,000-character
chunk of a stdlib module. The order is fixed.
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tests.packs import SAMPLES as PACK_SAMPLES

__all__ = ["SAMPLES", "real_texts", "sample_texts", "stdlib_texts"]


SAMPLES = Path(os.environ.get("AGENTLEDGER_SAMPLES") or PACK_SAMPLES)
MIN_STRING = 8
CHUNK_CHARS = 4000
_RECORD_KEYS = {"trajectory", "history", "messages", "events", "spans"}
_WRAPPER_KEYS = {"resourceSpans", "scopeSpans"}
_STDLIB_SKIP = {"test", "tests", "idlelib", "lib2to3", "ensurepip", "site-packages", "__pycache__"}


def _strings(obj: object) -> Iterator[str]:
    """Every string value inside ``obj`` (dict keys are not values), depth first."""
    if isinstance(obj, str):
        if len(obj) >= MIN_STRING:
            yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _strings(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _strings(value)


def _entries(obj: object, label: str) -> Iterator[tuple[str, object]]:
    """Split a JSON document into entries.

    A top-level list gives one entry per element. In a dict, each element of a record list
    (trajectory steps, history/messages, events, spans) is an entry, OTLP wrappers
    (``resourceSpans``, ``scopeSpans``) are looked through, and the dict's other values make one
    more entry.
    """
    if isinstance(obj, list):
        for i, element in enumerate(obj):
            yield f"{label}[{i}]", element
        return
    if not isinstance(obj, dict):
        yield label, obj
        return
    rest: dict[str, object] = {}
    for key, value in obj.items():
        if key in _RECORD_KEYS and isinstance(value, list):
            for i, element in enumerate(value):
                yield f"{label}.{key}[{i}]", element
        elif key in _WRAPPER_KEYS and isinstance(value, list):
            for i, element in enumerate(value):
                yield from _entries(element, f"{label}.{key}[{i}]")
        else:
            rest[key] = value
    if rest:
        yield label, rest


def _joined(obj: object) -> str:
    return "\n".join(_strings(obj))


def _jsonl_items(path: Path, rel: str) -> Iterator[tuple[str, str]]:
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            text = _joined(json.loads(line))
            if text:
                yield f"{rel}:{lineno}", text


def _json_items(path: Path, rel: str) -> Iterator[tuple[str, str]]:
    document = json.loads(path.read_text(encoding="utf-8"))
    for label, entry in _entries(document, ""):
        text = _joined(entry)
        if text:
            yield f"{rel}:{label or '$'}", text


def _line_kind(line: str) -> str:
    if line.startswith("#### "):
        return "user"
    if line.startswith("> ") or line.rstrip() == ">":
        return "tool"
    if line.startswith("# aider chat started at"):
        return "session"
    return "assistant"


def _aider_items(path: Path, rel: str) -> Iterator[tuple[str, str]]:
    """Aider chat history: a message is a run of ``#### `` lines, of ``> `` lines, or of others."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start, kind = 0, ""
    for i, line in enumerate([*lines, ""]):
        line_kind = _line_kind(line) if i < len(lines) else "end"
        if line_kind != kind or line_kind == "session":
            text = "\n".join(lines[start:i]).strip()
            if len(text) >= MIN_STRING:
                yield f"{rel}:{start + 1}", text
            start, kind = i, line_kind


def sample_texts() -> list[tuple[str, str]]:
    """(label, text) for every entry of every agent-log sample file, files in path order."""
    out: list[tuple[str, str]] = []
    for path in sorted(SAMPLES.rglob("*")):
        if not path.is_file() or path.name == "README.md":
            continue
        rel = path.relative_to(SAMPLES).as_posix()
        if path.suffix == ".jsonl":
            out.extend(_jsonl_items(path, rel))
        elif path.suffix in {".json", ".traj"}:
            out.extend(_json_items(path, rel))
        elif path.suffix == ".md":
            out.extend(_aider_items(path, rel))
    return out


def _chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """Pieces of about ``size`` characters, cut only at line ends."""
    piece: list[str] = []
    length = 0
    for line in text.splitlines(keepends=True):
        piece.append(line)
        length += len(line)
        if length >= size:
            yield "".join(piece)
            piece, length = [], 0
    if piece:
        yield "".join(piece)


def _stdlib_files() -> list[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIP]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath) / name
                found.append((path.relative_to(root).as_posix(), path))
    found.sort()
    return found


def stdlib_texts(limit_files: int = 400) -> list[tuple[str, str]]:
    """(label, text) chunks of the first ``limit_files`` stdlib modules in path order."""
    out: list[tuple[str, str]] = []
    for rel, path in _stdlib_files()[:limit_files]:
        text = path.read_text(encoding="utf-8", errors="replace")
        for n, chunk in enumerate(_chunks(text)):
            if chunk.strip():
                out.append((f"stdlib/{rel}#{n}", chunk))
    return out


def real_texts() -> list[tuple[str, str]]:
    """The agent-log samples followed by the stdlib chunks."""
    return sample_texts() + stdlib_texts()
