"""Which dead letters redrive may send back (pure): never one that would be refused again."""

from __future__ import annotations

from streams.dlq import DeadLetter, refused_for_good
from streams.engine import CONFLICTING_DUPLICATE, Poison, SourceRecord, _admit


def _letter(p: Poison) -> DeadLetter:
    r = p.record
    return DeadLetter(
        "p.dlq.b", 0, 0, r.topic, r.partition, r.offset, p.error_class, p.message, r.key, b"", ()
    )


def _poison(first: SourceRecord, then: SourceRecord) -> Poison:
    refused: list[Poison] = []
    _admit(None, [(1, (None, b"", first)), (2, (None, b"", then))], refused)
    [p] = refused
    return p


def test_an_entry_of_a_run_in_another_fleet_or_a_conflict_is_refused_for_good() -> None:
    a = SourceRecord("p.ledger.a", 0, 5, b"run-1", b"")
    other_fleet = _poison(a, SourceRecord("p.ledger.b", 0, 9, b"run-1", b""))
    assert refused_for_good(_letter(other_fleet)) == (
        "refused for good: its run is in another fleet (dismiss it)"
    )
    conflict = Poison(a, CONFLICTING_DUPLICATE, "run run-1 sequence_no 1: ... conflicts")
    assert refused_for_good(_letter(conflict)) is not None


def test_a_letter_that_may_apply_now_is_left_to_redrive() -> None:
    a = SourceRecord("p.ledger.a", 0, 5, b"run-1", b"")
    # another partition of the same topic: sent back keyed by its run, it lands on the right one
    other_partition = _poison(a, SourceRecord("p.ledger.a", 1, 9, b"wrong-key", b""))
    assert refused_for_good(_letter(other_partition)) is None
    undecodable = Poison(a, "LedgerDecodeError", "not Avro")
    assert refused_for_good(_letter(undecodable)) is None
