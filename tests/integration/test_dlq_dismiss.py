"""Dead letters on the real broker and PostgreSQL: each listed with its run, one dismissed with a
reason (kept, shown, and left alone by redrive), the others still pending."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from infra.main import app
from infra.settings import Settings
from schemas.codec import LedgerCodec
from schemas.factory import EntryBuilder
from schemas.models import EntryKind
from streams.dlq import redrive
from streams.source import drain
from tests.integration.engine_support import make_env, produce_raw

pytestmark = pytest.mark.integration


def test_dismissed_dead_letters_are_kept_shown_and_left_alone(services: Settings) -> None:
    # (not a coroutine: the CLI below runs its own event loops)
    env = asyncio.run(make_env(services, fleets=("fleet-a",)))
    b = EntryBuilder("run-dlq", fleet_id="fleet-a")
    good = [b.add(EntryKind.USER_TASK) for _ in range(3)]
    wrong_key = LedgerCodec().encode(b.add(EntryKind.USER_TASK))

    async def apply() -> int:
        await produce_raw(env, [*good, b"\x00garbage"], key=b"run-dlq")
        await produce_raw(env, [wrong_key], key=b"someone-else")  # decodes: its run is known
        async with env.engine() as engine:
            stats = await drain(engine, env.settings.kafka_address, env.topics)
        return stats.dead_lettered

    assert asyncio.run(apply()) == 2

    runner = CliRunner()
    cli_env = {
        "AGENTLEDGER_PG_DSN": env.settings.pg_address,
        "AGENTLEDGER_KAFKA_BOOTSTRAP": env.settings.kafka_address,
        "AGENTLEDGER_TOPIC_PREFIX": env.settings.topic_prefix,
    }
    listed = runner.invoke(app, ["dlq", "list", "--fleet", "fleet-a", "--json"], env=cli_env)
    assert listed.exit_code == 0, listed.output
    letters = json.loads(listed.stdout)
    assert sorted(r["run_id"] for r in letters) == ["run-dlq", "run-dlq"]
    assert all(r["dismissed"] is None for r in letters)
    garbage = next(r for r in letters if r["error_class"] != "RecordContractError")

    done = runner.invoke(
        app,
        ["dlq", "dismiss", garbage["source"], "--reason", "test noise", "--fleet", "fleet-a"],
        env=cli_env,
    )
    assert done.exit_code == 0, done.output
    assert "dismissed" in done.stdout
    again = runner.invoke(
        app,
        ["dlq", "dismiss", garbage["source"], "--reason", "other", "--fleet", "fleet-a"],
        env=cli_env,
    )
    assert "already dismissed (first reason kept)" in again.stdout
    missing = runner.invoke(
        app,
        ["dlq", "dismiss", f"{garbage['source']}9", "--reason", "x", "--fleet", "fleet-a"],
        env=cli_env,
    )
    assert missing.exit_code != 0

    listed = runner.invoke(app, ["dlq", "list", "--fleet", "fleet-a", "--json"], env=cli_env)
    by_source = {r["source"]: r for r in json.loads(listed.stdout)}
    assert by_source[garbage["source"]]["dismissed"]["reason"] == "test noise"
    assert sum(1 for r in by_source.values() if r["dismissed"] is None) == 1
    table = runner.invoke(app, ["dlq", "list", "--fleet", "fleet-a"], env=cli_env)
    assert "2 dead letters, 1 pending" in table.stdout

    report = asyncio.run(redrive(env.settings, env.fleets))
    assert report.dismissed == 1
    assert report.redriven + len(report.still_bad) == 1
