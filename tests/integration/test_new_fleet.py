"""A fleet that appears after the workers started (its topics created then) is projected within
seconds, with no restart: the worker finds its ledger topic and subscribes to it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from consumers.views import live_states
from infra.settings import Settings
from schemas.factory import EntryBuilder
from schemas.models import EntryKind, RunStatus
from streams.admin import create_fleet_topics
from streams.deployment import PrivateDeployment
from streams.publisher import AsyncPublisher

pytestmark = pytest.mark.integration


def test_a_fleet_created_after_the_worker_started_is_projected_within_10_s(
    services: Settings, tmp_path: Path
) -> None:
    d = PrivateDeployment(services, "newfleet", ["fleet-01"], tmp_path)
    asyncio.run(d.create())
    try:
        worker = d.start_worker("w")
        d.wait_partitions("w")
        time.sleep(3)  # the worker is settled on its one fleet
        settings = d.settings.model_copy(update={"fleets": "fleet-01,acme"})
        asyncio.run(create_fleet_topics(settings, ["acme"]))
        d.fleets.append("acme")  # (dropped with the deployment)
        b = EntryBuilder("run-acme-1", fleet_id="acme")
        b.add(EntryKind.RUN_STARTED)
        b.add(EntryKind.USER_TASK)
        b.add(EntryKind.RUN_FINISHED, run_status=RunStatus.SUCCEEDED)

        async def publish() -> None:
            async with AsyncPublisher(settings) as publisher:
                await publisher.publish_batch(b.entries)

        asyncio.run(publish())
        published = time.monotonic()
        while True:
            found = live_states(d.settings, "run-stats", ["run-acme-1"]).get("run-acme-1")
            if found is not None and found["applied_seq"] == 3:
                break
            assert worker.poll() is None, d.log_of("w").read_text()[-3000:]
            waited = time.monotonic() - published
            assert waited < 10, f"not projected {waited:.1f}s after publishing"
            time.sleep(0.2)
        print(f"new fleet projected {time.monotonic() - published:.1f}s after its first publish")
        assert "new fleet topics" in d.log_of("w").read_text()
    finally:
        d.drop()
