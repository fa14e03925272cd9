"""Topic names: the one place that says what a fleet's ledger, dead-letter and change topics are
called, for publishers, workers, readers and ops alike (creating them is ``infra.topics``)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from schemas.models import FLEET_ID_PATTERN, FLEET_ID_RULE

__all__ = [
    "CHANGES_INFIX",
    "FLEET_ID_RE",
    "change_schema_topic",
    "change_topic",
    "check_fleet_id",
    "dead_letter_topic",
    "fleet_in_ledger_topic",
    "fleet_of_ledger_topic",
    "fleets_among",
    "ledger_topic",
    "prefix_of_ledger_topic",
    "projection_of_change_topic",
]


LEDGER_INFIX = ".ledger."
CHANGES_INFIX = ".changes."


def ledger_topic(prefix: str, fleet_id: str) -> str:
    return f"{prefix}{LEDGER_INFIX}{fleet_id}"


def fleet_in_ledger_topic(topic: str) -> str | None:
    """The fleet of a ledger topic ``<prefix>.ledger.<fleet>`` whatever its prefix (None for
    other topics): for what reads a record's topic without the deployment's settings (the
    record contract, dead letters, worker health keys). Knowing the prefix:
    :func:`fleet_of_ledger_topic`."""
    split = _ledger_parts(topic)
    return split[1] if split else None


def prefix_of_ledger_topic(topic: str) -> str | None:
    """The topic prefix of a ledger topic ``<prefix>.ledger.<fleet>`` (None for other topics)."""
    split = _ledger_parts(topic)
    return split[0] if split else None


def _ledger_parts(topic: str) -> tuple[str, str] | None:
    """(prefix, fleet) of a ledger topic, the fleet a valid id; None for any other topic."""
    head, sep, fleet = topic.rpartition(LEDGER_INFIX)
    return (head, fleet) if sep and head and FLEET_ID_RE.fullmatch(fleet) else None


def dead_letter_topic(prefix: str, fleet_id: str) -> str:
    return f"{prefix}.dlq.{fleet_id}"


FLEET_ID_RE = re.compile(FLEET_ID_PATTERN)


def check_fleet_id(fleet_id: str) -> str:
    """Fleet ids become topic names: letters, digits, ``_`` and ``-`` only."""
    if not FLEET_ID_RE.match(fleet_id):
        raise ValueError(f"fleet id {fleet_id!r} is not valid: {FLEET_ID_RULE}")
    return fleet_id


def change_topic(prefix: str, projection: str) -> str:
    return f"{prefix}{CHANGES_INFIX}{projection}"


def change_schema_topic(prefix: str) -> str:
    return change_topic(prefix, "_schemas")


def projection_of_change_topic(prefix: str, topic: str) -> str | None:
    """What follows ``<prefix>.changes.`` in ``topic`` (a projection, or ``_schemas``), or None
    for a topic of no deployment's change streams under ``prefix``."""
    head = f"{prefix}{CHANGES_INFIX}"
    return topic[len(head) :] if topic.startswith(head) else None


def fleet_of_ledger_topic(prefix: str, topic: str) -> str | None:
    """The fleet a ``<prefix>.ledger.<fleet>`` topic belongs to, or None for any other topic."""
    head = f"{prefix}{LEDGER_INFIX}"
    if not topic.startswith(head):
        return None
    fleet = topic[len(head) :]
    return fleet if FLEET_ID_RE.fullmatch(fleet) else None


def fleets_among(prefix: str, topics: Iterable[str]) -> list[str]:
    """The fleets that exist: one per ``<prefix>.ledger.<fleet>`` topic.

    One notion for workers, rebuild, verify, ``dlq`` and ``topics``: a fleet made by ``topics
    create --fleet X`` or ``import --fleet X`` exists as soon as its ledger topic does, whatever
    ``AGENTLEDGER_FLEETS`` says (that setting only names the fleets ``infra up`` creates).
    """
    return sorted({f for t in topics if (f := fleet_of_ledger_topic(prefix, t)) is not None})
