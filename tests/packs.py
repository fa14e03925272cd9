"""Where the shared sample packs are: one answer for every test.

``AGENTLEDGER_SHARED`` if set, else the ``shared`` folder beside the repository (or beside any
folder above it, for a clone kept deeper, e.g. in a temporary folder), else ``/work/shared``.
Tests read the packs there; they are never copied into the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SAMPLES", "SAMPLES2", "SHARED"]


def _shared() -> Path:
    if os.environ.get("AGENTLEDGER_SHARED"):
        return Path(os.environ["AGENTLEDGER_SHARED"])
    for folder in Path(__file__).resolve().parents[1:]:
        candidate = folder.parent / "shared"
        if (candidate / "samples").is_dir():
            return candidate
    return Path("/work/shared")


SHARED = _shared()
SAMPLES = SHARED / "samples"
SAMPLES2 = SHARED / "samples2"
