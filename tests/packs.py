"""Where the shared sample packs are: one answer for every test (``streams.secret_eval``'s,
which reads them too): ``AGENTLEDGER_SHARED``, else the ``shared`` folder beside the clone or
beside any folder above it, else ``/work/shared``. Never copied into the repository."""

from __future__ import annotations

from streams.secret_eval import SHARED

__all__ = ["SAMPLES", "SAMPLES2", "SHARED"]

SAMPLES = SHARED / "samples"
SAMPLES2 = SHARED / "samples2"
