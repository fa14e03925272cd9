"""PostgreSQL side of the engine: offsets, run state and held entries, written in one transaction.

Every function takes an open async connection inside a transaction the caller owns, so a batch's
projection rows and its offsets commit together or not at all.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from typing import Any, LiteralString

import orjson
from psycopg import AsyncConnection, AsyncCursor, Connection
from psycopg.types.json import Jsonb, set_json_dumps, set_json_loads

from projectors import paging
from projectors.base import HistoryRow, Projection, refold
from projectors.stores.contract import (
    BuildKey,
    OffsetKey,
    RunRow,
    RunWrite,
    StoredHead,
    TopicPartition,
)
from projectors.stores.pg_arrays import (
    BinaryArray,
    bigint_array,
    bytea_array,
    int_array,
    text_array,
)
from schemas.codec import LedgerCodec

__all__ = [
    "BuildKey",
    "OffsetKey",
    "PostgresStore",
    "RunRow",
    "RunWrite",
    "TopicPartition",
    "from_jsonb_text",
    "to_jsonb_text",
    "use_documents",
]


# jsonb cannot hold U+0000, and real tool output has NULs (binary files, terminal codes). Stored
# documents therefore spell a NUL as the private-use character U+E000 followed by "0", and a
# U+E000 of the text as two of them: lossless, free for documents without either, and undone on
# every read through this module (readers of the SQL views see the escaped form).
_ESC = "\ue000".encode()
_TO_PG = re.compile(rb"\\\\|\\u0000|\\u[eE]000|" + re.escape(_ESC))
_FROM_PG = re.compile(re.escape(_ESC) + rb"(" + re.escape(_ESC) + rb"|0)")


def _escape(match: re.Match[bytes]) -> bytes:
    token = match.group(0)
    if token == b"\\u0000":
        return _ESC + b"0"
    if token == _ESC or token[:3] == b"\\ue" or token[:3] == b"\\uE":  # written or escaped
        return _ESC + _ESC
    return token  # an escaped backslash stays


# What _TO_PG changes is there only if one of these is: U+E000's lead byte (U+E000-U+EFFF) or
# a NUL or U+E000 escape.
_ESC_LEAD = _ESC[:1]
_MAYBE_ESCAPE = re.compile(rb"\\u[0eE]000")


def to_jsonb_text(doc: bytes) -> bytes:
    """JSON text as PostgreSQL's jsonb will take it (see above); unchanged without NULs."""
    # Most documents have none of them. A byte search (memchr) and a regex with a literal
    # prefix are ~6x faster than the four substring searches this was (CPython's search for a
    # 6-byte needle in JSON crawls), and ~8x faster than the alternation regex on the large
    # documents checkpoints and heads are.
    if _ESC_LEAD not in doc and (b"\\" not in doc or _MAYBE_ESCAPE.search(doc) is None):
        return doc
    return _TO_PG.sub(_escape, doc)


def from_jsonb_text(doc: bytes) -> bytes:
    """The JSON text a document had before :func:`to_jsonb_text`."""
    if _ESC_LEAD not in doc or _ESC not in doc:  # a byte search first: memchr
        return doc
    return _FROM_PG.sub(lambda m: _ESC if m.group(1) == _ESC else b"\\u0000", doc)


def _loads(data: bytes | bytearray | memoryview | str) -> Any:
    raw = data.encode() if isinstance(data, str) else bytes(data)
    return orjson.loads(from_jsonb_text(raw))


def _dumps(obj: Any) -> bytes:
    return to_jsonb_text(orjson.dumps(obj))


def use_documents(conn: AsyncConnection[Any] | Connection[Any]) -> None:
    """Make this connection read and write jsonb documents as this module stores them."""
    set_json_loads(_loads, conn)
    set_json_dumps(_dumps, conn)


