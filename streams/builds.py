"""Which build of each projection the live worker writes: the one ``al_live`` points to, or a
first build made live when none exists yet."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from projectors.base import Projection
from projectors.registry import all_projections
from streams.engine import Target


def initial_build(projection: Projection[Any]) -> str:
    return f"v{projection.version}-1"


def live_targets(pg_dsn: str, projections: Sequence[Projection[Any]] | None = None) -> list[Target]:
    """Each projection with its live build (creating and recording the first one if needed)."""
    targets = []
    with psycopg.connect(pg_dsn) as conn:
        for projection in projections if projections is not None else all_projections():
            conn.execute(
                "INSERT INTO al_builds (projection, build, version) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (projection.name, initial_build(projection), projection.version),
            )
            conn.execute(
                "INSERT INTO al_live (projection, build) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (projection.name, initial_build(projection)),
            )
            row = conn.execute(
                "SELECT build FROM al_live WHERE projection = %s", (projection.name,)
            ).fetchone()
            assert row is not None
            targets.append(Target(projection, str(row[0])))
    return targets
