"""One time rule for every command-line filter and start time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from schemas.times import parse_moment
from streams.rebuild import RebuildError, _parse_time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01T08:30", datetime(2026, 12, 1, 8, 30, tzinfo=UTC)),
        ("2026-12-01T08:30:00Z", datetime(2026, 12, 1, 8, 30, tzinfo=UTC)),
        (
            "2026-12-01T08:30:00+02:00",
            datetime(2026, 12, 1, 8, 30, tzinfo=timezone(timedelta(hours=2))),
        ),
    ],
)
def test_dates_and_times_parse_the_same_for_costs_and_rebuild(
    text: str, expected: datetime
) -> None:
    assert parse_moment(text) == expected
    assert _parse_time(text) == expected


def test_a_bad_time_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="not an ISO date or date-time: 'yesterday'"):
        parse_moment("yesterday")
    with pytest.raises(RebuildError, match=r"e\.g\. 2026-11-30"):
        _parse_time("yesterday")
