"""The pure parts of projectors.stores.postgres_ops."""

from __future__ import annotations

import random

import pytest

from projectors.stores.postgres_ops import prefix_bounds, run_of_fleets
from schemas.errors import NotFoundError


def _starts(prefix: str, text: str) -> bool:
    low, high = prefix_bounds(prefix)
    as_bytes = text.encode()  # PostgreSQL's ~>=~ and ~<~ compare bytes (memcmp)
    below = high is None or as_bytes < high.encode()
    return as_bytes >= low.encode() and below


def test_the_bounds_hold_exactly_the_texts_that_start_with_the_prefix() -> None:
    rng = random.Random(23)
    alphabet = ["a", "b", "z", "-", "%", "_", "\\", "é", "\ud7ff", "\ue000", "\U0010ffff", "😀"]
    for _ in range(3_000):
        prefix = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        for t in (text, prefix + text, prefix[:-1] + text):
            assert _starts(prefix, t) == t.startswith(prefix), (prefix, t)


def test_the_upper_bound_steps_past_surrogates_and_the_last_code_point() -> None:
    assert prefix_bounds("ab") == ("ab", "ac")
    assert prefix_bounds("a\ud7ff") == ("a\ud7ff", "a\ue000")  # no text holds a surrogate
    assert prefix_bounds("a\U0010ffff") == ("a\U0010ffff", "b")
    assert prefix_bounds("\U0010ffff\U0010ffff") == ("\U0010ffff\U0010ffff", None)


def test_what_no_run_id_can_be_is_no_run_before_any_query() -> None:
    """A run id with a NUL (PostgreSQL refuses it: a 500 from the web API, an internal error
    from MCP) or longer than any id (a megabyte passed an index row's size) is "no run", as
    an unknown run is, without asking PostgreSQL (``conn`` is never used), and the answer
    does not echo a megabyte back."""
    for asked in ("run\x00", "r" * 1_000_000, "with space", ""):
        with pytest.raises(NotFoundError) as caught:
            run_of_fleets(None, asked, ["fleet-01"])  # type: ignore[arg-type]
        assert "\x00" not in str(caught.value) and len(str(caught.value)) < 200
    with pytest.raises(NotFoundError, match=r"no run run\\x00"):
        run_of_fleets(None, "run\x00", ["fleet-01"])  # type: ignore[arg-type]
