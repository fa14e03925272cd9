"""A budget guard: reports a run the moment its cost crosses its budget.

It follows ``cost-metrics`` changes and reports each run once, at the first change whose state
says the run is over budget (the projection's own ``over_budget``, so the rule lives in one
place), with the cost that crossed it and the sequence number of the entry that did.

    async for crossing in BudgetGuard(settings).crossings():
        alert(crossing.run_id, crossing.cost_usd, crossing.budget_usd)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from consumers.subscribe import Start, Subscriber
from infra.settings import Settings
from schemas.changes import ProjectionChange


@dataclass(frozen=True)
class Crossing:
    run_id: str
    fleet_id: str | None
    cost_usd: Decimal  # the run's priced cost when it crossed
    budget_usd: Decimal
    applied_seq: int  # the entry that crossed it (every entry up to it applied)
    committed_at: datetime
    traceparent: str | None  # the crossing entry's publisher trace
    build: str


def crossing(change: ProjectionChange) -> Crossing | None:
    """The crossing a cost-metrics change shows, if its run is over budget."""
    state = change.state or {}
    budget = state.get("task_budget_usd")
    if change.kind != "STATE" or not state.get("over_budget") or budget is None:
        return None
    totals = state.get("totals") or {}
    return Crossing(
        run_id=change.run_id or "",
        fleet_id=change.fleet_id,
        cost_usd=Decimal(str(totals.get("cost_usd", "0"))),
        budget_usd=Decimal(str(budget)),
        applied_seq=change.applied_seq,
        committed_at=change.committed_at,
        traceparent=change.traceparent,
        build=change.build,
    )


class BudgetGuard:
    """Each run over its budget, once (a run already over budget when a subscriber from the
    beginning starts is reported from its current state)."""

    def __init__(
        self,
        settings: Settings,
        start: Start = "now",
        fleet: str | None = None,
        idle_timeout_s: float | None = None,
    ) -> None:
        self.subscriber = Subscriber(
            settings, "cost-metrics", start=start, fleet=fleet, idle_timeout_s=idle_timeout_s
        )
        self.reported: set[str] = set()

    async def crossings(self, stop: asyncio.Event | None = None) -> AsyncIterator[Crossing]:
        """Crossings as they come; with ``idle_timeout_s``, until idle that long (and, given
        ``stop``, only once it is set)."""
        async with self.subscriber as changes:
            while True:
                async for change in changes:
                    found = crossing(change)
                    if found is not None and found.run_id not in self.reported:
                        self.reported.add(found.run_id)
                        yield found
                if stop is None or stop.is_set():
                    return
