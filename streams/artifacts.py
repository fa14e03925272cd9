"""The artifact store: content too large for a ledger entry, kept by its sha256.

An entry carries an :class:`~schemas.models.ArtifactRef` (id, sha256, size, content type,
redaction level); the bytes live in a store behind :class:`ArtifactStore` (``put``, ``get``,
``exists``). :class:`FileArtifactStore` is the default, a folder (``AGENTLEDGER_ARTIFACT_DIR``,
else ``<state>/artifacts``) with each artifact at ``<sha[:2]>/<sha>``; an object store (S3, GCS)
is another class with the same three methods.

Content is secret-scanned with the publisher's detector before it is written, so a secret never
reaches a store: each one becomes ``[REDACTED:<rule>]`` and the ref's ``redaction_level`` is
``RESTRICTED`` (never offered to a model by its handle); content with nothing found is ``REVIEW``
(machine-scanned, not reviewed by a person), the level the simulator's refs have. The address is
the sha256 of the bytes as stored, so ``put`` is idempotent and ``get`` can check what it reads.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from infra.settings import Settings
from projectors.stores.artifact_files import (
    SHA256,
    ArtifactCorruptError,
    ArtifactError,
    ArtifactNotFoundError,
    artifact_path,
    checked_sha,
    read_artifact,
)
from schemas.models import (
    ArtifactRef,
    ArtifactRefPart,
    ErrorPart,
    FileSnippetPart,
    JsonPart,
    LedgerEntry,
    Part,
    RedactionLevel,
    TextPart,
    ToolResultPart,
)
from schemas.secret_scan import SecretDetector, default_detector

ID_PREFIX = "sha256:"
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"
# What stays inline of a moved text (its start, then a line naming the artifact), and the
# smallest text worth moving: below it the preview and the ref would save little.
PREVIEW_CHARS = 2000
MIN_MOVE_BYTES = 4096


class ArtifactStore(Protocol):
    """Content-addressed storage: ``put`` scans and stores, ``get`` returns checked bytes."""

    def put(self, data: bytes, content_type: str) -> ArtifactRef: ...

    def get(self, sha256: str) -> bytes: ...

    def exists(self, sha256: str) -> bool: ...


def artifact_id(sha256: str) -> str:
    """The id an artifact has in entries: ``sha256:<hex>``, the same for the same content."""
    return f"{ID_PREFIX}{sha256}"


def sha256_of(reference: str) -> str:
    """The hex digest in ``reference`` (a sha256, or an artifact id ``sha256:<hex>``), lower
    case; a :class:`ValueError` saying why when it is neither."""
    value = reference.strip().lower().removeprefix(ID_PREFIX)
    if not re.fullmatch(r"[0-9a-f]{1,64}", value):
        raise ValueError("not a sha256: 64 hex digits (or a prefix of them), or sha256:<hex>")
    return value


def scrub(data: bytes, detector: SecretDetector | None = None) -> tuple[bytes, list[str]]:
    """``data`` with every secret replaced by its marker, and the rules found. Bytes that are
    not UTF-8 pass through unchanged (surrogate escapes), so binary content is scanned too and
    kept byte for byte where nothing is found."""
    text = data.decode("utf-8", errors="surrogateescape")
    new, rules = (detector or default_detector()).redact(text)
    if not rules:
        return data, []
    return new.encode("utf-8", errors="surrogateescape"), rules


class FileArtifactStore:
    """Artifacts as files ``<root>/<sha[:2]>/<sha>``, written atomically (a temporary file in
    the same folder, then a rename), so a reader never sees half an artifact."""

    def __init__(self, root: Path, detector: SecretDetector | None = None) -> None:
        self.root = root
        self._detector = detector

    @classmethod
    def from_settings(cls, settings: Settings) -> FileArtifactStore:
        return cls(settings.resolved_artifact_dir)

    def path_of(self, sha256: str) -> Path:
        return artifact_path(self.root, sha256)

    def put(self, data: bytes, content_type: str) -> ArtifactRef:
        clean, rules = scrub(data, self._detector)
        sha = hashlib.sha256(clean).hexdigest()
        target = self.path_of(sha)
        if not target.exists():  # the same address is the same bytes: nothing to write
            self._write(target, clean)
        return ArtifactRef(
            artifact_id=artifact_id(sha),
            sha256=sha,
            size_bytes=len(clean),
            content_type=content_type,
            redaction_level=RedactionLevel.RESTRICTED if rules else RedactionLevel.REVIEW,
        )

    def get(self, sha256: str) -> bytes:
        return read_artifact(self.root, sha256)

    def exists(self, sha256: str) -> bool:
        return self.path_of(checked_sha(sha256)).is_file()

    def find(self, prefix: str) -> str:
        """The one stored sha256 that starts with ``prefix`` (at least 4 hex digits)."""
        prefix = sha256_of(prefix)
        if len(prefix) == 64:
            return prefix
        if len(prefix) < 4:
            raise ArtifactNotFoundError("a sha256 prefix needs at least 4 hex digits")
        folder = self.root / prefix[:2]
        found = sorted(p.name for p in folder.glob(f"{prefix}*") if SHA256.match(p.name))
        if not found:
            raise ArtifactNotFoundError(f"no artifact starting with {prefix} in {self.root}")
        if len(found) > 1:
            raise ArtifactNotFoundError(
                f"{prefix} is ambiguous: {len(found)} artifacts start with it "
                f"({', '.join(s[:16] for s in found[:3])}...); give more digits"
            )
        return found[0]

    def _write(self, target: Path, data: bytes) -> None:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        except OSError as exc:
            raise ArtifactError(f"cannot write to the artifact store {self.root}: {exc}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
        except BaseException as exc:
            Path(temp).unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise ArtifactError(
                    f"cannot write to the artifact store {self.root}: {exc.strerror or exc}"
                ) from exc
            raise


# --- moving an entry's large content into the store ---------------------------------------------


def offload(
    entry: LedgerEntry, store: ArtifactStore, fits: Callable[[LedgerEntry], bool]
) -> tuple[LedgerEntry, int]:
    """``entry`` with its largest free texts moved into ``store``, largest first, until
    ``fits`` says it does; and how many were moved. A tool result keeps the start of its
    output as its summary and gets the ref in its ``artifact_refs``; a text, file snippet or
    error message keeps its start and the ref is appended as an ``artifact_ref`` part; a JSON
    document (which has no valid start) becomes an ``artifact_ref`` part in its place. Part
    positions do not change, so the entry's ``redactions`` still point at the right parts."""
    moved = 0
    for index, _size in sorted(_candidates(entry.parts), key=lambda c: (-c[1], c[0])):
        if fits(entry):
            break
        entry = move_part(entry, index, store)
        moved += 1
    return entry, moved


