"""Times given on the command line: one rule for every filter and start time.

An ISO date means midnight UTC; an ISO date-time without an offset is read as UTC. (Entry
timestamps are stricter: the publisher rejects a ``timestamp`` without a zone, because there the
zone cannot be guessed after the fact.)
"""

from __future__ import annotations

from datetime import UTC, date, datetime


def parse_moment(text: str) -> datetime:
    """An ISO date (midnight UTC) or date-time (UTC when no offset is given); ValueError if not."""
    value = text.strip()
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not an ISO date or date-time: {text!r} (e.g. 2026-11-30 or 2026-11-30T08:00:00Z)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