async def lock_offsets(
    conn: AsyncConnection[Any],
    builds: Sequence[BuildKey],
    partitions: Sequence[TopicPartition],
    known: Collection[OffsetKey] = frozenset(),
) -> dict[BuildKey, dict[TopicPartition, int]]:
    """Lock the offset rows of these builds' partitions (creating them at -1) and return them.

    The row lock serializes two workers that both think they own a partition during a rebalance:
    the second sees the first's offsets once it commits, and skips what was applied. Rows are
    locked in one order (build, topic, partition) so two batches never deadlock. ``known`` rows
    exist for sure (committed earlier), so they are not inserted again.
    """
    keys = sorted({(b, tp) for b in builds for tp in partitions})
    rows = [(proj, build, t, p) for (proj, build), (t, p) in keys]
    columns = _arrays(rows, "ttti")
    async with conn.cursor() as cur:
        if any(row not in known for row in rows):
            await cur.execute(
                'INSERT INTO al_offsets (projection, build, topic, partition, "offset") '
                "SELECT *, -1 FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[]) "
                "ON CONFLICT DO NOTHING",
                columns,
            )
        await cur.execute(
            'SELECT projection, build, topic, partition, "offset" FROM al_offsets '
            "WHERE (projection, build, topic, partition) IN "
            "(SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[])) "
            "ORDER BY projection, build, topic, partition FOR UPDATE",
            columns,
        )
        out: dict[BuildKey, dict[TopicPartition, int]] = {b: {} for b in builds}
        for proj, build, t, p, o in await cur.fetchall():
            out[(proj, build)][(t, p)] = o
        return out


def _as_is(document: bytes) -> bytes:
    return document


def _document(doc: bytes | None) -> Jsonb:
    return Jsonb(to_jsonb_text(doc or b"{}"), dumps=_as_is)


_ARRAYS: dict[str, Callable[[Sequence[Any]], BinaryArray]] = {
    "t": text_array,
    "b": bytea_array,
    "q": bigint_array,
    "i": int_array,
}