def _candidates(parts: tuple[Part, ...]) -> list[tuple[int, int]]:
    """(part index, bytes) of each part's movable text that is worth moving."""
    out = []
    for index, part in enumerate(parts):
        text = _movable(part)
        size = 0 if text is None else len(text.encode("utf-8", "surrogatepass"))
        if size >= MIN_MOVE_BYTES:
            out.append((index, size))
    return out


def _movable(part: Part) -> str | None:
    match part:
        case TextPart() | FileSnippetPart():
            return part.text
        case JsonPart():
            return part.json_text
        case ToolResultPart():
            return part.summary
        case ErrorPart():
            return part.message
        case _:
            return None


def move_part(entry: LedgerEntry, index: int, store: ArtifactStore) -> LedgerEntry:
    """``entry`` with part ``index``'s text moved into ``store`` (see :func:`offload`)."""
    part = entry.parts[index]
    text = _movable(part)
    assert text is not None
    ref = store.put(
        text.encode("utf-8", "surrogatepass"), JSON if isinstance(part, JsonPart) else TEXT
    )
    if _was_redacted(entry, index):  # the entry's own pass already took secrets out of it
        ref = ref.model_copy(update={"redaction_level": RedactionLevel.RESTRICTED})
    parts = list(entry.parts)
    match part:
        case JsonPart():
            parts[index] = ArtifactRefPart(**ref.model_dump())
        case ToolResultPart():
            parts[index] = part.model_copy(
                update={"summary": _preview(text, ref), "artifact_refs": (*part.artifact_refs, ref)}
            )
        case TextPart() | FileSnippetPart():
            parts[index] = part.model_copy(update={"text": _preview(text, ref)})
            parts.append(ArtifactRefPart(**ref.model_dump()))
        case ErrorPart():
            parts[index] = part.model_copy(update={"message": _preview(text, ref)})
            parts.append(ArtifactRefPart(**ref.model_dump()))
    return entry.model_copy(update={"parts": tuple(parts)})


def _preview(text: str, ref: ArtifactRef) -> str:
    rest = len(text) - PREVIEW_CHARS
    return f"{text[:PREVIEW_CHARS]}\n[... {rest:,} more characters in artifact {ref.artifact_id}]"


def _was_redacted(entry: LedgerEntry, index: int) -> bool:
    field = f"parts[{index}]"
    return any(
        r.field == field or r.field.startswith((f"{field}.", f"{field}[")) for r in entry.redactions
    )


__all__ = [
    "SHA256",
    "ArtifactCorruptError",
    "ArtifactError",
    "ArtifactNotFoundError",
    "ArtifactStore",
    "FileArtifactStore",
]
