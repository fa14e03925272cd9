"""A fleet that appears after the workers started (its topics created then) is projected within
seconds: the worker finds its ledger topic and restarts its faust process onto it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from consumers.views import live_states
from infra.admin import create_fleet_topics
from infra.settings import Settings
from schemas.factory import EntryBuilder
from schemas.models import EntryKind, LedgerEntry, RunStatus
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
        log = d.log_of("w").read_text()
        assert "new fleet topics" in log and "restarting onto them" in log
    finally:
        d.drop()


def test_a_first_publish_to_a_fleet_without_topics_is_a_clear_error_and_sends_nothing(
    services: Settings, tmp_path: Path
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    from schemas.json_form import to_json_text
    from streams.publisher import FleetTopicMissingError

    d = PrivateDeployment(services, "nofleet", ["fleet-01"], tmp_path)
    asyncio.run(d.create())
    try:
        b = EntryBuilder("run-newco-1", fleet_id="newco")
        b.add(EntryKind.RUN_STARTED)
        b.add(EntryKind.RUN_FINISHED, run_status=RunStatus.SUCCEEDED)

        async def publish() -> None:
            async with AsyncPublisher(d.settings) as publisher:
                await publisher.publish_batch(b.entries)

        with pytest.raises(FleetTopicMissingError) as caught:
            asyncio.run(publish())
        assert caught.value.fleets == ["newco"]
        assert "agentledger topics create --fleet newco" in str(caught.value)

        async def topics() -> set[str]:
            admin = AIOKafkaAdminClient(bootstrap_servers=d.settings.kafka_address)
            await admin.start()
            try:
                return set(await admin.list_topics())
            finally:
                await admin.close()

        ledger = f"{d.settings.topic_prefix}.ledger.newco"
        assert ledger not in asyncio.run(topics())  # the publisher made nothing

        path = tmp_path / "newco.jsonl"
        path.write_text("".join(to_json_text(e) + "\n" for e in b.entries))
        cli = [sys.executable, "-m", "infra.main"]
        sent = subprocess.run(
            [*cli, "publish", str(path)], env=d.env(), capture_output=True, text=True, timeout=120
        )
        assert sent.returncode == 1 and "Traceback" not in sent.stderr
        assert "no ledger topic for fleet newco" in sent.stderr
        assert "topics create --fleet newco" in sent.stderr and len(sent.stderr.splitlines()) == 1

        # More replicas than the cluster has brokers: a setting to change, said as one line
        # naming it (it was "unexpected InvalidReplicationFactorError"), nothing made.
        wide = subprocess.run(
            [*cli, "topics", "create", "--fleet", "newco"],
            env={**d.env(), "AGENTLEDGER_TOPIC_REPLICATION": "3"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert wide.returncode == 1, wide.stdout + wide.stderr
        said = " ".join(wide.stderr.split())
        assert said.startswith("error: creating topic ") and "unexpected" not in said, said
        assert "AGENTLEDGER_TOPIC_REPLICATION is 3: at most the cluster's brokers" in said, said

        # The deliberate step, then the same file goes.
        d.fleets.append("newco")  # (dropped with the deployment)
        made = subprocess.run(
            [*cli, "topics", "create", "--fleet", "newco"],
            env=d.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert made.returncode == 0 and f"created {ledger}" in made.stdout, made.stderr
        assert "kept forever" in made.stdout
        again = subprocess.run(
            [*cli, "publish", str(path)], env=d.env(), capture_output=True, text=True, timeout=120
        )
        assert again.returncode == 0 and "published 2 entries (newco=2)" in again.stdout, (
            again.stdout + again.stderr
        )
    finally:
        d.drop()


def test_rebuild_verify_dlq_and_topics_see_a_fleet_made_after_start_up(
    services: Settings, tmp_path: Path
) -> None:
    """One notion of the fleets that exist (issue 25): a fleet made by `topics create --fleet`
    after the worker started, not named by AGENTLEDGER_FLEETS, is rebuilt, verified, listed."""
    d = PrivateDeployment(services, "fleetsee", ["fleet-01"], tmp_path)
    asyncio.run(d.create())
    cli = [sys.executable, "-m", "infra.main"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], env=d.env(), capture_output=True, text=True, timeout=300
        )

    try:
        d.start_worker("w")
        d.wait_partitions("w")
        d.fleets.append("later")  # (dropped with the deployment)
        assert run("topics", "create", "--fleet", "later").returncode == 0
        runs = {"run-f1": "fleet-01", "run-later": "later"}
        for run_id, fleet in runs.items():
            b = EntryBuilder(run_id, fleet_id=fleet)
            b.add(EntryKind.RUN_STARTED)
            b.add(EntryKind.RUN_FINISHED, run_status=RunStatus.SUCCEEDED)

            async def publish(entries: list[LedgerEntry] = b.entries) -> None:
                async with AsyncPublisher(d.settings) as publisher:
                    await publisher.publish_batch(entries)

            asyncio.run(publish())
        deadline = time.monotonic() + 60
        while len(live_states(d.settings, "run-stats", list(runs))) < 2:
            assert time.monotonic() < deadline, d.log_of("w").read_text()[-3000:]
            time.sleep(0.3)

        listed = run("topics", "list", "--json")
        assert json.loads(listed.stdout)["fleets"] == ["fleet-01", "later"], listed.stderr
        verified = run("verify", "run-stats", "--json")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert json.loads(verified.stdout)[0]["runs"] == 2
        rebuilt = run("rebuild", "run-stats", "--from-beginning", "--swap")
        assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
        assert set(live_states(d.settings, "run-stats", list(runs))) == set(runs)
        dead = run("dlq", "list", "--json")
        assert dead.returncode == 0 and json.loads(dead.stdout) == [], dead.stderr
    finally:
        d.drop()
