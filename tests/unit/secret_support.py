"""What the secret detector's tests share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from schemas.secret_scan import SecretDetector


class TakeCounter:
    """Counts the matches the detector takes (``SecretDetector._take``) while installed: a
    text of k chained matches must cost O(k) takes, not k² (counted, not timed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        take = SecretDetector._take

        def counting(detector: SecretDetector, *args: Any, **kwargs: Any) -> int:
            self.count += 1
            return take(detector, *args, **kwargs)

        monkeypatch.setattr(SecretDetector, "_take", counting)


def work_doubling(
    detector: SecretDetector, unit: str, chars: int, work: Callable[[], int]
) -> tuple[int, list[int]]:
    """``unit`` repeated to about ``chars`` characters, then twice that: every copy found in
    each (asserted), and the work the counter ``work()`` reads grew by while finding them. The
    copies of the first text and the work of each: linear work doubles with the text,
    quadratic work quadruples."""
    copies = chars // len(unit)
    counts = []
    for n in (copies, 2 * copies):
        before = work()
        found = detector.find(unit * n)
        assert len(found) == n  # every copy found
        counts.append(work() - before)
    return copies, counts
