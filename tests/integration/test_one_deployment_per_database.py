"""One deployment per database: a worker, a rebuild or `infra up` of another topic prefix is
refused on a database that holds a deployment (migration 024), with what to do, and changes
nothing there."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from infra.errors import DeploymentMismatchError
from infra.migrate import claim
from infra.settings import Settings
from streams.deployment import PrivateDeployment

pytestmark = pytest.mark.integration


@pytest.fixture
def deployment(services: Settings, tmp_path: Path) -> Iterator[PrivateDeployment]:
    d = PrivateDeployment(services, "onedb", ["fleet-01"], tmp_path)
    asyncio.run(d.create())  # claims its database for its prefix
    yield d
    d.drop()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_another_prefix_is_refused_on_a_database_that_holds_a_deployment(
    deployment: PrivateDeployment,
) -> None:
    d = deployment
    mine = d.settings.topic_prefix
    claim(d.settings.pg_address, mine)  # the holder again: fine, any number of times
    with pytest.raises(DeploymentMismatchError, match=f"topic prefix '{mine}', not 'other'"):
        claim(d.settings.pg_address, "other")

    with psycopg.connect(d.settings.pg_address) as conn:
        builds = conn.execute("SELECT count(*) FROM al_builds").fetchone()
    other = {**d.env(), "AGENTLEDGER_TOPIC_PREFIX": "other"}
    for args, code in (
        (("worker", "--projections", "run-stats"), 78),  # the supervisor is never started
        (("worker", "--no-restart", "--projections", "run-stats"), 78),  # misconfigured
        (("rebuild", "run-stats", "--from-beginning"), 1),
        (("verify", "run-stats"), 1),
    ):
        done = _cli(other, *args)
        assert done.returncode == code, (args, done.stdout, done.stderr)
        said = " ".join(done.stderr.split())
        assert f"holds the deployment with topic prefix '{mine}', not 'other'" in said, said
        assert "AGENTLEDGER_PG_DSN" in said and f"AGENTLEDGER_TOPIC_PREFIX={mine}" in said
        assert "postgresql://" not in said  # the database's name only, never its address
    with psycopg.connect(d.settings.pg_address) as conn:
        assert conn.execute("SELECT topic_prefix FROM al_deployment").fetchall() == [(mine,)]
        assert conn.execute("SELECT count(*) FROM al_builds").fetchone() == builds  # no build


def test_a_database_used_before_claims_is_held_by_the_deployment_its_live_builds_follow(
    deployment: PrivateDeployment,
) -> None:
    """Found by a review: after the upgrade, whatever started first (a shell without
    AGENTLEDGER_TOPIC_PREFIX, a rebuild drop) claimed the database, and the deployment's own
    workers were refused at their next restart."""
    d = deployment
    with psycopg.connect(d.settings.pg_address, autocommit=True) as conn:
        conn.execute("DELETE FROM al_deployment")  # as before migration 024
        conn.execute("INSERT INTO al_live (projection, build) VALUES ('run-stats', 'v1')")
        conn.execute(
            'INSERT INTO al_offsets (projection, build, topic, partition, "offset") '
            "VALUES ('run-stats', 'v1', 'prod.ledger.fleet-01', 0, 41), "
            "('run-stats', 'scratch', 'e1234.ledger.fleet-01', 0, 9)"  # not a live build's
        )
    with pytest.raises(DeploymentMismatchError, match="topic prefix 'prod', not 'agentledger'"):
        claim(d.settings.pg_address, "agentledger")
    claim(d.settings.pg_address, "prod")
    with psycopg.connect(d.settings.pg_address) as conn:
        assert conn.execute("SELECT topic_prefix FROM al_deployment").fetchall() == [("prod",)]
