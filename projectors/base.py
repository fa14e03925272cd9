"""What every projection is: a named, versioned pure fold over one run's entries.

A projection imports no faust, psycopg, redis, clock or logging. The engine loads a run's state,
calls :meth:`Projection.fold` for each entry in sequence order and stores the result.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Container, Iterable, Mapping
from typing import Any, Generic, Protocol, Self, TypeVar

import orjson
from pydantic import BaseModel

from schemas.models import JsonPart, LedgerEntry, ModelUsagePart

S = TypeVar("S", bound=BaseModel)

# PostgreSQL's bigint (what the SQL views cast counts to, and the most orjson reads back exact).
BIGINT_MAX = 2**63 - 1
_COUNT_DIGITS = len(str(BIGINT_MAX))


def capped(total: int) -> int:
    """A sum of counts as a state stores it: at most :data:`BIGINT_MAX`."""
    return min(total, BIGINT_MAX)


def metadata_count(text: str | None) -> int | None:
    """A metadata value meant as a count: the decimal digits of a bigint, else None.

    (``str.isdigit`` also takes "²", which ``int`` refuses; a count past a bigint could not be
    stored, and ``int`` refuses more than 4300 digits.)
    """
    if text is None or not text.isdecimal() or len(text) > _COUNT_DIGITS:
        return None
    value = int(text)
    return value if value <= BIGINT_MAX else None


def parse_json(text: str) -> Any:
    """JSON text as ``json.loads`` reads it; None when it is not JSON or nests too deeply to
    parse (``json.loads`` then raises RecursionError, not ValueError)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def json_object(entry: LedgerEntry) -> dict[str, object]:
    """The entry's first JSON part that is an object, parsed; ``{}`` when it has none."""
    for part in entry.parts:
        if isinstance(part, JsonPart):
            value = parse_json(part.json_text)
            if isinstance(value, dict):
                return value
    return {}


def call_key(entry: LedgerEntry, index: int, part: ModelUsagePart) -> str:
    """What a provider response is counted once by: its provider response id, else the entry's
    id (``#i`` for the entry's i-th usage part after the first)."""
    if part.provider_response_id:
        return part.provider_response_id
    return entry.entry_id if index == 0 else f"{entry.entry_id}#{index}"


def new_calls(entry: LedgerEntry, seen: Container[str]) -> list[tuple[str, ModelUsagePart]]:
    """The entry's model calls a run has not counted yet, with their keys: one rule for every
    projection that counts responses ("a provider response counts once"). A usage part whose
    :func:`call_key` is in ``seen`` (the run's counted keys, or the newest of them a projection
    keeps) or earlier in the same entry is the same response reported again."""
    found: list[tuple[str, ModelUsagePart]] = []
    keys: set[str] = set()
    index = 0
    for part in entry.parts:
        if isinstance(part, ModelUsagePart):
            key = call_key(entry, index, part)
            index += 1
            if key not in seen and key not in keys:
                keys.add(key)
                found.append((key, part))
    return found


REJECTIONS = frozenset({"REJECTED", "DENIED"})


def approval_decision(entry: LedgerEntry) -> str:
    """What an approval decision decided, one answer for every projection: ``APPROVED``,
    ``REJECTED`` (a ``DENIED`` is a rejection and reads REJECTED everywhere), another word the
    entry states, or ``UNKNOWN``. From ``metadata["decision"]``, else the first JSON object part's
    ``"decision"`` (a string) or ``"approved"`` (a bool)."""
    said = entry.metadata.get("decision", "").strip().upper()
    if not said:
        doc = json_object(entry)
        if isinstance(doc.get("decision"), str):
            said = storable(str(doc["decision"])).strip().upper()
        elif isinstance(doc.get("approved"), bool):
            said = "APPROVED" if doc["approved"] else "REJECTED"
    if not said:
        return "UNKNOWN"
    return "REJECTED" if said in REJECTIONS else said


