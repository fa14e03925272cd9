"""What a decoded entry must also satisfy where it was found: the record that carried it.

The schema (``schemas.models``) already checks every field as the publisher does. These rules
tie an entry to its record, so a raw producer, a client that forgot the key or a bit flip cannot
put a run's entries where the engine would lose them: the record's key is the run id (so one run
lives on one partition), the entry's fleet is its topic's fleet, and it does not claim to have
happened long after the record was written. Each rule reads only the record and the entry, never
the clock, so a replay judges every record exactly as the live worker did.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from schemas.errors import LedgerDecodeError
from schemas.models import LedgerEntry
from schemas.topics import fleet_in_ledger_topic

# How far ahead of its writer's clock an entry may say it happened (clock skew between hosts).
MAX_CLOCK_AHEAD = timedelta(days=1)
_LAST_TIMESTAMP_MS = int(datetime(9998, 12, 31, tzinfo=UTC).timestamp() * 1000)


class RecordContractError(LedgerDecodeError):
    """An entry decoded, but its record breaks the contract: dead-lettered with this reason.
    Fix the producer (use the publisher SDK, key records by run id), then redrive."""


def check_record(
    entry: LedgerEntry, topic: str, key: bytes | None, timestamp_ms: int | None
) -> RecordContractError | None:
    """Why this entry may not be applied from this record, or None."""
    if key != entry.run_id.encode():
        return RecordContractError(
            "the record's key is not the entry's run_id: a run's entries must share one key so "
            "they share one partition (publish through the SDK, or key records by run id)"
        )
    fleet = fleet_in_ledger_topic(topic)
    if fleet is not None and entry.fleet_id != fleet:
        return RecordContractError(
            f"the entry's fleet_id is not {fleet}, the fleet of {topic}: a fleet publishes to "
            "its own topic"
        )
    if timestamp_ms is not None and 0 < timestamp_ms < _LAST_TIMESTAMP_MS:
        # (a producer may stamp any 64-bit value; past year 9998 no entry time can exceed it)
        written = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
        if entry.occurred_at > written + MAX_CLOCK_AHEAD:
            return RecordContractError(
                f"occurred_at is more than {MAX_CLOCK_AHEAD.days} day after the record was written"
            )
    return None
