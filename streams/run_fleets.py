"""Which fleet a run is in already: the one rule for a run sent to a fleet it is not in (the
importers, ``agentledger publish FILE`` and the OTLP receiver ask it before sending; the workers'
contract check dead-letters what still arrives)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any, Protocol

from infra.settings import Settings


class FleetRun(Protocol):
    """A run about to be sent: its id and the fleet it is sent to."""

    @property
    def run_id(self) -> str: ...

    @property
    def fleet_id(self) -> str: ...


class RunFleets:
    """Which fleet the runs an import brings are in already (the live run-stats build), over one
    connection for the whole import, opened when first asked."""

    RETRY_S = 60.0

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._conn: Any = None
        self._closing: contextlib.ExitStack | None = None
        self._unavailable_until = 0.0  # (monotonic) PostgreSQL could not say: asked again after
        self.unanswered = False  # the last ask went unanswered (no check was made)

    def clash(self, runs: Sequence[FleetRun]) -> str:
        """Why these runs cannot go to their fleet: a run already on the ledger in another
        fleet belongs to that fleet, and its entries sent to this one would all be dead-lettered
        by the workers while the import said they were published; "" when none is (or
        PostgreSQL cannot say: then the workers' contract check still holds)."""
        clashes = self.elsewhere([(r.run_id, r.fleet_id) for r in runs])
        if not clashes:
            return ""
        run_id, there, here = clashes[0]
        more = f" (and {len(clashes) - 1} more runs)" if len(clashes) > 1 else ""
        return f"{elsewhere_text(run_id, there, here)}{more} (import it with --fleet {there})"

    def elsewhere(self, runs: Sequence[tuple[str, str]]) -> list[tuple[str, str, str]]:
        """``(run_id, its fleet on the ledger, the fleet given)`` of the ``(run_id, fleet)``
        pairs whose run is on the ledger (the live run-stats build) in another fleet; empty
        when PostgreSQL cannot say."""
        import psycopg

        from projectors.stores import postgres_ops as ops

        self.unanswered = time.monotonic() < self._unavailable_until
        if self.unanswered or not runs:
            return []
        try:
            if self._conn is None:
                self._closing = contextlib.ExitStack()
                self._conn = self._closing.enter_context(ops.connect(self.settings.pg_address))
            fleets = ops.live_run_fleets(self._conn, sorted({r for r, _ in runs}))
            self._conn.commit()  # (no transaction held open between files)
        except psycopg.Error:  # (no PostgreSQL, or not migrated yet; a follower asks again)
            self._unavailable_until = time.monotonic() + self.RETRY_S
            self.unanswered = True
            self.close()
            return []
        return [
            (run_id, fleets[run_id], fleet)
            for run_id, fleet in runs
            if fleets.get(run_id, fleet) != fleet
        ]

    def close(self) -> None:
        closing, self._closing, self._conn = self._closing, None, None
        if closing is not None:
            with contextlib.suppress(Exception):
                closing.close()


def elsewhere_text(run_id: str, there: str, here: str) -> str:
    """The one wording of a run sent to a fleet it is not in."""
    return f"run {run_id} is on the ledger in fleet {there}, not {here}: a run belongs to one fleet"
