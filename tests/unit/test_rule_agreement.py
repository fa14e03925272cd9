"""One rule, one answer (issue 28).

- Approval decisions (``projectors.base.approval_decision``): on every approval decision of 1,000
  simulated runs, each also rewritten in the shapes real logs use (DENIED, lower case, padded, a
  JSON ``decision``, a JSON ``approved``, nothing), and on every entry of both sample packs, the
  diff timeline's row, the failure classifier's evidence and the working memory's blockers agree.
- A provider response counts once (``projectors.base.new_calls``): on every entry of 1,000
  simulated runs (300 of them also with each model call reported again under a new entry id)
  and of both sample packs, cost metrics, the diff timeline, the failure classifier and the
  context manifests count the same calls.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from projectors.base import Projection, approval_decision
from projectors.context_manifests import ContextManifestsProjection
from projectors.cost_metrics import CostMetricsProjection
from projectors.diff_timelines import DiffTimelinesProjection
from projectors.failure_classifications import FailureClassifications
from projectors.trust import model_visible
from projectors.working_memory import WorkingMemoryProjection
from schemas.models import (
    EntryKind,
    JsonPart,
    LedgerEntry,
    ModelUsagePart,
    TextPart,
    Visibility,
)
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
    return _fold_checked([None, None, None], entries)


_DECIDERS: list[Projection[Any]] = [
    DiffTimelinesProjection(),
    FailureClassifications(),
    WorkingMemoryProjection(),
]


def _fold_checked(states: list[Any], entries: list[LedgerEntry]) -> tuple[int, int]:
    """``entries`` folded onto ``states`` (changed in place), each approval decision checked."""
    checked = memory_checked = 0
    for entry in entries:
        for i, p in enumerate(_DECIDERS):
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


def _first_decision(run: list[LedgerEntry]) -> int | None:
    """The position of the run's first approval decision (None: it has none)."""
    return next((i for i, e in enumerate(run) if e.kind is EntryKind.APPROVAL_DECISION), None)


def _with_variants(run: list[LedgerEntry]) -> Iterator[list[LedgerEntry]]:
    """The run up to its first approval decision, that decision in each shape."""
    at = _first_decision(run)
    if at is None:
        return
    for variant in _variants(run[at]):
        yield [*run[:at], variant]


def _variant_checks(run: list[LedgerEntry]) -> Iterator[tuple[int, int]]:
    """:func:`_check_run` of each of :func:`_with_variants`' runs, the common prefix folded once
    (the folds are pure: each variant is folded onto the same states; the prefix holds no
    approval decision, so only the variant is checked)."""
    at = _first_decision(run)
    if at is None:
        return
    states: list[Any] = [None, None, None]
    assert _fold_checked(states, run[:at]) == (0, 0)
    for variant in _variants(run[at]):
        yield _fold_checked(list(states), [variant])


def test_simulated_runs_every_decision_shape_one_answer() -> None:
    runs = list(itertools.islice(simulate_runs(2, RUNS, seed=28), RUNS))
    checked = sum(_check_run(run)[0] for run in runs)
    variants = [checks for run in runs for checks in _variant_checks(run)]
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


# -- a provider response counts once ------------------------------------------------------------


def _responses_agree(entries: list[LedgerEntry]) -> tuple[int, int]:
    """Fold the run through the four projections that count model calls; at each entry with
    usage, the calls cost-metrics counted are the timeline's new model-call rows, the failure
    classifier's latest call moves to the entry exactly when one was counted, and context
    manifests count a repeat exactly when none was. Returns (calls counted, repeats)."""
    projections: list[Projection[Any]] = [
        CostMetricsProjection(),
        DiffTimelinesProjection(),
        FailureClassifications(),
        ContextManifestsProjection(),
    ]
    states: list[Any] = [None] * 4
    counted = repeats = 0
    for entry in entries:
        before = list(states)
        for i, p in enumerate(projections):
            if states[i] is None:
                states[i] = p.initial(entry)
            if p.accepts(entry):
                states[i] = p.fold(states[i], entry)
        usages = [p for p in entry.parts if isinstance(p, ModelUsagePart)]
        if not usages or before[0] is None:
            continue
        cost, timeline, failures, context = states
        new = len(cost.seen_keys) - len(before[0].seen_keys)
        counted += new
        repeats += len(usages) - new
        added = timeline.rows_total - before[1].rows_total
        model_rows = [
            r for r in timeline.rows[len(timeline.rows) - added :] if r.kind == "model-call"
        ]
        assert len(model_rows) == new, entry.entry_id
        latest = failures.evidence.last_model_call
        assert (latest is not None and latest.entry_id == entry.entry_id) == (new > 0)
        if entry.kind is EntryKind.MODEL_CALL and entry.entry_id not in (
            context.model_calls_without_context
        ):
            repeated = context.duplicate_model_calls - before[3].duplicate_model_calls
            assert repeated == (1 if new == 0 else 0), entry.entry_id
    return counted, repeats


def _repeated(run: list[LedgerEntry], with_ids: bool) -> list[LedgerEntry]:
    """The run with each model call reported again right after it under a new entry id, as
    publishers and logs repeat them: with its response ids (the same response: counted once), or
    with every response id taken away from both (two calls that look alike: each counted)."""
    out: list[LedgerEntry] = []
    for entry in run:
        if entry.kind is EntryKind.MODEL_CALL:
            if not with_ids:
                parts = [
                    p.model_copy(update={"provider_response_id": None})
                    if isinstance(p, ModelUsagePart)
                    else p
                    for p in entry.parts
                ]
                entry = entry.model_copy(update={"parts": parts})
            out += [entry, entry.model_copy(update={"entry_id": f"{entry.entry_id}-again"})]
        else:
            out.append(entry)
    return [e.model_copy(update={"sequence_no": i + 1}) for i, e in enumerate(out)]


def test_simulated_runs_count_each_response_once_everywhere() -> None:
    runs = list(itertools.islice(simulate_runs(2, RUNS, seed=29), RUNS))
    counted = sum(_responses_agree(run)[0] for run in runs)
    assert counted > RUNS  # the simulated runs do call models
    same = [_responses_agree(_repeated(run, with_ids=True)) for run in runs[:150]]
    alike = [_responses_agree(_repeated(run, with_ids=False)) for run in runs[150:300]]
    assert sum(r for _, r in same) > 150  # each repeat seen as one, everywhere
    assert sum(c for c, _ in alike) > 300 and sum(r for _, r in alike) == 0


@pytest.mark.parametrize("pack", [SAMPLES, SAMPLES2], ids=["samples", "samples2"])
def test_sample_logs_count_each_response_once_everywhere(pack: Path) -> None:
    auto = AutoImporter()
    counted = 0
    for path in auto.discover([pack]):
        try:
            imported, _ = auto.import_file(path, "agree", settled=True)
        except ImportFormatError:
            continue
        counted += sum(_responses_agree(run.entries)[0] for run in imported)
    assert counted > 10
