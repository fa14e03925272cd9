"""Context manifests as deltas (schema v2): they resolve to the whole manifest they stand for,
both kinds fold alike, and a long run's ledger grows with its length, not its square."""

from __future__ import annotations

import json
import random
from typing import Any

from infra.settings import Settings
from projectors.base import Projection, fold_all
from projectors.context_manifests import BAD_DELTA, ContextManifestsProjection
from projectors.registry import all_projections
from schemas.codec import LedgerCodec
from schemas.context_delta import delta_part, resolve
from schemas.factory import EntryBuilder
from schemas.models import (
    ContextItem,
    ContextItemKind,
    ContextItemsPart,
    EntryKind,
    LedgerEntry,
    TrustLevel,
    Visibility,
)
from streams.publisher import AsyncPublisher
from streams.simulate import simulate_runs


def _item(n: int) -> ContextItem:
    return ContextItem(
        item_kind=ContextItemKind.CONVERSATION_TURN,
        source_entry_id=f"e{n}",
        trust_level=TrustLevel.MODEL_GENERATED,
        visibility=Visibility.MODEL_VISIBLE,
        sha256=f"{n:064x}",
        tokens=n + 1,
    )


def test_a_delta_resolves_to_the_manifest_it_stands_for() -> None:
    rng = random.Random(2)
    for _ in range(300):
        base = [_item(rng.randrange(50)) for _ in range(rng.randrange(0, 30))]
        kept = [i for i in base if rng.random() < 0.7]
        if rng.random() < 0.2:
            rng.shuffle(kept)
        items = kept + [_item(100 + rng.randrange(50)) for _ in range(rng.randrange(0, 8))]
        part = delta_part("ctx-1", base, items)
        whole, problem = resolve(("ctx-1", tuple(base)), [part])
        assert problem is None and list(whole) == items
        if part.base_entry_id is not None:
            assert len(part.items) <= len(items)


def test_a_delta_of_another_entry_is_flagged_and_only_its_own_items_known() -> None:
    part = ContextItemsPart(items=(_item(9),), base_entry_id="ctx-0", removed_items=(0,))
    whole, problem = resolve(("ctx-1", (_item(1), _item(2))), [part])
    assert whole == (_item(9),) and problem is not None and "ctx-0" in problem
    _, beyond = resolve(("ctx-0", (_item(1),)), [part.model_copy(update={"removed_items": (5,)})])
    assert beyond is not None and "beyond" in beyond

    b = EntryBuilder("run-d")
    b.add(EntryKind.USER_TASK)
    b.add(EntryKind.CONTEXT_PROJECTED, (part,))
    state = fold_all(ContextManifestsProjection(), b.entries)
    assert state is not None
    [manifest] = state.manifests
    assert [v.code for v in manifest.violations][:1] == [BAD_DELTA]


def _runs(deltas: bool) -> list[list[LedgerEntry]]:
    return list(simulate_runs(1, 3, 21, entries_per_run=400, context_deltas=deltas))


def _history(p: Projection[Any], run: list[LedgerEntry]) -> list[object]:
    state = None
    out: list[object] = []
    for e in run:
        before = state
        state = p.initial(e) if state is None else state
        if p.accepts(e):
            state = p.fold(state, e)
            out += [(h.kind, h.key, h.doc) for h in p.history(before, state, e)]
    return out


def test_both_kinds_fold_to_the_same_states_and_history() -> None:
    with_deltas, whole = _runs(True), _runs(False)
    assert any(
        p.base_entry_id for e in with_deltas[0] for p in e.parts if isinstance(p, ContextItemsPart)
    )
    for p in all_projections():
        for a, b in zip(with_deltas, whole, strict=True):
            sa, sb = fold_all(p, a), fold_all(p, b)
            assert sa is not None and sb is not None
            assert json.loads(p.to_json(sa)) == json.loads(p.to_json(sb)), p.name

            assert _history(p, a) == _history(p, b), p.name


def test_with_deltas_a_long_runs_ledger_grows_with_its_length() -> None:
    codec = LedgerCodec()

    def per_entry(length: int, deltas: bool) -> float:
        [run] = list(simulate_runs(1, 1, 4, entries_per_run=length, context_deltas=deltas))
        return sum(len(codec.encode(e)) for e in run) / len(run)

    short, long = per_entry(300, True), per_entry(3_000, True)
    assert long <= 1.5 * short, (short, long)
    assert per_entry(3_000, False) >= 4 * long  # whole manifests: the square of the length


def test_the_publisher_sends_deltas_of_what_it_sent_for_the_run() -> None:
    settings = Settings()
    b = EntryBuilder("run-p")
    b.add(EntryKind.USER_TASK)
    first = b.add(EntryKind.CONTEXT_PROJECTED, (ContextItemsPart(items=(_item(1), _item(2))),))
    second = b.add(EntryKind.CONTEXT_PROJECTED, (ContextItemsPart(items=(_item(2), _item(3))),))
    publisher = AsyncPublisher(settings)
    staged = [publisher.stage(e) for e in b.entries]
    [part] = staged[2].entry.parts
    assert isinstance(part, ContextItemsPart)
    assert (part.base_entry_id, part.removed_items, part.items) == (
        first.entry_id,
        (0,),
        (_item(3),),
    )
    # a publisher that did not send the run's previous manifest sends a whole one
    fresh = AsyncPublisher(settings)
    fresh.stage(b.entries[0])
    [whole] = fresh.stage(second.model_copy(update={"sequence_no": 2})).entry.parts
    assert isinstance(whole, ContextItemsPart) and whole.base_entry_id is None
    off = AsyncPublisher(settings, context_deltas=False)
    off.stage(b.entries[0])
    off.stage(first)
    [kept] = off.stage(second).entry.parts
    assert isinstance(kept, ContextItemsPart) and kept.base_entry_id is None
    # what the worker folds from the deltas equals the whole manifests
    sent = [p.entry for p in staged]
    a = fold_all(ContextManifestsProjection(), sent)
    c = fold_all(ContextManifestsProjection(), b.entries)
    assert a is not None and c is not None and a.manifests == c.manifests
