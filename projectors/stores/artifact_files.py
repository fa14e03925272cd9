"""The artifact store's read half: an artifact's bytes from the folder store, checked against
their address (the sha256 of the bytes as stored).

The write half (``put``: secret scan, then an atomic write) is the publisher's
(``streams/artifacts.py``, ``FileArtifactStore``), which reads through here too; the read side
(``agentledger mcp``'s ``get_artifact``) reads here without importing the write side. Content
was secret-scanned before it was written: a reader serves the bytes as stored, never anything
derived again from elsewhere.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from schemas.errors import AgentLedgerError

SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ArtifactError(AgentLedgerError):
    """An artifact cannot be stored or read."""


class ArtifactNotFoundError(ArtifactError):
    """No artifact with this sha256 (or prefix) in the store."""


class ArtifactCorruptError(ArtifactError):
    """The stored bytes no longer hash to their address: the file was changed or truncated
    after it was written. Restore it from a replay package or the agent's own log."""


def artifact_path(root: Path, sha256: str) -> Path:
    """Where the folder store keeps an artifact: ``<root>/<sha[:2]>/<sha>``."""
    return root / sha256[:2] / sha256


def checked_sha(sha256: str) -> str:
    if not SHA256.match(sha256):
        raise ArtifactNotFoundError("an artifact address is 64 lower-case hex digits")
    return sha256


def read_artifact(root: Path, sha256: str) -> bytes:
    """The bytes stored at ``sha256`` under ``root``, checked against it."""
    sha = checked_sha(sha256)
    try:
        data = artifact_path(root, sha).read_bytes()
    except FileNotFoundError:
        raise ArtifactNotFoundError(f"no artifact {sha} in {root}") from None
    if hashlib.sha256(data).hexdigest() != sha:
        raise ArtifactCorruptError(
            f"artifact {sha} in {root} does not hash to its address (changed or "
            "truncated after it was written)"
        )
    return data