def _arrays(rows: Sequence[tuple[Any, ...]], kinds: str) -> list[BinaryArray]:
    """The rows' columns as binary array parameters, one ``kinds`` letter a column: ``t``
    text (``str`` or UTF-8 ``bytes``), ``b`` bytea, ``q`` bigint, ``i`` int."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(kinds)
    assert len(columns) == len(kinds)
    return [_ARRAYS[k](c) for k, c in zip(kinds, columns, strict=True)]


async def read_offsets(
    conn: AsyncConnection[Any], projection: str, build: str, topics: Iterable[str]
) -> dict[TopicPartition, int]:
    """Stored offsets (last applied, inclusive) of every partition of these topics."""
    async with conn.cursor() as cur:
        await cur.execute(
            'SELECT topic, partition, "offset" FROM al_offsets '
            "WHERE projection = %s AND build = %s AND topic = ANY(%s)",
            (projection, build, list(topics)),
        )
        return {(t, p): o for t, p, o in await cur.fetchall()}


async def save_offsets(
    conn: AsyncConnection[Any], offsets: dict[BuildKey, dict[TopicPartition, int]]
) -> None:
    rows = [
        (proj, build, t, p, o)
        for (proj, build), by_tp in sorted(offsets.items())
        for (t, p), o in sorted(by_tp.items())
    ]
    if rows:
        await conn.execute(
            # never backwards: a writer that lost the partition (its deferred analytics
            # committing late) must not move a newer owner's position back
            'UPDATE al_offsets AS o SET "offset" = GREATEST(o."offset", v.o), updated_at = now() '
            "FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[], %b::bigint[]) "
            "AS v(projection, build, topic, partition, o) "
            "WHERE o.projection = v.projection AND o.build = v.build "
            "AND o.topic = v.topic AND o.partition = v.partition",
            _arrays(rows, "tttiq"),
        )


async def load_runs(
    conn: AsyncConnection[Any],
    wanted: Mapping[BuildKey, Sequence[str]],
    cached: Mapping[BuildKey, Mapping[str, int]] | None = None,
) -> dict[BuildKey, dict[str, RunRow]]:
    """Stored rows of these builds' runs, with the payloads of their held entries.

    ``cached`` gives, per build, the applied_seq of run states the caller holds in memory; a
    run stored at that same position comes back with ``cached=True`` and no document.
    """
    cached = cached or {}
    keys = [
        (proj, build, run_id, cached.get((proj, build), {}).get(run_id, -1))
        for (proj, build), ids in wanted.items()
        for run_id in ids
    ]
    out: dict[BuildKey, dict[str, RunRow]] = {b: {} for b in wanted}
    if not keys:
        return out
    columns = _arrays(keys, "tttq")
    async with conn.cursor() as cur:
        await cur.execute(
            "SELECT s.projection, s.build, s.run_id, s.fleet_id, s.applied_seq, s.held, "
            "CASE WHEN s.applied_seq = k.seq THEN NULL ELSE s.state END, s.applied_seq = k.seq, "
            's.topic, s."partition", coalesce(s.checkpoint_seq, s.applied_seq), '
            "s.checkpoint_bytes, s.tail_count, s.tail_bytes, s.conflicts, "
            "CASE WHEN s.pages > 0 AND s.applied_seq <> k.seq THEN "
            "(SELECT jsonb_object_agg(g.page_id, g.page) FROM al_state_pages g "
            "WHERE g.projection = s.projection AND g.build = s.build AND g.run_id = s.run_id) END "
            "FROM al_run_state s JOIN unnest(%b::text[], %b::text[], %b::text[], %b::int8[]) "
            "AS k(projection, build, run_id, seq) USING (projection, build, run_id)",
            columns,
        )
        waiting = False
        tails: list[tuple[str, str, str]] = []
        for (
            proj,
            build,
            run_id,
            fleet_id,
            seq,
            held,
            state,
            hit,
            t,
            p,
            ck,
            ck_bytes,
            n,
            size,
            conflicts,
            pages,
        ) in await cur.fetchall():
            source = None if t is None or p is None else (t, p)
            out[(proj, build)][run_id] = RunRow(
                run_id,
                fleet_id,
                seq,
                tuple(held),
                paging.join(state, pages) if pages else state,
                {},
                hit,
                source,
                ck,
                ck_bytes,
                n,
                size,
                conflicts=conflicts,
            )
            waiting = waiting or bool(held)
            if n and not hit:
                tails.append((proj, build, run_id))
        if tails:
            await cur.execute(
                "SELECT t.projection, t.build, t.run_id, t.sequence_no, t.payload "
                "FROM al_tail t JOIN unnest(%b::text[], %b::text[], %b::text[]) "
                "AS k(projection, build, run_id) USING (projection, build, run_id)",
                _arrays(tails, "ttt"),
            )
            for proj, build, run_id, seq, payload in await cur.fetchall():
                out[(proj, build)][run_id].tail_payloads[seq] = bytes(payload)
        if waiting:
            await cur.execute(
                "SELECT h.projection, h.build, h.run_id, h.sequence_no, h.payload "
                "FROM al_held h JOIN unnest(%b::text[], %b::text[], %b::text[]) "
                "AS k(projection, build, run_id) USING (projection, build, run_id)",
                columns[:3],
            )
            for proj, build, run_id, seq, payload in await cur.fetchall():
                out[(proj, build)][run_id].held_payloads[seq] = bytes(payload)
    return out


async def _append(
    cur: AsyncCursor[Any],
    into: LiteralString,
    arrays: LiteralString,
    kinds: str,
    rows: list[tuple[Any, ...]],
) -> None:
    """Insert rows into an append-only table (``table (columns)``; ``arrays`` the columns as
    typed array parameters, e.g. ``%b::text[], %b::bigint[]``, their :func:`_arrays` kinds,
    e.g. ``tq``) in one statement; a row already there stays as it is (a retried batch writes
    the same rows again)."""
    if rows:
        await cur.execute(
            "INSERT INTO " + into + " SELECT * FROM unnest(" + arrays + ") ON CONFLICT DO NOTHING",
            _arrays(rows, kinds),
        )


TAIL_ARRAYS: LiteralString = "%b::text[], %b::text[], %b::text[], %b::bigint[], %b::bytea[]"
TAIL_KINDS = "tttqb"


def id_spans(ids: Mapping[int, str]) -> list[tuple[int, list[str]]]:
    """Entry ids by sequence number as (first sequence number, consecutive ids) spans."""
    spans: list[tuple[int, list[str]]] = []
    for seq in sorted(ids):
        if spans and spans[-1][0] + len(spans[-1][1]) == seq:
            spans[-1][1].append(ids[seq])
        else:
            spans.append((seq, [ids[seq]]))
    return spans


def _array_item(text: str) -> str:
    """One element of a PostgreSQL array literal (entry ids: letters, digits and ``_.:@/+=#~-``
    only, but quoted and escaped all the same)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _text(doc: bytes | None) -> bytes:
    """A JSON document as the (UTF-8) text a ``::jsonb`` cast takes (NULs escaped, see above)."""
    return to_jsonb_text(doc or b"{}")


def _gaps(w: RunWrite) -> bytes:
    return orjson.dumps([list(g) for g in w.gaps])


def _held(w: RunWrite) -> str:
    return "{" + ",".join(map(str, w.held)) + "}"


