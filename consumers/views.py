"""Reading projections as a user does: always through the live build."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from infra.settings import Settings
from projectors import registry
from projectors.stores.postgres import current_documents, use_documents


class NotFoundError(LookupError):
    """The run (or the requested version of it) is not in the live build."""


def live_state(settings: Settings, projection: str, run_id: str) -> dict[str, Any]:
    """The run's whole current state document, with where it stands (``applied_seq``,
    ``gaps``): its checkpoint with the entries applied since folded on."""
    found = live_states(settings, projection, [run_id])
    if run_id not in found:
        raise NotFoundError(f"no {projection} for run {run_id} in the live build")
    return found[run_id]


def live_states(
    settings: Settings, projection: str, run_ids: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """:func:`live_state` of each of ``run_ids`` found in the live build."""
    with psycopg.connect(settings.pg_address) as conn:
        use_documents(conn)
        build = live_build(conn, projection)
        if build is None:
            return {}
        folded = registry.projection(projection, settings)
        return {
            run: {"applied_seq": seq, "gaps": gaps, "state": doc}
            for run, seq, gaps, doc in current_documents(conn, folded, build, run_ids)
        }


def live_build(conn: psycopg.Connection[Any], projection: str) -> str | None:
    row = conn.execute("SELECT build FROM al_live WHERE projection = %s", (projection,)).fetchone()
    return None if row is None else str(row[0])


def history_at(
    settings: Settings, projection: str, run_id: str, kind: str, seq: int
) -> dict[str, Any]:
    """The newest history row of ``kind`` at or before sequence ``seq``."""
    with psycopg.connect(settings.pg_address) as conn:
        use_documents(conn)
        row = conn.execute(
            "SELECT h.doc, h.seq, h.key FROM al_history h JOIN al_live l USING (projection, build) "
            "WHERE h.projection = %s AND h.run_id = %s AND h.kind = %s AND h.seq <= %s "
            "ORDER BY h.seq DESC, h.key DESC LIMIT 1",
            (projection, run_id, kind, seq),
        ).fetchone()
    if row is None:
        raise NotFoundError(f"no {kind} of {projection} for run {run_id} at or before {seq}")
    return {"seq": row[1], "key": row[2], "state": row[0]}


def history_row(
    settings: Settings, projection: str, run_id: str, kind: str, key: str
) -> dict[str, Any]:
    with psycopg.connect(settings.pg_address) as conn:
        use_documents(conn)
        row = conn.execute(
            "SELECT h.doc, h.seq FROM al_history h JOIN al_live l USING (projection, build) "
            "WHERE h.projection = %s AND h.run_id = %s AND h.kind = %s AND h.key = %s",
            (projection, run_id, kind, key),
        ).fetchone()
    if row is None:
        raise NotFoundError(f"no {kind} {key} of {projection} for run {run_id}")
    return {"seq": row[1], "key": key, "state": row[0]}
