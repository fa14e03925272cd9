"""The synthetic fleets are deterministic, valid and cover what the projections must handle."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import pairwise
from typing import TypeVar

from schemas.codec import LedgerCodec
from schemas.models import (
    ContextItemsPart,
    DiffPart,
    EntryKind,
    FileChangeStatus,
    FileClassification,
    FileSnippetPart,
    LedgerEntry,
    MemoryProposalPart,
    ModelUsagePart,
    ToolResultPart,
    ToolResultStatus,
    VerificationPart,
    VerificationStatus,
)
from streams.simulate import INJECTION, OUTCOMES, simulate, simulate_runs

T = TypeVar("T")


def _runs(entries: list[LedgerEntry]) -> dict[str, list[LedgerEntry]]:
    runs: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in entries:
        runs[e.run_id].append(e)
    return runs


def test_same_seed_same_entries_other_seed_other_entries() -> None:
    assert simulate(2, 5, seed=3) == simulate(2, 5, seed=3)
    assert simulate(2, 5, seed=3) != simulate(2, 5, seed=4)


def test_runs_are_gapless_and_time_ordered() -> None:
    for run in simulate_runs(2, 14, seed=1):
        assert [e.sequence_no for e in run] == list(range(1, len(run) + 1))
        assert all(a.occurred_at < b.occurred_at for a, b in pairwise(run))
        assert run[0].kind is EntryKind.RUN_STARTED and run[-1].kind is EntryKind.RUN_FINISHED


def test_every_failure_class_appears_in_a_fleet_of_14_runs() -> None:
    entries = simulate(1, len(OUTCOMES), seed=9)
    finished = [e for e in entries if e.kind is EntryKind.RUN_FINISHED]
    assert Counter(e.metadata["outcome"] for e in finished) == Counter(OUTCOMES)


def test_every_entry_encodes() -> None:
    codec = LedgerCodec()
    entries = simulate(2, 14, seed=5)
    assert codec.decode_many([codec.encode(e) for e in entries]) == entries


def _parts(entries: list[LedgerEntry], kind: type[T]) -> list[T]:
    return [p for e in entries for p in e.parts if isinstance(p, kind)]


def test_realistic_material_is_present() -> None:
    entries = simulate(1, 14, seed=2)
    results = _parts(entries, ToolResultPart)
    assert any(r.status is ToolResultStatus.FAILED for r in results)
    assert any(r.timed_out for r in results)
    assert any("AKIA" in r.summary for r in results), "a secret inside a tool output"
    assert any(p.text and INJECTION in p.text for p in _parts(entries, FileSnippetPart))

    diffs = [f for d in _parts(entries, DiffPart) for f in d.files]
    assert any(f.status is FileChangeStatus.DELETED for f in diffs), "a revert"
    assert any(f.classification is FileClassification.TEST for f in diffs)

    verdicts = [v.status for v in _parts(entries, VerificationPart)]
    assert VerificationStatus.FAILED in verdicts and VerificationStatus.PASSED in verdicts

    usages = _parts(entries, ModelUsagePart)
    assert len({u.model for u in usages}) >= 3 and len({u.purpose for u in usages}) >= 3
    assert any(u.cached_input_tokens > 0 for u in usages)
    ids = Counter(u.provider_response_id for u in usages)
    assert any(n == 2 for n in ids.values()), "a response reported twice"

    proposals = _parts(entries, MemoryProposalPart)
    refs = [r for p in proposals for f in p.facts for r in f.evidence_refs]
    known = {f"entry:{e.entry_id}" for e in entries}
    assert any(r in known for r in refs) and any(r not in known for r in refs)
    assert _parts(entries, ContextItemsPart)

    kinds = {e.kind for e in entries}
    assert {EntryKind.APPROVAL_DECISION, EntryKind.COMPACTION, EntryKind.ERROR_EVENT} <= kinds
