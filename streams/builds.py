"""Which build of each projection the live worker writes: the one ``al_live`` points to, or a
first build made live when none exists yet."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from projectors.base import Projection, projection_inputs
from projectors.registry import all_projections
from projectors.stores import postgres_ops as ops
from schemas.errors import AgentLedgerError
from streams.engine import Target


def initial_build(projection: Projection[Any]) -> str:
    return f"v{projection.version}-1"


def live_targets(pg_dsn: str, projections: Sequence[Projection[Any]] | None = None) -> list[Target]:
    """Each projection with its live build (creating and recording the first one if needed)."""
    targets = []
    with ops.connect(pg_dsn) as conn:
        for projection in projections if projections is not None else all_projections():
            build, version = ops.ensure_live_build(
                conn,
                projection.name,
                initial_build(projection),
                projection.version,
                projection_inputs(projection),
            )
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