def storable(text: str) -> str:
    """``text`` with each lone surrogate (what a JSON ``\\ud800`` escape decodes to) replaced by
    U+FFFD: a state holding one cannot be serialized as UTF-8."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class Projection(Protocol, Generic[S]):
    """A fold ``(state, entry) -> state`` per run, with its JSON document form."""

    name: str
    version: int
    hot: bool  # served from Redis as well as PostgreSQL
    # members of the checkpoint document (dotted paths) that grow with the run: a store may
    # keep them in pages outside the run's row (projectors/paging.py)
    paged: tuple[str, ...]

    def accepts(self, entry: LedgerEntry) -> bool:
        """Whether :meth:`fold` needs this entry (the sequence guard sees every entry anyway)."""
        ...

    def initial(self, entry: LedgerEntry) -> S:
        """The state before the run's first entry."""
        ...

    def fold(self, state: S, entry: LedgerEntry) -> S:
        """The state after ``entry``. Pure: no I/O, no clock."""
        ...

    def finish(self, state: S) -> S:
        """Derived parts of the state, computed once after a run's entries of a batch.

        Must be a pure function of the folded state, so where batches fall never shows.
        """
        ...

    def to_doc(self, state: S) -> dict[str, Any]: ...

    def to_json(self, state: S) -> bytes:
        """:meth:`to_doc` as JSON text: what PostgreSQL and Redis store."""
        ...

    def checkpoint_json(self, state: S) -> bytes:
        """The state as the engine checkpoints it: read back only by :meth:`from_doc`, which
        takes it and :meth:`to_json`'s document alike (it may say repeats once)."""
        ...

    def checkpoint_pages(self, state: S) -> tuple[bytes, tuple[bytes, dict[str, bytes]] | None]:
        """:meth:`checkpoint_json`, and, when the projection makes it more cheaply than
        :func:`projectors.paging.split` would from that document, the same split into pages
        (else None)."""
        ...

    def from_doc(self, doc: dict[str, Any]) -> S: ...

    def whole_doc(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's document as :meth:`to_json` writes the state (what readers get)."""
        ...

    def head_json(self, state: S) -> bytes:
        """What readers of the current state are given (the SQL views, Redis): the document
        without the parts that grow with the run (kept in history rows instead), so it stays
        bounded by configuration however long the run is."""
        ...

    def history(self, before: S | None, after: S, entry: LedgerEntry) -> list[HistoryRow]:
        """Rows to keep besides the current state after applying ``entry`` (may be empty)."""
        ...


class HistoryRow:
    """One append-only row of a run's history: a snapshot version, a recorded manifest, ...

    Its document is given as ``doc``, or as ``json`` when the fold has it as JSON text already
    (pydantic's ``to_json`` of a model is orjson's of its ``model_dump(mode="json")``): what
    the stores write, made once; the other form is made when first asked for.
    """

    __slots__ = ("_doc", "_json", "key", "kind", "seq")

    def __init__(
        self,
        kind: str,
        key: str,
        seq: int,
        doc: dict[str, Any] | None = None,
        *,
        json: bytes | None = None,
    ) -> None:
        if (doc is None) == (json is None):
            raise TypeError("a history row has a doc or its JSON, one of them")
        self.kind = kind
        self.key = key
        self.seq = seq
        self._doc = doc
        self._json = json

    @property
    def doc(self) -> dict[str, Any]:
        if self._doc is None:
            self._doc = orjson.loads(self._json or b"")
        return self._doc

    @property
    def json(self) -> bytes:
        """The document as orjson writes it."""
        if self._json is None:
            self._json = orjson.dumps(self._doc)
        return self._json

    def _fields(self) -> tuple[str, str, int, dict[str, Any]]:
        return (self.kind, self.key, self.seq, self.doc)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HistoryRow):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kind, key, seq, doc = self._fields()
        return f"HistoryRow(kind={kind!r}, key={key!r}, seq={seq!r}, doc={doc!r})"


class ModelProjection(Generic[S]):
    """Stores its state as the JSON of a pydantic model; keeps no history unless overridden.

    ``unbounded`` names the fields that grow with the run (dotted for a nested model's field):
    they are left out of :meth:`head_json`.
    """

    state_type: type[S]
    unbounded: tuple[str, ...] = ()
    paged: tuple[str, ...] = ()
    # The engine records the entry id applied at each sequence number of a run for this
    # projection, and tells a repeat of an entry from a different entry sent under a number
    # already taken (a conflicting duplicate: dead-lettered, counted on the run). One projection
    # that sees every entry does it (run-stats).
    keeps_entry_ids: bool = False

    def history(self, before: S | None, after: S, entry: LedgerEntry) -> list[HistoryRow]:
        return []

    def finish(self, state: S) -> S:
        return state

    def to_doc(self, state: S) -> dict[str, Any]:
        return state.model_dump(mode="json")

    def to_json(self, state: S) -> bytes:
        if type(self).to_doc is ModelProjection.to_doc:  # the model's own serializer is faster
            return state.__pydantic_serializer__.to_json(state)
        return orjson.dumps(self.to_doc(state))

    def checkpoint_json(self, state: S) -> bytes:
        return self.to_json(state)

    def checkpoint_pages(self, state: S) -> tuple[bytes, tuple[bytes, dict[str, bytes]] | None]:
        return self.checkpoint_json(state), None

    def from_doc(self, doc: dict[str, Any]) -> S:
        return self.state_type.model_validate(doc)

    def whole_doc(self, doc: dict[str, Any]) -> dict[str, Any]:
        return doc

    def head_json(self, state: S) -> bytes:
        if not self.unbounded:
            return self.to_json(state)
        if type(self).to_doc is ModelProjection.to_doc:
            return state.__pydantic_serializer__.to_json(state, exclude=_exclusion(self.unbounded))
        doc = self.to_doc(state)
        for path in self.unbounded:
            *parents, last = path.split(".")
            node: Any = doc
            for name in parents:
                node = node.get(name) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(last, None)
        return orjson.dumps(doc)