async def _write_pages(
    cur: AsyncCursor[Any], checkpoints: list[tuple[str, str, str, dict[str, bytes]]]
) -> None:
    """The pages of these checkpoints (projectors/paging.py): their runs' pages no checkpoint
    names any more go, the new ones are added (a page already stored is the same bytes)."""
    if not checkpoints:
        return
    keep = [(p, b, r, "{" + ",".join(pages) + "}") for p, b, r, pages in checkpoints]
    await cur.execute(
        "DELETE FROM al_state_pages g USING unnest(%b::text[], %b::text[], %b::text[], "
        "%b::text[]) AS k(projection, build, run_id, keep) WHERE g.projection = k.projection "
        "AND g.build = k.build AND g.run_id = k.run_id AND g.page_id <> ALL (k.keep::text[])",
        _arrays(keep, "tttt"),
    )
    rows = [
        (p, b, r, page_id, _text(data))
        for p, b, r, pages in checkpoints
        for page_id, data in pages.items()
    ]
    if rows:
        await cur.execute(
            "INSERT INTO al_state_pages (projection, build, run_id, page_id, page) "
            "SELECT p, b, r, i, d::jsonb FROM unnest(%b::text[], %b::text[], %b::text[], "
            "%b::text[], %b::text[]) AS u(p, b, r, i, d) ON CONFLICT DO NOTHING",
            _arrays(rows, "ttttt"),
        )


