"""What the secret detector's tests share."""

from __future__ import annotations

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
