"""A read-only mapping whose copy-with-changes costs what changed, not what it holds (issue 25).

Fold states are immutable: a fold step that adds a key to a state's dict copies the dict. The
working memory's evidence index holds every entry id of the run, so copying it at every entry
made a run's folds quadratic in its length (at 10,000 entries, ~25 us an entry for the copy and
~13 us more to free it, in each of the two projections that keep a working memory).

:class:`Layered` is a shared ``base`` dict that is never changed and a small ``top`` dict of the
keys set since; :meth:`Layered.updated` copies only ``top`` and folds it into a new base once
it holds more than :data:`TOP_LIMIT` keys (``base`` copied then, so every ``TOP_LIMIT`` steps
instead of every step). It reads, iterates, compares and serializes exactly as the dict it
stands for: keys in first-insertion order, a key set again keeps its place. Pydantic fields
take it as ``Annotated[Layered[K, V], LayeredDict(dict[K, V])]``: validated from a dict (or a
mapping) and serialized as that dict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

TOP_LIMIT = 128  # keys set since the base was made, before they are folded into a new base


class Layered(Mapping[K, V], Generic[K, V]):
    """An immutable mapping: ``base`` (shared, never changed) overlaid by ``top``."""

    __slots__ = ("_base", "_top")

    def __init__(self, base: dict[K, V] | None = None, top: dict[K, V] | None = None) -> None:
        self._base: dict[K, V] = base if base is not None else {}
        self._top: dict[K, V] = top if top is not None else {}

    @classmethod
    def of(cls, values: Mapping[K, V]) -> Layered[K, V]:
        """The mapping ``values`` (a Layered is returned as it is: it is never changed)."""
        if isinstance(values, Layered):
            return values
        return cls(dict(values))

    def updated(self, changes: Mapping[K, V]) -> Layered[K, V]:
        """This mapping with ``changes`` set (self when there are none)."""
        if not changes:
            return self
        top = {**self._top, **changes}
        if len(top) > TOP_LIMIT:
            return Layered({**self._base, **top})
        return Layered(self._base, top)

    def as_dict(self) -> dict[K, V]:
        """The dict this mapping stands for (a new one; its keys in the same order)."""
        if not self._top:
            return self._base.copy()
        return {**self._base, **self._top}

    def __getitem__(self, key: K) -> V:
        top = self._top
        if key in top:
            return top[key]
        return self._base[key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | T, /) -> V | T: ...
    def get(self, key: K, default: Any = None, /) -> Any:
        top = self._top
        if key in top:
            return top[key]
        return self._base.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._top or key in self._base

    def __iter__(self) -> Iterator[K]:
        base = self._base
        yield from base
        for key in self._top:
            if key not in base:
                yield key

    def __len__(self) -> int:
        base = self._base
        return len(base) + sum(1 for key in self._top if key not in base)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, Layered):
            if other._base is self._base and other._top == self._top:
                return True
            return self.as_dict() == other.as_dict()
        if isinstance(other, Mapping):
            return self.as_dict() == dict(other)
        return NotImplemented

    def __hash__(self) -> int:  # (a dict's equal is not hashable either)
        raise TypeError("unhashable type: 'Layered'")

    def __repr__(self) -> str:
        return f"Layered({self.as_dict()!r})"


class LayeredDict:
    """Pydantic's schema of a ``Layered`` field: the ``dict_type``'s, the result made a Layered,
    serialized as that dict (``Annotated[Layered[str, int], LayeredDict(dict[str, int])]``)."""

    def __init__(self, dict_type: Any) -> None:
        self.dict_type = dict_type

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        inner = handler.generate_schema(self.dict_type)
        as_dict: Callable[[Layered[Any, Any]], dict[Any, Any]] = Layered.as_dict
        return core_schema.no_info_before_validator_function(
            _plain,
            core_schema.no_info_after_validator_function(Layered.of, inner),
            serialization=core_schema.plain_serializer_function_ser_schema(
                as_dict, return_schema=inner
            ),
        )


def _plain(value: Any) -> Any:
    """A Layered given to a validator is read as its dict."""
    return value.as_dict() if isinstance(value, Layered) else value