async def write_runs(
    conn: AsyncConnection[Any], writes: dict[BuildKey, Sequence[RunWrite]]
) -> None:
    """Upsert every touched run of every build and move held entries: one statement per table,
    the rows as arrays (``unnest``), whatever the batch holds."""
    flat = [(proj, build, w) for (proj, build), ws in writes.items() for w in ws]
    if not flat:
        return
    # each run's head as jsonb takes it, made once: for al_run_state and the change outbox
    heads = {id(w): _text(w.head if w.head is not None else w.state) for _p, _b, w in flat}
    checkpoints = [(proj, build, w) for proj, build, w in flat if w.state is not None]
    tails = [(proj, build, w) for proj, build, w in flat if w.state is None]
    # what grows with a run leaves a large checkpoint in pages (projectors/paging.py)
    split = {
        id(w): w.split if w.split is not None else paging.split(w.state, w.paged)
        for _p, _b, w in checkpoints
        if w.state is not None
    }
    async with conn.cursor() as cur:
        if checkpoints:
            rows = [
                (
                    proj,
                    build,
                    w.run_id,
                    w.fleet_id,
                    w.applied_seq,
                    _held(w),
                    _gaps(w),
                    _text(split[id(w)][0]),
                    heads[id(w)],
                    w.source[0] if w.source else None,
                    w.source[1] if w.source else None,
                    len(w.state or b""),  # the whole checkpoint's bytes, pages included
                    w.conflicts,
                    len(split[id(w)][1]),
                )
                for proj, build, w in checkpoints
            ]
            await cur.execute(
                "INSERT INTO al_run_state (projection, build, run_id, fleet_id, applied_seq, "
                'held, gaps, state, head, topic, "partition", checkpoint_seq, checkpoint_bytes, '
                "tail_count, tail_bytes, conflicts, pages, updated_at) "
                "SELECT p, b, r, f, s, h::bigint[], g::jsonb, st::jsonb, hd::jsonb, t, pt, s, cb, "
                "0, 0, c, pg, now() FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], "
                "%b::bigint[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], "
                "%b::int[], %b::bigint[], %b::int[], %b::int[]) "
                "AS u(p, b, r, f, s, h, g, st, hd, t, pt, cb, c, pg) "
                "ON CONFLICT (projection, build, run_id) DO UPDATE SET "
                "applied_seq = EXCLUDED.applied_seq, held = EXCLUDED.held, gaps = EXCLUDED.gaps, "
                "state = EXCLUDED.state, head = EXCLUDED.head, pages = EXCLUDED.pages, "
                "topic = coalesce(al_run_state.topic, EXCLUDED.topic), "
                '"partition" = coalesce(al_run_state."partition", EXCLUDED."partition"), '
                "checkpoint_seq = EXCLUDED.checkpoint_seq, "
                "checkpoint_bytes = EXCLUDED.checkpoint_bytes, tail_count = 0, tail_bytes = 0, "
                "conflicts = al_run_state.conflicts + EXCLUDED.conflicts, updated_at = now()",
                _arrays(rows, "ttttqtttttiqii"),
            )
            await _write_pages(
                cur,
                [
                    (p, b, w.run_id, split[id(w)][1])
                    for p, b, w in checkpoints
                    # a run's pages go only with a checkpoint of a size that could have them
                    if len(w.state or b"") >= paging.PAGED_FROM_BYTES // 4
                ],
            )
            cleared = [(p, b, w.run_id) for p, b, w in checkpoints]
            await cur.execute(
                "DELETE FROM al_tail t USING unnest(%b::text[], %b::text[], %b::text[]) "
                "AS k(projection, build, run_id) WHERE t.projection = k.projection "
                "AND t.build = k.build AND t.run_id = k.run_id",
                _arrays(cleared, "ttt"),
            )
        if tails:  # the row exists: a run's first write is a checkpoint
            updates = [
                (
                    proj,
                    build,
                    w.run_id,
                    w.applied_seq,
                    _held(w),
                    _gaps(w),
                    heads[id(w)],
                    w.tail_count,
                    w.tail_bytes,
                    w.conflicts,
                )
                for proj, build, w in tails
            ]
            await cur.execute(
                "UPDATE al_run_state AS s SET applied_seq = u.s, held = u.h::bigint[], "
                "gaps = u.g::jsonb, head = u.hd::jsonb, tail_count = u.tc, tail_bytes = u.tb, "
                "conflicts = s.conflicts + u.c, updated_at = now() "
                "FROM unnest(%b::text[], %b::text[], %b::text[], %b::bigint[], %b::text[], "
                "%b::text[], %b::text[], %b::int[], %b::bigint[], %b::int[]) "
                "AS u(p, b, r, s, h, g, hd, tc, tb, c) "
                "WHERE s.projection = u.p AND s.build = u.b AND s.run_id = u.r",
                _arrays(updates, "tttqtttiqi"),
            )
            await _append(
                cur,
                "al_tail (projection, build, run_id, sequence_no, payload)",
                TAIL_ARRAYS,
                TAIL_KINDS,
                [(p, b, w.run_id, seq, data) for p, b, w in tails for seq, data in w.tail.items()],
            )
        await _append(
            cur,
            "al_held (projection, build, run_id, sequence_no, payload)",
            TAIL_ARRAYS,
            TAIL_KINDS,
            [(p, b, w.run_id, seq, data) for p, b, w in flat for seq, data in w.hold.items()],
        )
        history = [
            (p, b, w.run_id, h.kind, h.key, h.seq, to_jsonb_text(h.json))
            for p, b, w in flat
            for h in w.history
        ]
        if history:
            await cur.execute(
                "INSERT INTO al_history (projection, build, run_id, kind, key, seq, doc) "
                "SELECT p, b, r, k, key, s, d::jsonb FROM unnest(%b::text[], %b::text[], "
                "%b::text[], %b::text[], %b::text[], %b::bigint[], %b::text[]) "
                "AS u(p, b, r, k, key, s, d) ON CONFLICT DO NOTHING",
                _arrays(history, "tttttqt"),
            )
        spans = [
            (p, b, w.run_id, first, "{" + ",".join(_array_item(i) for i in ids) + "}")
            for p, b, w in flat
            for first, ids in id_spans(w.entry_ids)
        ]
        if spans:
            await cur.execute(
                # written once: a span whose first number a stored span covers stays out (the
                # engine writes a number's id only when it applies it, so spans never overlap)
                "INSERT INTO al_entry_id_spans (projection, build, run_id, first_seq, ids) "
                "SELECT p, b, r, f, i::text[] FROM unnest(%b::text[], %b::text[], %b::text[], "
                "%b::bigint[], %b::text[]) AS u(p, b, r, f, i) WHERE NOT EXISTS (SELECT 1 FROM "
                "(SELECT first_seq, ids FROM al_entry_id_spans o WHERE o.projection = u.p "
                "AND o.build = u.b AND o.run_id = u.r AND o.first_seq <= u.f "
                "ORDER BY o.first_seq DESC LIMIT 1) o "
                "WHERE u.f < o.first_seq + cardinality(o.ids)) ON CONFLICT DO NOTHING",
                _arrays(spans, "tttqt"),
            )
        await _outbox(cur, [(p, b, w, heads[id(w)]) for p, b, w in flat if w.publish])
        releases = [(proj, build, w.run_id, seq) for proj, build, w in flat for seq in w.release]
        if releases:
            await cur.execute(
                "DELETE FROM al_held h USING unnest(%b::text[], %b::text[], %b::text[], "
                "%b::bigint[]) AS k(p, b, r, s) WHERE h.projection = k.p AND h.build = k.b "
                "AND h.run_id = k.r AND h.sequence_no = k.s",
                _arrays(releases, "tttq"),
            )


