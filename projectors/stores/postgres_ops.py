"""PostgreSQL beyond the batch: readers, roll-ups, builds, verification, dead-letter bookkeeping.

With :mod:`projectors.stores.postgres` (what the engine writes in a batch) this is all the SQL
on AgentLedger's tables: the CLI, analytics, rebuilds, replay packages and the bench call these
functions, never SQL of their own. "The live build" is the join below, written once. (Infra
keeps the SQL that makes and migrates databases; the bench's naive baseline keeps its own
table.)
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from projectors.stores.postgres import LIVE_BUILD, POINT_LIVE, RECORD_BUILD, use_documents
from schemas.errors import AmbiguousRunError, BadArgumentError, NotFoundError
from schemas.models import ID_PATTERN
from schemas.shown import asked

TopicPartition = tuple[str, int]

# A run's rows in the build readers follow.
LIVE_STATE: LiteralString = "al_run_state s JOIN al_live l USING (projection, build)"
LIVE_HISTORY: LiteralString = "al_history h JOIN al_live l USING (projection, build)"


# dsn -> (the pool :func:`connect` lends from, how many holders asked for it)
_READER_POOLS: dict[str, tuple[ConnectionPool[psycopg.Connection[Any]], int]] = {}


# the connection every connect(dsn) uses inside one_connection(dsn) (this context only)
_ONE: ContextVar[tuple[str, psycopg.Connection[Any]] | None] = ContextVar("_ONE", default=None)


@contextmanager
def connect(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A reader's connection, reading documents as the store wrote them; commits on exit.
    Inside :func:`one_connection` for ``dsn``, that one (committed when it ends); else lent
    from the process's pool for ``dsn`` while one is kept (:func:`keep_connections`); else
    opened and closed."""
    one = _ONE.get()
    if one is not None and one[0] == dsn:
        yield one[1]
        return
    pooled = _READER_POOLS.get(dsn)
    if pooled is not None:
        with pooled[0].connection() as conn:
            yield conn
        return
    with psycopg.connect(dsn, **_timeout(dsn)) as conn:
        use_documents(conn)
        yield conn


CONNECT_TIMEOUT_S = 10
ID_RE = re.compile(ID_PATTERN)  # a ledger id (run, entry): schemas.models.Id


def _timeout(dsn: str) -> dict[str, Any]:
    """A reader's connect gives up after CONNECT_TIMEOUT_S (a server that does not answer, not
    only one that refuses), unless the address sets its own ``connect_timeout``."""
    return {} if "connect_timeout" in dsn else {"connect_timeout": CONNECT_TIMEOUT_S}


@contextmanager
def one_connection(
    dsn: str, commit_on: tuple[type[BaseException], ...] = ()
) -> Iterator[psycopg.Connection[Any]]:
    """Every :func:`connect` to ``dsn`` inside (in this context) uses one connection, in one
    transaction: a read of several statements pays one BEGIN and one COMMIT, not one of each
    per statement (on a busy machine each round trip waits for the server's turn). Committed
    at the end, and also when one of ``commit_on`` is raised (an answer, not a failure, e.g.
    a refused read that was counted); rolled back on any other exception."""
    with connect(dsn) as conn:
        token = _ONE.set((dsn, conn))
        try:
            yield conn
        except commit_on:
            conn.commit()
            raise
        finally:
            _ONE.reset(token)


def keep_connections(dsn: str, max_size: int = 8) -> None:
    """From now on (until as many :func:`drop_connections`), :func:`connect` to ``dsn`` lends a
    pooled connection: a long-lived reader (the MCP server) whose reads take a few ms would
    otherwise spend more than that opening connections."""
    pooled = _READER_POOLS.get(dsn)
    if pooled is None:
        pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn, min_size=1, max_size=max_size, configure=use_documents, open=True
        )
        _READER_POOLS[dsn] = (pool, 1)
    else:
        _READER_POOLS[dsn] = (pooled[0], pooled[1] + 1)


def drop_connections(dsn: str) -> None:
    """Undo one :func:`keep_connections`; the last one closes the pool."""
    pooled = _READER_POOLS.get(dsn)
    if pooled is None:
        return
    if pooled[1] > 1:
        _READER_POOLS[dsn] = (pooled[0], pooled[1] - 1)
        return
    del _READER_POOLS[dsn]
    pooled[0].close()


