"""The synthetic fleets are deterministic, valid and cover what the projections must handle."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import pairwise
from typing import TypeVar

from schemas.codec import LedgerCodec
from schemas.context_delta import Previous, resolve
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
from streams.simulate import INJECTION, OUTCOMES, run_length, simulate, simulate_runs

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


# --- long runs ----------------------------------------------------------------------------------


def test_runs_of_a_fixed_length_are_that_long_gapless_and_end() -> None:
    for run in simulate_runs(1, 3, seed=5, entries_per_run=600):
        assert 570 <= len(run) <= 630  # about: the story after the middle varies by outcome
        assert [e.sequence_no for e in run] == list(range(1, len(run) + 1))
        assert run[-1].kind is EntryKind.RUN_FINISHED and run[-1].run_status is not None
        assert all(b.occurred_at < a.occurred_at for b, a in pairwise(run))


def test_a_long_run_compacts_and_each_call_sees_the_history_since_the_last_compaction() -> None:
    [run] = list(simulate_runs(1, 1, seed=8, entries_per_run=3_000))
    by_id = {e.entry_id: e for e in run}
    compactions = [e for e in run if e.kind is EntryKind.COMPACTION]
    assert len(compactions) >= 3, "a real agent compacts a 3,000-entry run several times"
    kept = {EntryKind.SYSTEM_INSTRUCTION, EntryKind.ORG_POLICY, EntryKind.USER_TASK}
    kept |= {EntryKind.REPOSITORY_INSTRUCTION, EntryKind.COMPACTION}
    through = 0
    previous: Previous | None = None
    deltas = 0
    for e in run:
        if e.kind is EntryKind.COMPACTION:
            through = int(e.metadata["replaces_through_seq"])
        if e.kind is not EntryKind.CONTEXT_PROJECTED:
            continue
        parts = [p for p in e.parts if isinstance(p, ContextItemsPart)]
        deltas += parts[0].base_entry_id is not None
        whole, problem = resolve(previous, parts)
        assert problem is None
        previous = (e.entry_id, whole)
        seen = [by_id[i.source_entry_id] for i in whole if i.source_entry_id]
        assert seen, "every call sees something"
        assert all(s.sequence_no < e.sequence_no for s in seen)
        assert all(s.sequence_no > through or s.kind in kept for s in seen)
        newest = max(s.sequence_no for s in seen)
        visible = [
            x for x in run[newest : e.sequence_no - 1] if x.visibility.value == "MODEL_VISIBLE"
        ]
        assert not visible, "nothing model-visible since the last item is left out"
    assert deltas >= 300, "manifests after a run's first are deltas of the previous one"


def test_the_real_length_profile_has_real_agents_shape() -> None:
    lengths = [run_length("real", i) or 0 for i in range(1_000)]
    ordered = sorted(lengths)
    assert 130 <= ordered[500] <= 170  # median ~150
    assert sum(n > 500 for n in lengths) >= 100  # >= 10% over 500
    assert sum(n > 3_000 for n in lengths) >= 10  # >= 1% over 3,000
    assert min(lengths) >= 30 and max(lengths) <= 20_000
    runs = list(simulate_runs(1, 20, seed=3, length_profile="real"))
    assert [len(r) >= (run_length("real", i) or 0) - 25 for i, r in enumerate(runs)] == [True] * 20
    assert run_length("short", 7) is None