async def _outbox(cur: AsyncCursor[Any], changed: list[tuple[str, str, RunWrite, bytes]]) -> None:
    """The change outbox rows of these keys' new heads (each given as :func:`_text` made it
    for al_run_state, kept as that text: the relay passes it on unparsed), for the builds that
    are live (the worker checked the pointer after locking the offset rows a swap locks, so this
    is the pointer the batch commits under); the relay is woken at commit."""
    if not changed:
        return
    rows = [
        (
            proj,
            build,
            w.run_id,
            w.fleet_id,
            w.applied_seq,
            len(w.held),
            _gaps(w),
            head,
            w.traceparent,
        )
        for proj, build, w, head in changed
    ]
    await cur.execute(
        "INSERT INTO al_changes (projection, build, kind, run_id, fleet_id, applied_seq, held, "
        "gaps, doc, traceparent) SELECT u.p, u.b, 'state', u.r, u.f, u.s, u.h, u.g::jsonb, "
        "u.d, u.t FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], "
        "%b::bigint[], %b::int[], %b::text[], %b::text[], %b::text[]) WITH ORDINALITY "
        "AS u(p, b, r, f, s, h, g, d, t, n) "
        "WHERE EXISTS (SELECT 1 FROM al_live l WHERE l.projection = u.p AND l.build = u.b) "
        "ORDER BY u.n",
        _arrays(rows, "ttttqittt"),
    )
    await cur.execute("SELECT pg_notify('al_changes', '')")


# A build recorded before its inputs were (workers' first builds) gets them filled in once.
RECORD_BUILD: LiteralString = (
    "INSERT INTO al_builds (projection, build, version, inputs) "
    "VALUES (%s, %s, %s, coalesce(%s, '{}'::jsonb)) "
    "ON CONFLICT (projection, build) DO UPDATE SET inputs = EXCLUDED.inputs "
    "WHERE al_builds.inputs = '{}'::jsonb"
)


async def ensure_build(
    conn: AsyncConnection[Any],
    projection: str,
    build: str,
    version: int,
    live: bool,
    inputs: dict[str, Any] | None = None,
) -> None:
    """Record the build (with the data versions it uses); with ``live``, make it the live one
    when none is yet."""
    await conn.execute(
        RECORD_BUILD, (projection, build, version, None if inputs is None else Jsonb(inputs))
    )
    if live:
        await conn.execute(
            "INSERT INTO al_live (projection, build) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (projection, build),
        )


async def live_builds(conn: AsyncConnection[Any], projections: Sequence[str]) -> dict[str, str]:
    cur = await conn.execute(
        "SELECT projection, build FROM al_live WHERE projection = ANY(%s)", (list(projections),)
    )
    return {p: b for p, b in await cur.fetchall()}


LIVE_BUILD: LiteralString = "SELECT build FROM al_live WHERE projection = %s"
POINT_LIVE: LiteralString = (
    "INSERT INTO al_live (projection, build) VALUES (%s, %s) ON CONFLICT (projection) "
    "DO UPDATE SET build = EXCLUDED.build, swapped_at = now()"
)


async def live_build(conn: AsyncConnection[Any], projection: str) -> str | None:
    cur = await conn.execute(LIVE_BUILD, (projection,))
    row = await cur.fetchone()
    return None if row is None else str(row[0])


async def iter_states(
    conn: AsyncConnection[Any], projection: str, build: str
) -> list[tuple[str, int, tuple[int, ...], list[list[int]], bytes | None]]:
    """Every run's (run_id, applied_seq, held, gaps, JSON head) of a build, to refill Redis."""
    cur = await conn.execute(
        "SELECT run_id, applied_seq, held, gaps, coalesce(head, state)::text FROM al_run_state "
        "WHERE projection = %s AND build = %s ORDER BY run_id",
        (projection, build),
    )
    return [
        (r, s, tuple(h), g, from_jsonb_text(st.encode()) if st and st != "{}" else None)
        for r, s, h, g, st in await cur.fetchall()
    ]


