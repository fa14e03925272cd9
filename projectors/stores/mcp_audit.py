"""PostgreSQL side of the MCP server (``consumers/mcp_ledger.py``): the read counts of
``al_mcp_reads`` (migration ``018_mcp_audit.sql``) and what an answer says of the builds it
came from. Each function takes an open connection; connecting is the caller's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import Connection

from projectors.stores.postgres_ops import LIVE_STATE


def record_read(
    conn: Connection[Any], token_id: str, tool: str, run_id: str, seq: int | None, refused: bool
) -> None:
    """Count one read of ``run_id`` by ``tool`` for ``token_id``; ``seq``: the applied sequence
    number the answer stood at (None: none, e.g. refused)."""
    conn.execute(
        "INSERT INTO al_mcp_reads AS r "
        "(token_id, tool, run_id, reads, refused, last_seq, max_seq) "
        "VALUES (%s, %s, %s, 1, %s, %s, %s) "
        "ON CONFLICT (token_id, tool, run_id) DO UPDATE SET "
        "reads = r.reads + 1, refused = r.refused + EXCLUDED.refused, "
        "last_seq = coalesce(EXCLUDED.last_seq, r.last_seq), "
        "max_seq = greatest(r.max_seq, EXCLUDED.max_seq), last_at = now()",
        (token_id, tool, run_id, int(refused), seq, seq),
    )


def commit_without_flush(conn: Connection[Any]) -> None:
    """This transaction's commit does not wait for its WAL to reach the disk
    (``synchronous_commit`` off, for this transaction only): a read's count is its only write,
    and a read must not wait for a disk flush behind the worker's commits. A crash of
    PostgreSQL itself may lose the counts of the last moments (at most ~3 x
    ``wal_writer_delay``), never make them inconsistent."""
    conn.execute("SET LOCAL synchronous_commit TO off")


def read_counts(
    conn: Connection[Any], token_id: str | None = None, run_id: str | None = None
) -> list[dict[str, Any]]:
    """Every counted (token, tool, run), newest read first; optionally of one token, or of the
    runs whose id is or starts with ``run_id`` (a read counted under an id no run has, refused,
    is found the same way; ``""``: the reads of no run, the run lists)."""
    rows = conn.execute(
        "SELECT token_id, tool, run_id, reads, refused, last_seq, max_seq, first_at, last_at "
        "FROM al_mcp_reads "
        "WHERE (%s::text IS NULL OR token_id = %s) "
        "AND (%s::text IS NULL OR CASE WHEN %s = '' THEN run_id = '' "
        "ELSE starts_with(run_id, %s) END) "
        "ORDER BY last_at DESC, token_id, tool, run_id",
        (token_id, token_id, run_id, run_id, run_id),
    ).fetchall()
    keys = ("token_id", "tool", "run_id", "reads", "refused", "last_seq", "max_seq")
    return [
        {**dict(zip(keys, r[:7], strict=True)), "first_at": r[7], "last_at": r[8]} for r in rows
    ]


def live_builds(conn: Connection[Any], projections: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The live build of each of ``projections``: its name and the projection code's version
    that built it."""
    rows = conn.execute(
        "SELECT l.projection, l.build, b.version FROM al_live l "
        "JOIN al_builds b USING (projection, build) WHERE l.projection = ANY(%s)",
        (list(projections),),
    ).fetchall()
    return {str(p): {"build": str(b), "version": int(v)} for p, b, v in rows}


def run_applied(conn: Connection[Any], projections: Sequence[str], run_id: str) -> dict[str, int]:
    """The run's applied sequence number in each of these projections' live builds that has
    seen it."""
    rows = conn.execute(
        f"SELECT s.projection, s.applied_seq FROM {LIVE_STATE} "
        "WHERE s.projection = ANY(%s) AND s.run_id = %s",
        (list(projections), run_id),
    ).fetchall()
    return {str(p): int(s) for p, s in rows}
