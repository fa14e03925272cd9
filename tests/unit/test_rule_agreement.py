"""One rule, one answer (issue 28): every projection that reads an approval decision reads the
same one. On every approval decision of 1,000 simulated runs, each also rewritten in the shapes
real logs use (DENIED, lower case, padded, a JSON ``decision``, a JSON ``approved``, nothing),
and on every entry of both sample packs: the diff timeline's row, the failure classifier's
evidence and the working memory's blockers agree with ``approval_decision``."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from projectors.base import Projection, approval_decision
from projectors.diff_timelines import DiffTimelinesProjection
from projectors.failure_classifications import FailureClassifications
from projectors.trust import model_visible
from projectors.working_memory import WorkingMemoryProjection
from schemas.models import EntryKind, JsonPart, LedgerEntry, TextPart, Visibility
from streams.importers.base import ImportFormatError
from streams.importers.detect import AutoImporter
from streams.simulate import simulate_runs
from tests.packs import SAMPLES, SAMPLES2

RUNS = 1_000


def _variants(entry: LedgerEntry) -> Iterator[LedgerEntry]:
    """The decision as the simulator writes it, then as other sources do."""
    said = entry.metadata.get("decision", "")
    meta = {k: v for k, v in entry.metadata.items() if k != "decision"}
    text = [TextPart(text="reviewed")]
    shapes: list[tuple[dict[str, str], list[Any]]] = [
        (entry.metadata, list(entry.parts)),
        ({**meta, "decision": "DENIED" if said == "REJECTED" else said}, text),
        ({**meta, "decision": f"  {said.lower()} "}, text),
        (meta, [JsonPart(json_text=json.dumps({"decision": said.lower()}))]),
        (meta, [JsonPart(json_text=json.dumps({"approved": said == "APPROVED"}))]),
        (meta, [JsonPart(json_text="[1, 2]"), JsonPart(json_text='{"decision": "denied"}')]),
        (meta, text),
    ]
    for i, (metadata, parts) in enumerate(shapes):
        for visibility in (entry.visibility, Visibility.MODEL_VISIBLE):
            yield entry.model_copy(
                update={
                    "metadata": metadata,
                    "parts": parts,
                    "visibility": visibility,
                    "entry_id": f"{entry.entry_id}-v{i}-{visibility.value}",
                }
            )


def _check_run(entries: list[LedgerEntry]) -> tuple[int, int]:
    """Fold the run through the three projections; at each approval decision compare what each
    shows with ``approval_decision``. Returns the decisions checked, and of them those the
    working memory read (model-visible ones)."""
    projections: list[Projection[Any]] = [
        DiffTimelinesProjection(),
        FailureClassifications(),
        WorkingMemoryProjection(),
    ]
    states: list[Any] = [None, None, None]
    checked = memory_checked = 0
    for entry in entries:
        for i, p in enumerate(projections):
            if states[i] is None:
                states[i] = p.initial(entry)
            if p.accepts(entry):
                states[i] = p.fold(states[i], entry)
        if entry.kind is not EntryKind.APPROVAL_DECISION:
            continue
        decision = approval_decision(entry)
        row = states[0].rows[-1]
        assert (row.entry_id, row.status) == (entry.entry_id, decision)
        assert states[1].evidence.last_approval == decision
        if model_visible(entry):  # working memory reads only what a model may see
            rejected = [b for b in states[2].blocked_by if b.evidence == f"entry:{entry.entry_id}"]
            assert (decision == "REJECTED") == bool(rejected), decision
            memory_checked += 1
        checked += 1
    return checked, memory_checked


def _with_variants(run: list[LedgerEntry]) -> Iterator[list[LedgerEntry]]:
    cut = [i for i, e in enumerate(run) if e.kind is EntryKind.APPROVAL_DECISION]
    if not cut:
        return
    at = cut[0]
    for variant in _variants(run[at]):
        yield [*run[:at], variant]


def test_simulated_runs_every_decision_shape_one_answer() -> None:
    runs = list(itertools.islice(simulate_runs(2, RUNS, seed=28), RUNS))
    checked = sum(_check_run(run)[0] for run in runs)
    variants = [_check_run(v) for run in runs for v in _with_variants(run)]
    assert checked > 20  # the simulator's runs do reach approvals
    assert sum(v for v, _ in variants) >= 14 * 20 and sum(m for _, m in variants) >= 7 * 20
    decisions = {approval_decision(v[-1]) for run in runs[:200] for v in _with_variants(run)}
    assert {"APPROVED", "REJECTED", "UNKNOWN"} <= decisions


def test_approval_decision_reads_each_shape() -> None:
    [entry] = [
        e
        for run in itertools.islice(simulate_runs(1, 400, seed=3), 400)
        for e in run
        if e.kind is EntryKind.APPROVAL_DECISION and e.metadata.get("decision") == "REJECTED"
    ][:1]
    got = [approval_decision(v) for v in _variants(entry)][::2]  # (each shape twice)
    assert got == ["REJECTED"] * 6 + ["UNKNOWN"]


@pytest.mark.parametrize("pack", [SAMPLES, SAMPLES2], ids=["samples", "samples2"])
def test_sample_logs_one_answer(pack: Path) -> None:
    auto = AutoImporter()
    runs = 0
    for path in auto.discover([pack]):
        try:
            imported, _ = auto.import_file(path, "agree", settled=True)
        except ImportFormatError:  # a file no format reads: the importers' tests check those
            continue
        for run in imported:
            _check_run(run.entries)
            runs += 1
    assert runs > 10
