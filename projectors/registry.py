"""Every projection the engine runs, by name."""

from __future__ import annotations

from typing import Any

from projectors.base import Projection
from projectors.context_manifests import ContextManifestsProjection
from projectors.run_stats import RunStatsProjection
from projectors.working_memory import WorkingMemoryProjection


def all_projections() -> list[Projection[Any]]:
    return [RunStatsProjection(), WorkingMemoryProjection(), ContextManifestsProjection()]


def projection(name: str) -> Projection[Any]:
    for p in all_projections():
        if p.name == name:
            return p
    names = ", ".join(p.name for p in all_projections())
    raise KeyError(f"no projection named {name!r}; known: {names}")