# --- reading a run's current state -------------------------------------------------------------

_CURRENT = (
    # the pages and the tail in the same statement as the row: one snapshot, so a checkpoint
    # committed meanwhile (which drops pages and the tail) is seen wholly or not at all
    "SELECT s.run_id, s.applied_seq, s.gaps, s.state, "
    "CASE WHEN s.tail_count > 0 THEN (SELECT array_agg(t.payload ORDER BY t.sequence_no) "
    "FROM al_tail t WHERE t.projection = s.projection AND t.build = s.build "
    "AND t.run_id = s.run_id) END, "
    "CASE WHEN s.pages > 0 THEN (SELECT jsonb_object_agg(g.page_id, g.page) "
    "FROM al_state_pages g WHERE g.projection = s.projection AND g.build = s.build "
    "AND g.run_id = s.run_id) END FROM al_run_state s "
    "WHERE s.projection = %s AND s.build = %s"
)


def current_documents(
    conn: Connection[Any],
    projection: Projection[Any],
    build: str,
    run_ids: Sequence[str] | None = None,
) -> Iterator[tuple[str, int, list[list[int]], dict[str, Any]]]:
    """Each run's (run_id, applied_seq, gaps, whole current state document) of a build, by
    run id: its checkpoint with the tail folded on (the connection must :func:`use_documents`).
    """
    codec = LedgerCodec()
    sql = _CURRENT
    params: list[Any] = [projection.name, build]
    if run_ids is not None:
        sql += " AND s.run_id = ANY(%s)"
        params.append(list(run_ids))
    with conn.cursor(name="al_current") if run_ids is None else conn.cursor() as cur:
        cur.execute(sql + " ORDER BY s.run_id", params)
        for run_id, applied_seq, gaps, doc, tail, pages in cur:
            if pages and doc:
                doc = paging.join(doc, pages)
            if tail:
                state = projection.from_doc(doc) if doc else None
                state = refold(projection, state, (codec.decode(bytes(p)) for p in tail))
                doc = orjson.loads(projection.to_json(state)) if state is not None else {}
            elif doc:
                doc = projection.whole_doc(doc)  # a checkpoint may say repeats once
            yield run_id, applied_seq, gaps, doc


# --- the store contract on PostgreSQL ----------------------------------------------------------


class PostgresTransaction:
    """:class:`~projectors.stores.contract.StoreTransaction` on one connection's transaction."""

    def __init__(self, conn: AsyncConnection[Any]) -> None:
        self.conn = conn

    async def lock_positions(
        self,
        builds: Sequence[BuildKey],
        partitions: Sequence[TopicPartition],
        known: Collection[OffsetKey] = frozenset(),
    ) -> dict[BuildKey, dict[TopicPartition, int]]:
        return await lock_offsets(self.conn, builds, partitions, known)

    async def live_builds(self, projections: Sequence[str]) -> dict[str, str]:
        # FOR SHARE until the batch commits: a swap (FOR UPDATE on these rows) waits for it,
        # even for a partition whose offset row this batch is the first to write
        cur = await self.conn.execute(
            "SELECT projection, build FROM al_live WHERE projection = ANY(%s) "
            "ORDER BY projection FOR SHARE",
            (list(projections),),
        )
        return {p: b for p, b in await cur.fetchall()}

    async def load_states(
        self,
        wanted: Mapping[BuildKey, Sequence[str]],
        cached: Mapping[BuildKey, Mapping[str, int]] | None = None,
    ) -> dict[BuildKey, dict[str, RunRow]]:
        return await load_runs(self.conn, wanted, cached)

    async def entry_ids(
        self, wanted: Mapping[BuildKey, Mapping[str, Sequence[int]]]
    ) -> dict[BuildKey, dict[str, dict[int, str]]]:
        keys = [
            (proj, build, run_id, seq)
            for (proj, build), runs in wanted.items()
            for run_id, seqs in runs.items()
            for seq in seqs
        ]
        out: dict[BuildKey, dict[str, dict[int, str]]] = {}
        if not keys:
            return out
        cur = await self.conn.execute(
            "SELECT k.p, k.b, k.r, k.s, s.ids[k.s - s.first_seq + 1] "
            "FROM unnest(%b::text[], %b::text[], %b::text[], %b::int8[]) AS k(p, b, r, s) "
            "JOIN LATERAL (SELECT first_seq, ids FROM al_entry_id_spans i "
            "WHERE i.projection = k.p AND i.build = k.b AND i.run_id = k.r "
            "AND i.first_seq <= k.s ORDER BY i.first_seq DESC LIMIT 1) s "
            "ON k.s - s.first_seq < cardinality(s.ids)",
            _arrays(keys, "tttq"),
        )
        for proj, build, run_id, seq, entry_id in await cur.fetchall():
            out.setdefault((proj, build), {}).setdefault(run_id, {})[seq] = entry_id
        return out

    async def write(
        self,
        writes: Mapping[BuildKey, Sequence[RunWrite]],
        positions: Mapping[BuildKey, Mapping[TopicPartition, int]],
    ) -> None:
        async with self.conn.pipeline():  # one round trip for every statement
            await write_runs(self.conn, dict(writes))
            await save_offsets(self.conn, {k: dict(v) for k, v in positions.items()})


