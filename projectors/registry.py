"""Every projection the engine runs, by name, configured from the settings' data files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Protocol

from projectors.base import Projection
from projectors.context_manifests import ContextBudget, ContextManifestsProjection
from projectors.cost_metrics import CostMetricsProjection
from projectors.diff_timelines import DiffTimelinesProjection
from projectors.failure_classifications import FailureClassifications, Taxonomy
from projectors.pricing import LayeredPrices, PriceSource, PriceTable
from projectors.run_stats import RunStatsProjection
from projectors.working_memory import WorkingMemoryProjection
from schemas.errors import BadArgumentError


class Settings(Protocol):
    """What configures the projections: the data files a deployment may replace (the
    deployment's ``infra.settings.Settings`` has these; this layer does not import it)."""

    @property
    def price_table(self) -> Path | None: ...
    @property
    def price_source(self) -> Literal["genai-prices", "table"]: ...
    @property
    def failure_taxonomy(self) -> Path | None: ...
    @property
    def context_budget(self) -> str | None: ...


NAMES = (
    "run-stats",
    "working-memory",
    "context-manifests",
    "diff-timelines",
    "cost-metrics",
    "failure-classifications",
)


def all_projections(settings: Settings | None = None) -> list[Projection[Any]]:
    """Every projection; ``settings`` may replace the shipped price table, taxonomy, budget."""
    budget = taxonomy = None
    prices: PriceSource | None = None
    if settings is not None:
        if settings.context_budget:
            budget = ContextBudget.from_overrides(settings.context_budget)
        table = PriceTable.load(settings.price_table) if settings.price_table else None
        if settings.price_source == "table":  # our table alone (builds made before genai-prices)
            prices = table or PriceTable.shipped()
        else:
            prices = LayeredPrices(table)
        if settings.failure_taxonomy is not None:
            taxonomy = Taxonomy.load(settings.failure_taxonomy)
    return [
        RunStatsProjection(),
        WorkingMemoryProjection(),
        ContextManifestsProjection(budget),
        DiffTimelinesProjection(),
        CostMetricsProjection(prices),
        FailureClassifications(taxonomy),
    ]


GROUPS = {
    "agent": ("run-stats", "working-memory", "context-manifests"),
    "analytics": ("diff-timelines", "cost-metrics", "failure-classifications"),
}


def selected(spec: str, settings: Settings | None = None) -> list[Projection[Any]]:
    """The projections a worker applies: ``all``, a group of :data:`GROUPS`, or names."""
    names: set[str] = set()
    for word in (w.strip() for w in spec.split(",")):
        if word == "all":
            names.update(NAMES)
        elif word in GROUPS:
            names.update(GROUPS[word])
        elif word in NAMES:
            names.add(word)
        elif word:
            known = ", ".join(["all", *GROUPS, *NAMES])
            raise UnknownProjectionError(f"no projection or group named {word!r}; known: {known}")
    return [p for p in all_projections(settings) if p.name in names]


def projection(name: str, settings: Settings | None = None) -> Projection[Any]:
    for p in all_projections(settings):
        if p.name == name:
            return p
    raise UnknownProjectionError(f"no projection named {name!r}; known: {', '.join(NAMES)}")


class UnknownProjectionError(BadArgumentError, KeyError):
    """No projection (or group) has this name."""

    def __str__(self) -> str:  # a KeyError would print its message quoted
        return str(self.args[0]) if self.args else ""