@asynccontextmanager
async def connect_async(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(dsn, **_timeout(dsn)) as conn:
        use_documents(conn)
        yield conn


# -- the live build ------------------------------------------------------------------------


def live_build(conn: psycopg.Connection[Any], projection: str) -> str | None:
    row = conn.execute(LIVE_BUILD, (projection,)).fetchone()
    return None if row is None else str(row[0])


def live_history_at(
    conn: psycopg.Connection[Any], projection: str, run_id: str, kind: str, seq: int
) -> tuple[Any, int, str] | None:
    """(doc, seq, key) of the newest live history row of ``kind`` at or before ``seq``."""
    row = conn.execute(
        f"SELECT h.doc, h.seq, h.key FROM {LIVE_HISTORY} "
        "WHERE h.projection = %s AND h.run_id = %s AND h.kind = %s AND h.seq <= %s "
        "ORDER BY h.seq DESC, h.key DESC LIMIT 1",
        (projection, run_id, kind, seq),
    ).fetchone()
    return None if row is None else (row[0], int(row[1]), str(row[2]))


def live_history_row(
    conn: psycopg.Connection[Any], projection: str, run_id: str, kind: str, key: str
) -> tuple[Any, int] | None:
    """(doc, seq) of one live history row."""
    row = conn.execute(
        f"SELECT h.doc, h.seq FROM {LIVE_HISTORY} "
        "WHERE h.projection = %s AND h.run_id = %s AND h.kind = %s AND h.key = %s",
        (projection, run_id, kind, key),
    ).fetchone()
    return None if row is None else (row[0], int(row[1]))


def live_history_rows(
    conn: psycopg.Connection[Any], projection: str, run_id: str, kind: str
) -> list[tuple[str, Any]]:
    """(key, doc) of every live history row of ``kind`` of a run."""
    rows = conn.execute(
        f"SELECT h.key, h.doc FROM {LIVE_HISTORY} "
        "WHERE h.projection = %s AND h.run_id = %s AND h.kind = %s ORDER BY h.seq, h.key",
        (projection, run_id, kind),
    ).fetchall()
    return [(str(k), d) for k, d in rows]


def live_run_written(
    conn: psycopg.Connection[Any], projection: str, run_id: str, stall: timedelta
) -> tuple[datetime, bool] | None:
    """When the live build last wrote the run, and whether that is longer ago than ``stall``."""
    row = conn.execute(
        f"SELECT s.updated_at, s.updated_at < now() - %s FROM {LIVE_STATE} "
        "WHERE s.projection = %s AND s.run_id = %s",
        (stall, projection, run_id),
    ).fetchone()
    return None if row is None else (row[0], bool(row[1]))


def live_applied(
    conn: psycopg.Connection[Any], projections: Sequence[str], run_ids: Sequence[str]
) -> list[tuple[str, int]]:
    """(run_id, applied_seq) of these runs in each of these projections' live builds."""
    rows = conn.execute(
        f"SELECT s.run_id, s.applied_seq FROM {LIVE_STATE} "
        "WHERE s.projection = ANY(%s) AND s.run_id = ANY(%s)",
        (list(projections), list(run_ids)),
    ).fetchall()
    return [(str(r), int(s)) for r, s in rows]


def live_versions(
    conn: psycopg.Connection[Any], projections: Sequence[str], run_id: str
) -> list[tuple[str, str, int, str]]:
    """(projection, build, applied_seq, row version) of a run in each of these projections'
    live builds: the row version (``xmin``, the transaction that last wrote the row) changes
    with every write of the run's state, whatever changed in it; a swap changes the build."""
    rows = conn.execute(
        f"SELECT s.projection, s.build, s.applied_seq, s.xmin::text FROM {LIVE_STATE} "
        "WHERE s.projection = ANY(%s) AND s.run_id = %s ORDER BY s.projection",
        (list(projections), run_id),
    ).fetchall()
    return [(str(p), str(b), int(a), str(x)) for p, b, a, x in rows]


def live_applied_totals(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Entries applied per projection's live build (summed over its runs)."""
    rows = conn.execute(
        f"SELECT s.projection, coalesce(sum(s.applied_seq), 0) FROM {LIVE_STATE} "
        "GROUP BY s.projection"
    ).fetchall()
    return {str(p): int(n) for p, n in rows}


def live_fleet_of(conn: psycopg.Connection[Any], run_id: str) -> str | None:
    """The fleet of a run, from any live build that has seen it."""
    row = conn.execute(
        f"SELECT s.fleet_id FROM {LIVE_STATE} WHERE s.run_id = %s LIMIT 1", (run_id,)
    ).fetchone()
    return None if row is None else str(row[0])


def database_bytes(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


# -- analytics roll-ups (over the views of infra/migrations/005_analytics_views.sql) ---------

COST_KEYS: dict[str, LiteralString] = {
    "run": "run_id",
    "fleet": "fleet_id",
    "model": "provider || '/' || model",
    "purpose": "purpose",
    "day": "day::text",
    "day-model": "day::text || ' ' || provider || '/' || model",  # "2026-12-01 openai/gpt-4.1"
}

_COSTS: LiteralString = """
SELECT {key} AS key,
       count(*) AS calls,
       count(*) FILTER (WHERE status <> 'OK') AS failed_calls,
       coalesce(sum(input_tokens), 0) AS input_tokens,
       coalesce(sum(cached_input_tokens), 0) AS cached_input_tokens,
       coalesce(sum(output_tokens), 0) AS output_tokens,
       coalesce(sum(reasoning_tokens), 0) AS reasoning_tokens,
       round(avg(latency_ms))::bigint AS avg_latency_ms,
       coalesce(sum(cost_usd), 0) AS cost_usd,
       count(*) FILTER (WHERE unpriced) AS unpriced_calls,
       count(provider_reported_cost_usd) AS reported_calls,
       coalesce(sum(provider_reported_cost_usd), 0) AS provider_reported_cost_usd,
       count(*) FILTER (WHERE cost_disagreement) AS cost_disagreements,
       coalesce(sum(cache_write_input_tokens), 0) AS cache_write_input_tokens,
       count(*) FILTER (WHERE cost_usd IS NULL AND NOT unpriced) AS usage_unknown_calls,
       count(latency_ms) AS latency_calls,
       count(*) FILTER (WHERE cached_input_tokens IS NULL) AS cached_unknown_calls,
       count(*) FILTER (WHERE output_tokens IS NULL) AS output_unknown_calls,
       count(*) FILTER (WHERE reasoning_tokens IS NULL) AS reasoning_unknown_calls,
       count(*) FILTER (WHERE cache_write_input_tokens IS NULL) AS cache_write_unknown_calls,
       count(*) FILTER (WHERE cost_usd IS NULL AND NOT unpriced AND input_tokens IS NOT NULL)
           AS usage_partial_calls,
       GROUPING({key}) AS is_total
FROM al_cost_calls
{where}
GROUP BY GROUPING SETS (({key}), ())
ORDER BY is_total, key
"""

_FAILURES: LiteralString = """
SELECT fleet_id, failure_class,
       count(*) FILTER (WHERE final) AS final,
       count(*) FILTER (WHERE NOT final AND updated_at >= now() - %(stall)s) AS provisional,
       count(*) FILTER (WHERE NOT final AND updated_at < now() - %(stall)s) AS stalled,
       count(*) FILTER (WHERE repair_loop) AS repair_loops,
       count(*) AS runs,
       GROUPING(fleet_id, failure_class) AS is_total
FROM al_failures
{where}
GROUP BY GROUPING SETS ((fleet_id, failure_class), ())
ORDER BY is_total, fleet_id, failure_class
"""


def _filters(
    fleet: str | None, since: datetime | None, run_ids: Sequence[str] | None, time_column: str
) -> tuple[sql.Composable, dict[str, Any]]:
    """A WHERE clause (possibly empty) and its parameters."""
    clauses: list[sql.Composable] = []
    params: dict[str, Any] = {}
    _common(clauses, params, fleet, since, run_ids, time_column)
    return _where(clauses), params


def _where(clauses: list[sql.Composable]) -> sql.Composable:
    return sql.SQL("WHERE ") + sql.SQL(" AND ").join(clauses) if clauses else sql.SQL("")


def _common(
    clauses: list[sql.Composable],
    params: dict[str, Any],
    fleet: str | None,
    since: datetime | None,
    run_ids: Sequence[str] | None,
    time_column: str,
) -> None:
    """The filters every run query shares: fleet, a time at or after ``since``, run ids."""
    if fleet is not None:
        clauses.append(sql.SQL("fleet_id = %(fleet)s"))
        params["fleet"] = fleet
    if since is not None:
        clauses.append(sql.SQL("{} >= %(since)s").format(sql.Identifier(time_column)))
        params["since"] = since
    if run_ids is not None:
        clauses.append(sql.SQL("run_id = ANY(%(runs)s)"))
        params["runs"] = list(run_ids)


def cost_rollup(
    conn: psycopg.Connection[Any],
    by: str,
    fleet: str | None,
    since: datetime | None,
    run_ids: Sequence[str] | None,
) -> list[tuple[Any, ...]]:
    """Counted calls by ``by`` (a key of :data:`COST_KEYS`), then the total row (last column:
    is_total)."""
    where, params = _filters(fleet, since, run_ids, "occurred_at")
    query = sql.SQL(_COSTS).format(key=sql.SQL(COST_KEYS[by]), where=where)
    return list(conn.execute(query, params).fetchall())


def runs_reported_only(
    conn: psycopg.Connection[Any], fleet: str | None, run_ids: Sequence[str] | None
) -> list[str]:
    """Runs of the live cost-metrics build with no counted call but totals their agent reported
    for the whole run (they have no row in al_cost_calls)."""
    clauses: list[sql.Composable] = [
        sql.SQL("coalesce(calls, 0) = 0"),
        sql.SQL("(reported_cost_usd IS NOT NULL OR reported_input_tokens IS NOT NULL)"),
    ]
    params: dict[str, Any] = {}
    _common(clauses, params, fleet, None, run_ids, "last_at")
    query = sql.SQL("SELECT run_id FROM al_cost_runs {} ORDER BY run_id").format(_where(clauses))
    rows = conn.execute(query, params).fetchall()
    return [str(r[0]) for r in rows]


def runs_calls_unknown(
    conn: psycopg.Connection[Any],
    fleet: str | None,
    since: datetime | None,
    run_ids: Sequence[str] | None,
) -> list[tuple[str, str]]:
    """``(run_id, fleet_id)`` of the runs of the live cost-metrics build whose log keeps no
    usage at all (no counted call; how many calls they made is unknown: they have no row in
    al_cost_calls), by run id; ``since``: only those whose last entry is at or after it (their
    calls' times are unknown, so any run still going then), and those whose times are unknown
    (run-stats' time_unknown: they may be in the window)."""
    rows = conn.execute(
        f"SELECT DISTINCT s.run_id, s.fleet_id FROM {LIVE_STATE} "
        "WHERE s.projection = 'cost-metrics' "
        "AND coalesce(s.head, s.state) ->> 'calls_unknown' = 'true' "
        "AND coalesce((coalesce(s.head, s.state) -> 'totals' ->> 'calls')::integer, 0) = 0 "
        "AND (%(fleet)s::text IS NULL OR s.fleet_id = %(fleet)s) "
        "AND (%(runs)s::text[] IS NULL OR s.run_id = ANY(%(runs)s)) "
        "AND (%(since)s::timestamptz IS NULL OR EXISTS (SELECT 1 FROM al_run_list r "
        "WHERE r.run_id = s.run_id AND r.build = "
        + _LIVE.format("run-stats")
        + " AND (r.last_at >= %(since)s OR r.last_at IS NULL))) ORDER BY s.run_id",
        {"fleet": fleet, "since": since, "runs": None if run_ids is None else list(run_ids)},
    ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def run_budgets(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
    """(run_id, fleet_id, task_budget_usd, over_budget, reported_cost_usd, reported_input_tokens,
    reported_output_tokens, reported_disagrees) of these runs."""
    rows = conn.execute(
        "SELECT run_id, fleet_id, task_budget_usd, over_budget, reported_cost_usd, "
        "reported_input_tokens, reported_output_tokens, coalesce(reported_disagrees, false) "
        "FROM al_cost_runs WHERE run_id = ANY(%s)",
        (list(run_ids),),
    ).fetchall()
    return [tuple(r) for r in rows]


def failure_rollup(
    conn: psycopg.Connection[Any],
    fleet: str | None,
    since: datetime | None,
    run_ids: Sequence[str] | None,
    stall: timedelta,
) -> list[tuple[Any, ...]]:
    """Runs by fleet and failure class, then the total row (last column: is_total)."""
    where, params = _filters(fleet, since, run_ids, "last_at")
    params["stall"] = stall
    return list(conn.execute(sql.SQL(_FAILURES).format(where=where), params).fetchall())


def failures_untimed(
    conn: psycopg.Connection[Any], fleet: str | None, run_ids: Sequence[str] | None
) -> int:
    """How many runs of the live failure-classifications build have no entry time (run-stats'
    time_unknown): a window of time can neither hold nor leave them out."""
    clauses: list[sql.Composable] = [sql.SQL("last_at IS NULL")]
    params: dict[str, Any] = {}
    _common(clauses, params, fleet, None, run_ids, "last_at")
    query = sql.SQL("SELECT count(*) FROM al_failures {}").format(_where(clauses))
    row = conn.execute(query, params).fetchone()
    return int(row[0]) if row else 0


def failure_days(
    conn: psycopg.Connection[Any], fleet: str | None, since: datetime | None
) -> list[tuple[str, str, int]]:
    """(day of the run's last entry, UTC; failure class; runs), by day then class: the failure
    classes over time (runs with no entry time are left out)."""
    where, params = _filters(fleet, since, None, "last_at")
    query = sql.SQL(
        "SELECT to_char(last_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, "
        "coalesce(failure_class, 'unclassified'), count(*) "
        "FROM (SELECT * FROM al_failures WHERE last_at IS NOT NULL) f {where} "
        "GROUP BY 1, 2 ORDER BY 1, 2"
    ).format(where=where)
    return [(str(d), str(c), int(n)) for d, c, n in conn.execute(query, params).fetchall()]


def run_cost_calls(conn: psycopg.Connection[Any], run_id: str) -> list[tuple[Any, ...]]:
    """(call_key, response_id, entry_id, cost_usd, unpriced) of a run's counted calls."""
    return list(
        conn.execute(
            "SELECT call_key, response_id, entry_id, cost_usd, unpriced FROM al_cost_calls "
            "WHERE run_id = %s ORDER BY seq, call_key",
            (run_id,),
        ).fetchall()
    )


# -- builds --------------------------------------------------------------------------------


def ensure_live_build(
    conn: psycopg.Connection[Any],
    projection: str,
    build: str,
    version: int,
    inputs: dict[str, Any] | None = None,
) -> tuple[str, int]:
    """Record ``build`` (with the data versions it uses) and make it live if the projection has
    no live build; returns the live build and the code version that made it."""
    conn.execute(
        RECORD_BUILD, (projection, build, version, None if inputs is None else Jsonb(inputs))
    )
    conn.execute(
        "INSERT INTO al_live (projection, build) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (projection, build),
    )
    row = conn.execute(
        "SELECT l.build, b.version FROM al_live l "
        "JOIN al_builds b USING (projection, build) WHERE projection = %s",
        (projection,),
    ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def insert_build(
    conn: psycopg.Connection[Any],
    projection: str,
    build: str,
    version: int,
    origin: str,
    start_spec: str,
    whole_runs_only: bool,
    inputs: dict[str, Any],
    offsets: dict[TopicPartition, int],
) -> None:
    """Record a new build and the offsets it starts after."""
    conn.execute(
        "INSERT INTO al_builds (projection, build, version, origin, start_spec, "
        "whole_runs_only, inputs) VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (projection, build, version, origin, start_spec, whole_runs_only, Jsonb(inputs)),
    )
    with conn.cursor() as cur:
        cur.executemany(
            'INSERT INTO al_offsets (projection, build, topic, partition, "offset") '
            "VALUES (%s, %s, %s, %s, %s)",
            [(projection, build, t, p, o) for (t, p), o in sorted(offsets.items())],
        )


def build_names(conn: psycopg.Connection[Any], projection: str, prefix: str) -> list[str]:
    rows = conn.execute(
        "SELECT build FROM al_builds WHERE projection = %s AND build LIKE %s",
        (projection, prefix + "%"),
    ).fetchall()
    return [str(r[0]) for r in rows]


def delete_build(conn: psycopg.Connection[Any], projection: str, build: str) -> None:
    """Every row of a build: its runs, their rows, its offsets, the build itself."""
    tables = (
        "al_run_state",
        "al_state_pages",
        "al_history",
        "al_held",
        "al_tail",
        "al_entry_id_spans",
        "al_offsets",
    )
    for table in (*tables, "al_builds"):
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE projection = %s AND build = %s").format(
                sql.Identifier(table)
            ),
            (projection, build),
        )


def build_rows(conn: psycopg.Connection[Any], projection: str | None) -> list[tuple[Any, ...]]:
    """(projection, build, version, created_at, origin, start_spec, live, inputs, runs) of
    every build (of one projection), oldest first."""
    return list(
        conn.execute(
            "SELECT b.projection, b.build, b.version, b.created_at, b.origin, b.start_spec, "
            "l.build IS NOT NULL, b.inputs, "
            "(SELECT count(*) FROM al_run_state s WHERE s.projection = b.projection "
            " AND s.build = b.build) "
            "FROM al_builds b LEFT JOIN al_live l USING (projection, build) "
            "WHERE %s::text IS NULL OR b.projection = %s "
            "ORDER BY b.projection, b.created_at",
            (projection, projection),
        ).fetchall()
    )


def record_verdict(
    conn: psycopg.Connection[Any],
    projection: str,
    build: str,
    equal: bool,
    runs: int,
    differences: Sequence[str],
) -> None:
    """What a verify of the live ``build`` found (al_verify_verdicts, migration 021)."""
    conn.execute(
        "INSERT INTO al_verify_verdicts (projection, build, equal, runs, differences) "
        "VALUES (%s, %s, %s, %s, %s)",
        (projection, build, equal, runs, Jsonb(list(differences))),
    )


def last_verdicts(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(projection, build) -> the newest verify verdict of that build: ``verified_at``,
    ``equal``, ``runs``, ``differences``."""
    rows = conn.execute(
        "SELECT DISTINCT ON (projection, build) projection, build, verified_at, equal, runs, "
        "differences FROM al_verify_verdicts ORDER BY projection, build, verified_at DESC"
    ).fetchall()
    return {
        (str(p), str(b)): {"verified_at": at, "equal": eq, "runs": n, "differences": diff}
        for p, b, at, eq, n, diff in rows
    }


def offsets(
    conn: psycopg.Connection[Any], projection: str, build: str, lock: bool = False
) -> dict[TopicPartition, int]:
    """A build's stored offsets (with ``lock``, locked until the transaction ends)."""
    query = (
        'SELECT topic, partition, "offset" FROM al_offsets WHERE projection = %s AND build = %s '
        "ORDER BY topic, partition"
    )
    rows = conn.execute(query + (" FOR UPDATE" if lock else ""), (projection, build)).fetchall()
    return {(str(t), int(p)): int(o) for t, p, o in rows}


def live_offsets(conn: psycopg.Connection[Any]) -> dict[str, dict[TopicPartition, int]]:
    """Every live build's stored offsets (last applied, inclusive), by projection."""
    rows = conn.execute(
        'SELECT o.projection, o.topic, o.partition, o."offset" FROM al_offsets o '
        "JOIN al_live l USING (projection, build) ORDER BY 1, 2, 3"
    ).fetchall()
    found: dict[str, dict[TopicPartition, int]] = {}
    for projection, topic, partition, offset in rows:
        found.setdefault(str(projection), {})[(str(topic), int(partition))] = int(offset)
    return found


def lock_live(conn: psycopg.Connection[Any], projection: str) -> str | None:
    """The live build, its pointer locked until the transaction ends."""
    row = conn.execute(
        "SELECT build FROM al_live WHERE projection = %s FOR UPDATE", (projection,)
    ).fetchone()
    return None if row is None else str(row[0])


def point_live(conn: psycopg.Connection[Any], projection: str, build: str) -> None:
    conn.execute(POINT_LIVE, (projection, build))


def outbox_swap(
    conn: psycopg.Connection[Any], projection: str, previous: str | None, build: str
) -> None:
    """In the swap's transaction: the change stream's marker that the live build changed, then
    the new build's state of every key, and a removal for each key only the old build had."""
    conn.execute(
        "INSERT INTO al_changes (projection, build, kind, previous) VALUES (%s, %s, 'build', %s)",
        (projection, build, previous),
    )
    conn.execute(
        "INSERT INTO al_changes (projection, build, kind, run_id, fleet_id, applied_seq, held, "
        "gaps, doc) SELECT projection, build, 'state', run_id, fleet_id, applied_seq, "
        "cardinality(held), gaps, coalesce(head, state)::text FROM al_run_state "
        "WHERE projection = %s AND build = %s ORDER BY run_id",
        (projection, build),
    )
    if previous is not None:
        conn.execute(
            "INSERT INTO al_changes (projection, build, kind, run_id, fleet_id) "
            "SELECT o.projection, %s, 'removed', o.run_id, o.fleet_id FROM al_run_state o "
            "WHERE o.projection = %s AND o.build = %s AND NOT EXISTS (SELECT 1 FROM "
            "al_run_state n WHERE n.projection = o.projection AND n.build = %s "
            "AND n.run_id = o.run_id) ORDER BY o.run_id",
            (build, projection, previous, build),
        )
    conn.execute("SELECT pg_notify('al_changes', '')")


# -- verification: two builds compared ------------------------------------------------------

# Canonical digests: jsonb prints keys in one order, so equal documents give equal text.
_DIGEST: LiteralString = (
    "SELECT count(*), coalesce(md5(string_agg(run_id || ':' || applied_seq || ':' || "
    "md5(coalesce(head, state)::text), ',' ORDER BY run_id)), '') FROM al_run_state "
    "WHERE projection = %s AND build = %s"
)
_STATE_DIFF: LiteralString = (
    "SELECT coalesce(a.run_id, b.run_id), a.run_id IS NULL, b.run_id IS NULL FROM "
    "(SELECT run_id, applied_seq, md5(coalesce(head, state)::text) h FROM al_run_state "
    " WHERE projection = %s AND build = %s) a FULL JOIN "
    "(SELECT run_id, applied_seq, md5(coalesce(head, state)::text) h FROM al_run_state "
    " WHERE projection = %s AND build = %s) b USING (run_id) "
    "WHERE a.h IS DISTINCT FROM b.h OR a.applied_seq IS DISTINCT FROM b.applied_seq "
    "ORDER BY 1 LIMIT %s"
)
_HISTORY_DIFF: LiteralString = (
    "SELECT coalesce(a.run_id, b.run_id), coalesce(a.kind, b.kind), coalesce(a.key, b.key) FROM "
    "(SELECT run_id, kind, key, md5(doc::text) h FROM al_history "
    " WHERE projection = %s AND build = %s) a FULL JOIN "
    "(SELECT run_id, kind, key, md5(doc::text) h FROM al_history "
    " WHERE projection = %s AND build = %s) b USING (run_id, kind, key) "
    "WHERE a.h IS DISTINCT FROM b.h ORDER BY 1, 2, 3 LIMIT %s"
)


def build_digest(conn: psycopg.Connection[Any], projection: str, build: str) -> tuple[int, str]:
    """(runs, digest of every run's position and head) of a build."""
    row = conn.execute(_DIGEST, (projection, build)).fetchone()
    return (int(row[0]), str(row[1])) if row else (0, "")


def head_differences(
    conn: psycopg.Connection[Any], projection: str, a: str, b: str, limit: int
) -> list[tuple[str, bool, bool]]:
    """(run_id, missing in a, missing in b) of runs whose position or head differ."""
    rows = conn.execute(_STATE_DIFF, (projection, a, projection, b, limit)).fetchall()
    return [(str(r), bool(x), bool(y)) for r, x, y in rows]


def history_differences(
    conn: psycopg.Connection[Any], projection: str, a: str, b: str, limit: int
) -> list[tuple[str, str, str]]:
    """(run_id, kind, key) of history rows that differ (or exist in one build only)."""
    rows = conn.execute(_HISTORY_DIFF, (projection, a, projection, b, limit)).fetchall()
    return [(str(r), str(k), str(key)) for r, k, key in rows]


def whole_state_suspects(
    conn: psycopg.Connection[Any], projection: str, a: str, b: str
) -> list[str]:
    """Runs whose whole states may differ although their heads agree: a tail in either build
    or checkpoints that differ."""
    rows = conn.execute(
        "SELECT a.run_id FROM al_run_state a JOIN al_run_state b USING (projection, run_id) "
        "WHERE a.projection = %s AND a.build = %s AND b.build = %s AND "
        "(a.tail_count > 0 OR b.tail_count > 0 OR md5(a.state::text) <> md5(b.state::text)) "
        "ORDER BY 1",
        (projection, a, b),
    ).fetchall()
    return [str(r) for (r,) in rows]


# -- dead letters --------------------------------------------------------------------------


async def redriven_sources(conn: psycopg.AsyncConnection[Any]) -> set[tuple[str, int, int]]:
    cur = await conn.execute(
        "SELECT source_topic, source_partition, source_offset FROM al_dlq_redriven"
    )
    return {(str(t), int(p), int(o)) for t, p, o in await cur.fetchall()}


async def mark_redriven(conn: psycopg.AsyncConnection[Any], source: tuple[str, int, int]) -> None:
    await conn.execute(
        "INSERT INTO al_dlq_redriven (source_topic, source_partition, source_offset) "
        "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
        source,
    )


# -- finding runs --------------------------------------------------------------------------

# sort -> (the column of the list's rows it orders by, whether its NULLs come first, the
# order of the index that serves its known values). Every sort is descending but by id, and
# ends with the run id, ascending, so the order is total and a page's last run is a keyset
# cursor: the next page starts right after its (value, run_id), an index seek, not an OFFSET.
RUN_SORTS: dict[str, tuple[LiteralString, bool, LiteralString]] = {
    "last": ("last_at", False, "last_at DESC NULLS LAST, run_id"),
    "first": ("first_at", False, "first_at DESC NULLS LAST, run_id"),
    "cost": ("list_cost", False, "list_cost DESC, run_id"),  # unknown (NULL, never 0) last
    "entries": ("entries", True, "entries DESC, run_id"),
    "id": ("run_id", False, "run_id"),
}
RUN_SORT_FIELDS: dict[str, str] = {
    "last": "last_at",
    "first": "first_at",
    "cost": "cost_usd",
    "entries": "entries",
    "id": "run_id",
}

EVALUATIONS: dict[str, LiteralString] = {
    "passed": "failure_class = 'none'",
    "unevaluated": "(failure_class IS NULL OR failure_class = 'unevaluated')",
    "failed": "failure_class NOT IN ('none', 'unevaluated')",
}

_LIVE: LiteralString = "(SELECT build FROM al_live WHERE projection = '{}')"
# the runs a page is read from: the runs list's index (al_run_list, migration 019: the run-stats
# build's runs with the columns sorted and filtered on typed, kept by triggers), walked in the
# sort's index order; sorted by cost, the runs of known cost are walked in the order of
# al_run_facts' cost index (migration 021) first, then the others by run id.
_LIST: LiteralString = "al_run_list r"
_BY_COST: LiteralString = (
    "al_run_facts k JOIN al_run_list r ON r.build = "
    + _LIVE.format("run-stats")
    + " AND r.run_id = k.run_id AND k.projection = 'cost-metrics' AND k.build = "
    + _LIVE.format("cost-metrics")
    + " AND k.cost_usd IS NOT NULL"
)
_KNOWN_COST: LiteralString = (
    "EXISTS (SELECT 1 FROM al_run_facts k WHERE k.projection = 'cost-metrics' AND k.build = "
    + _LIVE.format("cost-metrics")
    + " AND k.run_id = known.run_id AND k.cost_usd IS NOT NULL)"
)
# the text search over al_run_facts (migration 021; trigram indexes when pg_trgm is there), one
# of two ways by how many runs match (counted up to TEXT_MANY first, by the indexes): few, each
# side is a hashed subplan (its matches found once by the indexes, the walk in the sort's order
# probes them run by run); many, each run the walk reaches has its facts looked up by primary
# key and matched, so a page reads about as many runs as it takes to fill it. Either way an OR
# of the two sides keeps PostgreSQL from making a semi-join of it (which joins and sorts every
# match).
TEXT_MANY = 2000
_TEXT_SIDES: tuple[LiteralString, LiteralString] = (
    "t.projection = 'working-memory' AND t.build = "
    + _LIVE.format("working-memory")
    + " AND (t.task ILIKE %(text)s OR t.problems ILIKE %(text)s)",
    "t.projection = 'failure-classifications' AND t.build = "
    + _LIVE.format("failure-classifications")
    + " AND t.explanation ILIKE %(text)s",
)
_TEXT: LiteralString = (
    "(run_id IN (SELECT t.run_id FROM al_run_facts t WHERE "
    + _TEXT_SIDES[0]
    + ") OR run_id IN (SELECT t.run_id FROM al_run_facts t WHERE "
    + _TEXT_SIDES[1]
    + "))"
)
_TEXT_BY_RUN: LiteralString = (
    "(EXISTS (SELECT 1 FROM al_run_facts t WHERE t.run_id = known.run_id AND "
    + _TEXT_SIDES[0]
    + ") OR EXISTS (SELECT 1 FROM al_run_facts t WHERE t.run_id = known.run_id AND "
    + _TEXT_SIDES[1]
    + "))"
)
_TEXT_COUNT: LiteralString = (
    "SELECT count(*) FROM (SELECT 1 FROM al_run_facts t WHERE "
    + _TEXT_SIDES[0]
    + " UNION ALL SELECT 1 FROM al_run_facts t WHERE "
    + _TEXT_SIDES[1]
    + " LIMIT %(many)s) m"
)
# the repository filter, a hashed subplan as the text search's (coalesce: not a semi-join)
_REPOSITORY: LiteralString = (
    "coalesce(run_id IN (SELECT t.run_id FROM al_run_facts t "
    "WHERE t.projection = 'diff-timelines' AND t.build = "
    + _LIVE.format("diff-timelines")
    + " AND t.repository = %(repository)s), false)"
)
# the other projections' heads are looked up by primary key for the runs the walk yields.
# the projections the run list (_RUNS) is read from
RUN_LIST_PROJECTIONS = ("run-stats", "failure-classifications", "cost-metrics", "working-memory")
_RUNS: LiteralString = """
SELECT run_id, fleet_id, status, entries, first_at, last_at, failure_class, priced_cost_usd,
       cost_usd, calls, unpriced_calls, usage_unknown_calls, reported_calls, calls_unknown, task,
       explanation, conflicting_duplicates
FROM (
    -- the cost filtered and sorted on: unknown (NULL, never 0) unless some call has a cost of
    -- ours (projectors.cost_metrics.known_sum, which gives the cost the rows show)
    SELECT *, CASE WHEN calls > unpriced_calls + usage_unknown_calls
                   THEN priced_cost_usd END AS cost_usd
    FROM (
        SELECT r.run_id, r.fleet_id, r.status, r.entries, r.first_at, r.last_at,
               coalesce(f.head, f.state) -> 'classification' ->> 'failure_class' AS failure_class,
               (coalesce(c.head, c.state) -> 'totals' ->> 'cost_usd')::numeric AS priced_cost_usd,
               (coalesce(c.head, c.state) -> 'totals' ->> 'calls')::integer AS calls,
               (coalesce(c.head, c.state) -> 'totals' ->> 'unpriced_calls')::integer
                   AS unpriced_calls,
               (coalesce(c.head, c.state) -> 'totals' ->> 'usage_unknown_calls')::integer
                   AS usage_unknown_calls,
               (coalesce(c.head, c.state) -> 'totals' ->> 'reported_calls')::integer
                   AS reported_calls,
               coalesce(c.head, c.state) ->> 'calls_unknown' = 'true' AS calls_unknown,
               coalesce(c.head, c.state) -> 'by_model' AS by_model,
               coalesce(w.head, w.state) ->> 'task_goal' AS task,
               coalesce(f.head, f.state) -> 'classification' ->> 'explanation' AS explanation,
               r.conflicts AS conflicting_duplicates,
               {list_cost} AS list_cost
        FROM {source}
        LEFT JOIN al_run_state f ON f.projection = 'failure-classifications'
            AND f.build = (SELECT build FROM al_live WHERE projection = 'failure-classifications')
            AND f.run_id = r.run_id
        LEFT JOIN al_run_state c ON c.projection = 'cost-metrics'
            AND c.build = (SELECT build FROM al_live WHERE projection = 'cost-metrics')
            AND c.run_id = r.run_id
        LEFT JOIN al_run_state w ON w.projection = 'working-memory'
            AND w.build = (SELECT build FROM al_live WHERE projection = 'working-memory')
            AND w.run_id = r.run_id
        WHERE r.build = (SELECT build FROM al_live WHERE projection = 'run-stats')
    ) runs
) known
{where}
ORDER BY {order}
LIMIT %(limit)s
"""


def find_runs(
    conn: psycopg.Connection[Any],
    *,
    fleet: str | None = None,
    status: str | None = None,
    failure_class: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    cost_above: Any = None,
    text: str | None = None,
    sort: str = "last",
    limit: int = 50,
    after: tuple[Any, str] | None = None,
    fleets: Sequence[str] | None = None,
    model: str | None = None,
    evaluation: str | None = None,
    repository: str | None = None,
) -> list[dict[str, Any]]:
    """Runs of the live builds, filtered and sorted (see ``agentledger runs``). A run with no
    cost (yet) has ``cost_usd`` None and never passes ``cost_above``; ``status`` "RUNNING" is a
    run not finished yet; ``text`` matches the task, the failure explanation and open problems
    (case-insensitive, literally); ``fleets`` keeps only the runs of those fleets (an API
    token's scope); ``after`` is the sort's (value, run_id) of the run before the page
    (:func:`run_key` of the previous page's last row: the page starts right after it);
    ``model`` keeps the runs with a counted call of that model (``provider/model`` or the model
    alone); ``evaluation`` what a submission's evaluation said: ``passed`` (class none),
    ``unevaluated`` (no class yet, or unevaluated) or ``failed`` (any other class).

    A page is read in at most two walks of an index: the runs whose sort value is known, in
    the sort's order from ``after`` on, and the runs whose value is NULL (unknown cost), by run
    id (first or last, as the sort puts NULLs)."""
    clauses: list[sql.Composable] = []
    params: dict[str, Any] = {"limit": limit}
    _common(clauses, params, fleet, since, None, "last_at")
    if fleets is not None:
        clauses.append(sql.SQL("fleet_id = ANY(%(fleets)s)"))
        params["fleets"] = list(fleets)
    if model:
        clauses.append(
            sql.SQL(
                "EXISTS (SELECT 1 FROM jsonb_object_keys(coalesce(by_model, '{}'::jsonb)) k "
                "WHERE k = %(model)s OR split_part(k, '/', 2) = %(model)s)"
            )
        )
        params["model"] = model
    if status is not None:
        clauses.append(
            sql.SQL("status IS NULL") if status == "RUNNING" else sql.SQL("status = %(status)s")
        )
        params["status"] = status
    if evaluation is not None:
        clauses.append(sql.SQL(EVALUATIONS[evaluation]))
    if failure_class is not None:
        clauses.append(sql.SQL("failure_class = %(class)s"))
        params["class"] = failure_class
    if until is not None:
        clauses.append(sql.SQL("first_at < %(until)s"))
        params["until"] = until
    if cost_above is not None:
        clauses.append(sql.SQL("cost_usd > %(cost)s"))
        params["cost"] = cost_above
    if text:
        pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        params["text"] = pattern
        counted = conn.execute(_TEXT_COUNT, {"text": pattern, "many": TEXT_MANY}).fetchone()
        many = counted is not None and counted[0] >= TEXT_MANY
        clauses.append(sql.SQL(_TEXT_BY_RUN if many else _TEXT))
    if repository is not None:
        clauses.append(sql.SQL(_REPOSITORY))
        params["repository"] = repository
    column, nulls_first, index_order = RUN_SORTS[sort]
    col = sql.Identifier(column)
    # the walks in the sort's order: by id, all at once; else the known values and the NULLs
    walks = ["all"] if sort == "id" else ["null", "known"] if nulls_first else ["known", "null"]
    if after is not None:
        params["after_value"], params["after_run"] = after
        here = "all" if sort == "id" else "null" if after[0] is None else "known"
        walks = walks[walks.index(here) :]
    found: list[dict[str, Any]] = []
    with conn.cursor() as cur:
        for walk in walks:
            where = list(clauses)
            first = after is not None and walk == walks[0]  # the walk the cursor's run is in
            if walk == "known":
                if sort != "cost":  # by cost, the source holds only the known costs
                    where.append(sql.SQL("{} IS NOT NULL").format(col))
                if first:
                    where.append(
                        sql.SQL(
                            "{c} <= %(after_value)s AND "
                            "({c} < %(after_value)s OR run_id > %(after_run)s)"
                        ).format(c=col)
                    )
            else:
                if walk == "null":
                    where.append(
                        sql.SQL("NOT " + _KNOWN_COST)
                        if sort == "cost"
                        else sql.SQL("{} IS NULL").format(col)
                    )
                if first:
                    where.append(sql.SQL("run_id > %(after_run)s"))
            by_cost = sort == "cost" and walk == "known"
            query = sql.SQL(_RUNS).format(
                source=sql.SQL(_BY_COST if by_cost else _LIST),
                list_cost=sql.SQL("k.cost_usd" if by_cost else "NULL::numeric"),
                where=_where(where),
                order=sql.SQL(index_order if walk == "known" else "run_id"),
            )
            params["limit"] = limit - len(found)
            cur.execute(query, params)
            names = [d.name for d in cur.description or []]
            found += [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
            if len(found) >= limit:
                break
    return found


def run_key(sort: str, row: dict[str, Any]) -> tuple[Any, str]:
    """The (sort value, run id) of a row of :func:`find_runs` as its ``after`` takes it."""
    return row[RUN_SORT_FIELDS[sort]], str(row["run_id"])


def runs_with_prefix(
    conn: psycopg.Connection[Any],
    prefix: str,
    limit: int = 6,
    fleets: Sequence[str] | None = None,
) -> list[str]:
    """Run ids of the live run-stats build equal to ``prefix`` (only that one, if it exists) or
    else starting with it, at most ``limit`` (only of ``fleets``, when given). Read from the
    byte-order index of migration 023 between :func:`prefix_bounds`."""
    low, high = prefix_bounds(prefix)
    below: LiteralString = "" if high is None else "AND s.run_id ~<~ %(high)s "
    rows = conn.execute(
        f"SELECT s.run_id FROM {LIVE_STATE} WHERE s.projection = 'run-stats' "
        f"AND s.run_id ~>=~ %(low)s {below}AND left(s.run_id, length(%(low)s)) = %(low)s "
        "AND (%(fleets)s::text[] IS NULL OR s.fleet_id = ANY(%(fleets)s::text[])) "
        "ORDER BY s.run_id <> %(low)s, s.run_id LIMIT %(limit)s",
        {"low": low, "high": high, "fleets": fleets, "limit": limit},
    ).fetchall()
    found = [str(r) for (r,) in rows]
    return [prefix] if prefix in found else found


def prefix_bounds(prefix: str) -> tuple[str, str | None]:
    """Byte-order bounds of the texts starting with ``prefix``: ``low <= t < high`` (no upper
    bound: None). UTF-8's byte order is code point order, so ``high`` is the prefix with its
    last character one code point on (past the surrogates, which no text holds), or, where it
    is the last code point, the same of what comes before it."""
    rest = prefix
    while rest:
        last = ord(rest[-1]) + 1
        if last == 0xD800:
            last = 0xE000
        if last <= 0x10FFFF:
            return prefix, rest[:-1] + chr(last)
        rest = rest[:-1]
    return prefix, None


def resolve_run(
    conn: psycopg.Connection[Any], prefix: str, fleets: Sequence[str] | None = None
) -> str:
    """The run id that is ``prefix`` or the only one starting with it (live builds; only
    the runs of ``fleets``, when given)."""
    if not prefix:
        raise BadArgumentError("give a run id (or a unique prefix of one)")
    found = runs_with_prefix(conn, prefix, fleets=None if fleets is None else list(fleets))
    if not found:
        raise NotFoundError(f"no run id is or starts with {prefix!r} in the live build")
    if len(found) > 1:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise AmbiguousRunError(
            f"{prefix!r} is the start of {'more than 5' if len(found) > 5 else len(found)} "
            f"run ids ({shown}); give more of it"
        )
    return found[0]


def run_of_fleets(conn: psycopg.Connection[Any], run_id: str, fleets: Sequence[str]) -> str:
    """The run ``run_id`` names for a reader of ``fleets``: the run itself when it is one of
    theirs, else the only run of theirs it is the start of (a unique prefix, as the CLI
    resolves one). NotFoundError ("no run X"): none of theirs (an unknown run and another
    fleet's alike, so a prefix never reveals another fleet's run); AmbiguousRunError: several
    of theirs start with it. The one rule of the web API, its pages and the MCP server."""
    if not run_id:
        raise NotFoundError("no run (a run id is needed)")
    if not ID_RE.fullmatch(run_id):  # no run's id nor the start of one: not asked (a NUL stops
        raise NotFoundError(f"no run {asked(run_id)}")  # PostgreSQL; a megabyte, its index)
    if live_fleet_of(conn, run_id) in fleets:
        return run_id
    try:
        return resolve_run(conn, run_id, fleets)
    except AmbiguousRunError:
        raise
    except NotFoundError:
        raise NotFoundError(f"no run {run_id}") from None


async def dismissed_sources(
    conn: psycopg.AsyncConnection[Any],
) -> dict[tuple[str, int, int], tuple[str, datetime]]:
    """Dismissed dead letters: source -> (reason, when)."""
    cur = await conn.execute(
        "SELECT source_topic, source_partition, source_offset, reason, dismissed_at "
        "FROM al_dlq_dismissed"
    )
    return {(str(t), int(p), int(o)): (str(r), at) for t, p, o, r, at in await cur.fetchall()}


async def dismiss(
    conn: psycopg.AsyncConnection[Any], source: tuple[str, int, int], reason: str
) -> bool:
    """Mark a dead letter handled; False when it already was (the first reason stays)."""
    cur = await conn.execute(
        "INSERT INTO al_dlq_dismissed (source_topic, source_partition, source_offset, reason) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (*source, reason),
    )
    return cur.rowcount == 1


def live_run_ends(
    conn: psycopg.Connection[Any], fleet: str | None = None
) -> dict[str, tuple[str, datetime | None]]:
    """Every run of the live run-stats build (of ``fleet`` if given): its fleet and the time of
    its last entry (None: the run's log keeps no times)."""
    rows = conn.execute(
        f"SELECT s.run_id, s.fleet_id, coalesce(s.head, s.state) ->> 'last_at' FROM {LIVE_STATE} "
        "WHERE s.projection = 'run-stats' AND (%(fleet)s::text IS NULL OR s.fleet_id = %(fleet)s)",
        {"fleet": fleet},
    ).fetchall()
    return {
        str(run): (str(f), None if at is None else datetime.fromisoformat(at))
        for run, f, at in rows
    }


def live_run_fleets(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> dict[str, str]:
    """The fleet of each of these runs the live run-stats build holds (runs it lacks left out)."""
    rows = conn.execute(
        f"SELECT s.run_id, s.fleet_id FROM {LIVE_STATE} "
        "WHERE s.projection = 'run-stats' AND s.run_id = ANY(%(runs)s)",
        {"runs": list(run_ids)},
    ).fetchall()
    return {str(run): str(fleet) for run, fleet in rows}


def fleets_with_runs(dsn: str, fleets: Sequence[str]) -> set[str]:
    """:func:`fleets_have_runs` on a pooled connection of ``dsn``."""
    with connect(dsn) as conn:
        return fleets_have_runs(conn, fleets)


def fleets_have_runs(conn: psycopg.Connection[Any], fleets: Sequence[str]) -> set[str]:
    """Which of ``fleets`` the live run-stats build holds a run of."""
    rows = conn.execute(
        "SELECT f FROM unnest(%(fleets)s::text[]) f WHERE EXISTS (SELECT 1 FROM al_run_list r "
        "WHERE r.build = " + _LIVE.format("run-stats") + " AND r.fleet_id = f)",
        {"fleets": list(fleets)},
    ).fetchall()
    return {str(r[0]) for r in rows}


def run_holds_entry(conn: psycopg.Connection[Any], run_id: str, entry_id: str) -> bool:
    """Whether the live run-stats build applied ``entry_id`` to the run."""
    row = conn.execute(
        "SELECT 1 FROM al_entry_id_spans i JOIN al_live l USING (projection, build) "
        "WHERE i.projection = 'run-stats' AND i.run_id = %s AND %s = ANY (i.ids) LIMIT 1",
        (run_id, entry_id),
    ).fetchone()
    return row is not None