class PostgresStore:
    """:class:`~projectors.stores.contract.Store` on PostgreSQL.

    The store owns its connections, one per lane (the hot batches, the analytics batches,
    position reads during a rebalance, view refills), each made on first use and after
    :meth:`reset`; a lane's work runs one transaction at a time, lanes concurrently.
    """

    def __init__(self, dsn: str, connect_timeout: float = 5) -> None:
        self.dsn = dsn
        self.connect_timeout = connect_timeout
        self._conns: dict[str, AsyncConnection[Any]] = {}

    async def connection(self, lane: str = "hot") -> AsyncConnection[Any]:
        conn = self._conns.get(lane)
        if conn is None or conn.closed:
            conn = await AsyncConnection.connect(
                self.dsn, connect_timeout=int(self.connect_timeout)
            )
            use_documents(conn)
            self._conns[lane] = conn
        return conn

    @asynccontextmanager
    async def transaction(self, lane: str = "hot") -> AsyncIterator[PostgresTransaction]:
        conn = await self.connection(lane)
        async with conn.transaction():
            yield PostgresTransaction(conn)

    async def _read(self, lane: str, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        conn = await self.connection(lane)
        try:
            cur = await conn.execute(sql, params)
            return list(await cur.fetchall())
        finally:
            await conn.rollback()

    async def read_positions(
        self, projection: str, build: str, topics: Iterable[str], lane: str = "positions"
    ) -> dict[TopicPartition, int]:
        conn = await self.connection(lane)
        try:
            return await read_offsets(conn, projection, build, topics)
        finally:
            await conn.rollback()

    async def ensure_build(
        self,
        projection: str,
        build: str,
        version: int,
        live: bool,
        lane: str = "hot",
        inputs: dict[str, Any] | None = None,
    ) -> None:
        conn = await self.connection(lane)
        async with conn.transaction():
            await ensure_build(conn, projection, build, version, live, inputs)

    async def live_build(self, projection: str, lane: str = "hot") -> str | None:
        rows = await self._read(lane, LIVE_BUILD, (projection,))
        return str(rows[0][0]) if rows else None

    async def set_live(self, projection: str, build: str, lane: str = "hot") -> None:
        conn = await self.connection(lane)
        async with conn.transaction():
            await conn.execute(POINT_LIVE, (projection, build))

    async def heads(self, projection: str, build: str, lane: str = "hot") -> list[StoredHead]:
        conn = await self.connection(lane)
        try:
            rows = await iter_states(conn, projection, build)
        finally:
            await conn.rollback()
        return [StoredHead(r, s, h, g, st) for r, s, h, g, st in rows]

    async def history(
        self, projection: str, build: str, key: str, lane: str = "hot"
    ) -> list[HistoryRow]:
        rows = await self._read(
            lane,
            "SELECT kind, key, seq, doc FROM al_history WHERE projection = %s AND build = %s "
            "AND run_id = %s ORDER BY seq, kind, key",
            (projection, build, key),
        )
        return [HistoryRow(kind, k, seq, doc) for kind, k, seq, doc in rows]

    async def tail(self, projection: str, build: str, key: str, lane: str = "hot") -> list[bytes]:
        rows = await self._read(
            lane,
            "SELECT payload FROM al_tail WHERE projection = %s AND build = %s AND run_id = %s "
            "ORDER BY sequence_no",
            (projection, build, key),
        )
        return [bytes(p) for (p,) in rows]

    async def reset(self, lane: str) -> None:
        conn = self._conns.pop(lane, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        for lane in list(self._conns):
            await self.reset(lane)
