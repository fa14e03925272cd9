"""One-dimensional array parameters made in PostgreSQL's binary array format, in one go.

The engine writes each table with one ``unnest`` statement of array parameters (a column each).
psycopg dumps a Python list element by element in Python (a dumper call, a length and two list
appends for every element): with ~40 elements for every entry applied (the tail rows of six
projections, history rows, heads) that was the largest single cost of a batch's writes. These
build the same bytes with C-level ``map``/``join``/``struct`` work, and pass them to psycopg as
one value of the array type (its dumper hands the bytes over as they are).

Text elements may be given as ``bytes``: they are sent as they are (UTF-8, as PostgreSQL's
``text`` binary input takes it), so a JSON document never becomes a ``str`` on its way out.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import repeat
from typing import cast

import psycopg
from psycopg.adapt import AdaptersMap, Dumper
from psycopg.pq import Format

__all__ = [
    "BinaryArray",
    "bigint_array",
    "bytea_array",
    "int_array",
    "register",
    "text_array",
]

_HEAD = struct.Struct(">iiiii")  # dimensions, has nulls, element oid, length, lower bound
_EMPTY = struct.Struct(">iii")
_LEN = struct.Struct(">i").pack
_NULL = b"\xff\xff\xff\xff"
_INT8 = struct.Struct(">iq").pack
_INT4 = struct.Struct(">ii").pack

TEXT_OID, BYTEA_OID, INT8_OID, INT4_OID = 25, 17, 20, 23


class BinaryArray:
    """An array parameter already in the binary format (see the ``*_array`` functions)."""

    __slots__ = ("data",)
    oid = 0

    def __init__(self, data: bytes) -> None:
        self.data = data


class TextArray(BinaryArray):
    __slots__ = ()
    oid = 1009


class ByteaArray(BinaryArray):
    __slots__ = ()
    oid = 1001


class BigintArray(BinaryArray):
    __slots__ = ()
    oid = 1016


class IntArray(BinaryArray):
    __slots__ = ()
    oid = 1007


def _varlen(elements: Sequence[bytes | None], element_oid: int) -> bytes:
    n = len(elements)
    if not n:
        return _EMPTY.pack(0, 0, element_oid)
    if None in elements:
        body = b"".join(_NULL if e is None else _LEN(len(e)) + e for e in elements)
        return _HEAD.pack(1, 1, element_oid, n, 1) + body
    present = cast("Sequence[bytes]", elements)
    parts: list[bytes] = [b""] * (2 * n + 1)
    parts[0] = _HEAD.pack(1, 0, element_oid, n, 1)
    parts[1::2] = map(_LEN, map(len, present))
    parts[2::2] = present
    return b"".join(parts)


def _fixed(elements: Sequence[int | None], element_oid: int, size: int) -> bytes:
    n = len(elements)
    if not n:
        return _EMPTY.pack(0, 0, element_oid)
    pack = _INT8 if size == 8 else _INT4
    if None in elements:
        body = b"".join(_NULL if e is None else pack(size, e) for e in elements)
        return _HEAD.pack(1, 1, element_oid, n, 1) + body
    return _HEAD.pack(1, 0, element_oid, n, 1) + b"".join(map(pack, repeat(size, n), elements))


def text_array(elements: Sequence[str | bytes | None]) -> TextArray:
    """A ``text[]``; ``bytes`` elements are UTF-8 text, sent as they are."""
    return TextArray(_varlen([e.encode() if isinstance(e, str) else e for e in elements], TEXT_OID))


def bytea_array(elements: Sequence[bytes | None]) -> ByteaArray:
    return ByteaArray(_varlen(elements, BYTEA_OID))


def bigint_array(elements: Sequence[int | None]) -> BigintArray:
    return BigintArray(_fixed(elements, INT8_OID, 8))


def int_array(elements: Sequence[int | None]) -> IntArray:
    return IntArray(_fixed(elements, INT4_OID, 4))


class _ArrayDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: BinaryArray) -> bytes:
        return obj.data


def register(adapters: AdaptersMap) -> None:
    """Make these array types dumpable on connections made from ``adapters``."""
    for cls in (TextArray, ByteaArray, BigintArray, IntArray):
        dumper = type(f"{cls.__name__}Dumper", (_ArrayDumper,), {"oid": cls.oid})
        adapters.register_dumper(cls, dumper)


register(psycopg.adapters)  # every connection made after this module is imported