def _exclusion(paths: tuple[str, ...]) -> dict[str, Any]:
    """``("a", "b.c")`` as pydantic's exclude argument: ``{"a": True, "b": {"c": True}}``."""
    out: dict[str, Any] = {}
    for path in paths:
        *parents, last = path.split(".")
        node = out
        for name in parents:
            node = node.setdefault(name, {})
        node[last] = True
    return out


class QuickCopy:
    """Mixin for frozen fold states: ``model_copy(update=...)`` without pydantic's general path.

    Folds copy their state a few times per entry; pydantic's ``model_copy`` goes through
    ``copy.copy`` of three attributes and costs ~5 us, this ~1 us. Same result for models with
    no private attributes and ``extra`` not ``"allow"`` (what fold states are). A copy shares
    the set of fields set with its source when the update sets no other: pydantic changes that
    set in place only when a field is assigned, which a frozen model refuses.
    """

    __slots__ = ()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        if deep:
            return super().model_copy(update=update, deep=deep)  # type: ignore[misc, no-any-return]
        source: Any = self
        new: Any = object.__new__(type(self))
        values = source.__dict__.copy()
        fields_set = source.__pydantic_fields_set__
        if update:
            values.update(update)
            if not fields_set.issuperset(update):
                fields_set = fields_set | update.keys()
        _setattr(new, "__dict__", values)
        _setattr(new, "__pydantic_fields_set__", fields_set)
        _setattr(new, "__pydantic_extra__", None)
        _setattr(new, "__pydantic_private__", None)
        return new  # type: ignore[no-any-return]

    @classmethod
    def made(cls, **values: Any) -> Self:
        """An instance from values already of its fields' types, every field given in the
        model's order (its documents list them in ``__dict__`` order): what ``model_construct``
        makes of them (nothing validated), without its general path (which costs ~3x this)."""
        fields_set = _ALL_FIELDS.get(cls)
        if fields_set is None:
            model: Any = cls
            fields_set = _ALL_FIELDS[cls] = set(model.model_fields)
        new = object.__new__(cls)
        _setattr(new, "__dict__", values)
        _setattr(new, "__pydantic_fields_set__", fields_set)
        _setattr(new, "__pydantic_extra__", None)
        _setattr(new, "__pydantic_private__", None)
        return new


_setattr = object.__setattr__
_ALL_FIELDS: dict[type, set[str]] = {}  # by model, the names of its fields (shared, never changed)


def refold(projection: Projection[S], state: S | None, entries: Iterable[LedgerEntry]) -> S | None:
    """``state`` (a checkpoint) with ``entries`` (its tail, in order) folded on, then finished:
    the state the engine had after applying them. An entry the fold rejects is skipped, as the
    engine skipped it (and dead-lettered it) when it was applied."""
    folded = False
    for entry in entries:
        before = state
        try:
            if state is None:
                state = projection.initial(entry)
            if projection.accepts(entry):
                state = projection.fold(state, entry)
        except Exception:
            state = before
        folded = True
    if state is not None and folded:
        with contextlib.suppress(Exception):  # as the engine: the folded state stands
            state = projection.finish(state)
    return state


def fold_all(projection: Projection[S], entries: list[LedgerEntry]) -> S | None:
    """The state after a run's entries, in order; what a test runs on a list."""
    state: S | None = None
    for entry in entries:
        if state is None:
            state = projection.initial(entry)
        if projection.accepts(entry):
            state = projection.fold(state, entry)
    return projection.finish(state) if state is not None else None


def projection_inputs(projection: Projection[Any]) -> dict[str, Any]:
    """The data versions a projection's results depend on besides its code version."""
    found: dict[str, Any] = {"version": projection.version}
    prices = getattr(projection, "prices", None)
    if prices is not None:
        found["price_table"] = prices.version
    taxonomy = getattr(projection, "taxonomy", None)
    if taxonomy is not None:
        found["taxonomy"] = taxonomy.version
    budget = getattr(projection, "budget", None)
    if budget is not None:
        found["context_budget"] = budget.model_dump()
    return found
