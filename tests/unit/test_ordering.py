"""Order inside a run, as pure decisions."""

from __future__ import annotations

from projectors.ordering import missing_ranges, plan_run


def test_in_order_entries_apply() -> None:
    plan = plan_run(0, {}, [(1, "a"), (2, "b"), (3, "c")])
    assert plan.apply == ["a", "b", "c"] and plan.applied_seq == 3
    assert plan.hold == {} and plan.duplicates == 0 and plan.held == ()


def test_duplicates_apply_once() -> None:
    plan = plan_run(2, {}, [(1, "a"), (2, "b"), (3, "c"), (3, "c-again")])
    assert plan.apply == ["c"] and plan.duplicates == 3 and plan.applied_seq == 3


def test_gap_holds_later_entries_and_reports_missing_range() -> None:
    plan = plan_run(1, {}, [(2, "b"), (5, "e"), (6, "f")])
    assert plan.apply == ["b"] and plan.applied_seq == 2
    assert plan.hold == {5: "e", 6: "f"} and plan.held == (5, 6)
    assert missing_ranges(plan.applied_seq, plan.held) == [(3, 4)]


def test_late_entry_fills_gap_and_releases_held() -> None:
    plan = plan_run(2, {5: "e", 6: "f"}, [(4, "d"), (3, "c")])
    assert plan.apply == ["c", "d", "e", "f"] and plan.applied_seq == 6
    assert plan.release == [5, 6] and plan.hold == {} and plan.held == ()


def test_partial_fill_keeps_the_rest_waiting() -> None:
    plan = plan_run(2, {6: "f"}, [(3, "c")])
    assert plan.apply == ["c"] and plan.held == (6,)
    assert missing_ranges(3, plan.held) == [(4, 5)]


def test_duplicate_of_a_held_entry_counts_once() -> None:
    plan = plan_run(1, {4: "d"}, [(4, "d-again")])
    assert plan.duplicates == 1 and plan.hold == {} and plan.held == (4,)


def test_missing_ranges_with_several_gaps() -> None:
    assert missing_ranges(0, [3, 4, 8]) == [(1, 2), (5, 7)]
    assert missing_ranges(5, []) == []
