"""Which build of each projection the live worker writes: the one ``al_live`` points to, or a
first build made live when none exists yet."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from projectors.base import Projection
from projectors.registry import all_projections
from schemas.errors import AgentLedgerError
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
                "SELECT l.build, b.version FROM al_live l "
                "JOIN al_builds b USING (projection, build) WHERE projection = %s",
                (projection.name,),
            ).fetchone()
            assert row is not None
            build, version = str(row[0]), int(row[1])
            if version != projection.version:
                raise BuildVersionError(
                    f"{projection.name}: the live build {build} was made by version {version} of "
                    f"its code, this worker runs version {projection.version}; writing on would "
                    f"mix the two. Rebuild it with this code first: "
                    f"agentledger rebuild {projection.name} --swap"
                )
            targets.append(Target(projection, build))
    return targets


class BuildVersionError(AgentLedgerError):
    """The live build of a projection was made by another version of its code."""
