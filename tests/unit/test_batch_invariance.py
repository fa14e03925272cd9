"""Every projection gives the same document however the engine's batches fall.

The engine folds a run's entries of one batch, calls ``finish``, stores the document as jsonb
(PostgreSQL sorts object keys: shorter first, then bytewise) and reloads it for the next batch.
A projection whose result depends on where batches fall, or on the key order of a stored dict,
would make live builds differ from their rebuilds.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from projectors.base import Projection, fold_all
from projectors.registry import all_projections
from schemas.models import LedgerEntry
from streams.simulate import simulate_runs

RUNS = list(simulate_runs(2, 28, seed=31))


def _as_jsonb(value: Any) -> Any:
    """What a jsonb round trip does to a JSON value's object key order."""
    if isinstance(value, dict):
        return {
            k: _as_jsonb(value[k])
            for k in sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        }
    if isinstance(value, list):
        return [_as_jsonb(v) for v in value]
    return value


def _batched(
    p: Projection[Any], run: list[LedgerEntry], rng: random.Random, keep: float = 0.0
) -> tuple[bytes, list[Any]]:
    """The document and history rows after folding ``run`` in random batches.

    After each batch the state is reloaded from its stored document, or (with probability
    ``keep``) kept as the object it is, as the engine's state cache does.
    """
    state: Any = None
    history: list[Any] = []
    i = 0
    while i < len(run):
        size = rng.randint(1, 9)
        for entry in run[i : i + size]:
            state = state if state is not None else p.initial(entry)
            if p.accepts(entry):
                before, state = state, p.fold(state, entry)
                history += [
                    orjson.loads(orjson.dumps(h.doc)) for h in p.history(before, state, entry)
                ]
        state = p.finish(state)
        if rng.random() >= keep:
            state = p.from_doc(_as_jsonb(orjson.loads(p.to_json(state))))
        i += size
    return p.to_json(state), history


@pytest.mark.parametrize("projection", all_projections(), ids=lambda p: p.name)
def test_random_batches_and_jsonb_round_trips_change_nothing(projection: Projection[Any]) -> None:
    rng = random.Random(projection.name)
    for run in RUNS:
        whole = fold_all(projection, run)
        assert whole is not None
        expected = orjson.loads(projection.to_json(whole))
        for _ in range(2):
            assert orjson.loads(_batched(projection, run, rng)[0]) == expected, run[0].run_id


@pytest.mark.parametrize("projection", all_projections(), ids=lambda p: p.name)
def test_kept_states_and_reloaded_states_fold_alike(projection: Projection[Any]) -> None:
    """The engine keeps recent runs' states in memory instead of reloading their documents:
    the documents and history rows must not tell which batches were reloaded."""
    for run in RUNS:
        reloaded = _batched(projection, run, random.Random(7), keep=0.0)
        for keep in (0.5, 1.0):
            doc, history = _batched(projection, run, random.Random(7), keep=keep)
            assert orjson.loads(doc) == orjson.loads(reloaded[0]), run[0].run_id
            assert history == reloaded[1], run[0].run_id


@pytest.mark.parametrize("projection", all_projections(), ids=lambda p: p.name)
def test_folds_never_change_the_state_they_were_given(projection: Projection[Any]) -> None:
    """A kept state is folded again after later batches (and on a retried batch): a fold or
    finish that changed its input in place would corrupt it."""
    for run in RUNS[:8]:
        state: Any = None
        for entry in run:
            state = state if state is not None else projection.initial(entry)
            if not projection.accepts(entry):
                continue
            snapshot = projection.to_json(state)
            after = projection.fold(state, entry)
            projection.history(state, after, entry)
            assert projection.to_json(state) == snapshot, (run[0].run_id, entry.sequence_no)
            folded = projection.to_json(after)
            projection.finish(after)
            assert projection.to_json(after) == folded, (run[0].run_id, entry.sequence_no)
            state = after


def test_state_parts_made_without_validation_list_every_field_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Folds build their state parts with ``QuickCopy.made`` (no validation): a field left out
    would be silently missing from the document, and a document lists fields in ``__dict__``
    order, so every call must give every field in the model's order."""
    from projectors.base import QuickCopy

    made = QuickCopy.made.__func__  # type: ignore[attr-defined]
    seen: set[str] = set()

    def checked(cls: Any, /, **values: Any) -> Any:
        assert list(values) == list(cls.model_fields), cls.__name__
        seen.add(cls.__name__)
        return made(cls, **values)

    monkeypatch.setattr(QuickCopy, "made", classmethod(checked))
    for projection in all_projections():
        for run in RUNS[:12]:
            fold_all(projection, run)
    assert {"CallCost", "CostTotals", "TimelineRow", "DiffSnapshot", "Ref", "RunStats"} <= seen


@pytest.mark.parametrize("projection", all_projections(), ids=lambda p: p.name)
def test_documents_made_from_kept_json_are_pydantics_bytes(projection: Projection[Any]) -> None:
    """Checkpoints and history rows are spliced from JSON made once per item object
    (context-manifests) or made by pydantic's serializer (history rows given as JSON): the
    bytes must be what pydantic writes for the whole state and what orjson writes for the
    row's document."""
    for run in RUNS[:10]:
        state: Any = None
        for n, entry in enumerate(run):
            state = state if state is not None else projection.initial(entry)
            if not projection.accepts(entry):
                continue
            before, state = state, projection.fold(state, entry)
            for row in projection.history(before, state, entry):
                assert row.json == orjson.dumps(row.doc), (run[0].run_id, entry.sequence_no)
            if n % 5 == 0 or n == len(run) - 1:
                state = projection.finish(state)
                whole = state.__pydantic_serializer__.to_json(state)
                assert projection.to_json(state) == whole, (run[0].run_id, entry.sequence_no)
