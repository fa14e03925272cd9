"""How many examples the suite's property-based tests draw.

Each test names the examples it wants on a full run; the suite draws ``AGENTLEDGER_FUZZ_SCALE``
times that many (0.5 unless set: the suite's 15-minute budget). ``AGENTLEDGER_FUZZ_SCALE=1``
draws every test's full number, ``=10`` ten times it, for a deeper run than CI's.
"""

from __future__ import annotations

import os

SCALE = float(os.environ.get("AGENTLEDGER_FUZZ_SCALE", "0.5"))


def examples(wanted: int) -> int:
    """``wanted`` examples scaled by ``AGENTLEDGER_FUZZ_SCALE``, at least 10 (or ``wanted``)."""
    return max(min(wanted, 10), round(wanted * SCALE))
