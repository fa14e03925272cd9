"""`agentledger publish FILE.jsonl` on the real broker: checked whole first, invalid lines
reported; nothing sent unless --partial, which sends the runs without an invalid line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from infra.admin import create_fleet_topics
from infra.settings import Settings
from schemas.codec import LedgerCodec
from schemas.json_form import to_json, to_json_text
from schemas.topics import ledger_topic
from streams.simulate import simulate_runs
from streams.source import read_all

pytestmark = pytest.mark.integration


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AGENTLEDGER_KAFKA_BOOTSTRAP": settings.kafka_address,
        "AGENTLEDGER_TOPIC_PREFIX": settings.topic_prefix,
        # no PostgreSQL: the fleet check cannot be made, and publish says so
        "AGENTLEDGER_PG_DSN": "postgresql://postgres@127.0.0.1:9/agentledger",
    }
    exe = Path(sys.executable).with_name("agentledger")
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


async def test_an_invalid_line_means_nothing_sent_and_partial_sends_the_valid_runs(
    services: Settings, tmp_path: Path
) -> None:
    settings = services.model_copy(update={"topic_prefix": f"p{uuid.uuid4().hex[:8]}"})
    run_a, run_b = list(simulate_runs(1, 2, seed=11))
    bad_kind = to_json(run_b[0]) | {"kind": "TELEPATHY"}
    missing = {k: v for k, v in to_json(run_b[0]).items() if k != "run_id"}
    wrong_type = to_json(run_b[0]) | {"sequence_no": "one"}
    lines = [to_json_text(e) for e in run_a]
    lines += ["{not json", json.dumps(bad_kind), json.dumps(missing), json.dumps(wrong_type)]
    lines.append(to_json_text(run_b[1]))  # valid, but its run has invalid lines
    path = tmp_path / "entries.jsonl"
    path.write_text("\n".join(lines) + "\n")
    topic = ledger_topic(settings.topic_prefix, "fleet-01")
    await create_fleet_topics(settings, ["fleet-01"])  # the deliberate step before a publish

    proc = _cli(settings, "publish", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    n = len(run_a)
    for number, field in (
        (n + 1, "entry"),
        (n + 2, "kind"),
        (n + 3, "run_id"),
        (n + 4, "sequence_no"),
    ):
        assert f"line {number}: {field}" in proc.stderr
    assert f"line {n + 5}:" not in proc.stderr
    assert "nothing sent: 4 invalid lines" in proc.stdout, proc.stdout
    assert not await read_all(settings.kafka_address, [topic]), "nothing reached Kafka"

    proc = _cli(settings, "publish", "--partial", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"published {n} entries" in proc.stdout
    assert "note: PostgreSQL did not answer: the runs' fleets on the ledger were not checked" in (
        proc.stderr
    )
    assert "1 valid entries of 1 runs with an invalid line held back" in proc.stdout, proc.stdout
    assert "harmless" in proc.stdout

    records = await read_all(
        settings.kafka_address, [ledger_topic(settings.topic_prefix, "fleet-01")]
    )
    values = [r.value for r in records if r.value is not None]
    decoded = LedgerCodec().decode_many(values)
    assert sorted(e.entry_id for e in decoded) == sorted(e.entry_id for e in run_a)


async def test_a_run_is_refused_a_second_fleet_in_the_file_or_on_the_ledger(
    services: Settings, tmp_path: Path
) -> None:
    """A run belongs to one fleet (found trying the product: `publish` sent a run already in
    fleet-01 to another fleet, exit 0; the worker dead-lettered it, and the replays of rebuild
    and verify gave the run the fleet whose topic they happened to read first)."""
    from consumers.views import live_states
    from streams.deployment import PrivateDeployment

    d = PrivateDeployment(services, "onefleet", ["fleet-01", "fleet-02"], tmp_path / "logs")
    await d.create()
    try:
        d.start_worker("w")
        d.wait_partitions("w")
        [run] = list(simulate_runs(1, 1, seed=5))
        first = tmp_path / "first.jsonl"
        first.write_text("".join(to_json_text(e) + "\n" for e in run))
        env = {**d.env()}
        exe = str(Path(sys.executable).with_name("agentledger"))

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [exe, *args], capture_output=True, text=True, env=env, timeout=120, check=False
            )

        assert cli("publish", str(first)).returncode == 0
        deadline = asyncio.get_running_loop().time() + 60
        while live_states(d.settings, "run-stats", [run[0].run_id]).get(run[0].run_id) is None:
            assert asyncio.get_running_loop().time() < deadline, "the run was not applied"
            await asyncio.sleep(0.3)

        def refused(name: str, entries: list[Any], why: str) -> None:
            path = tmp_path / name
            path.write_text("".join(to_json_text(e) + "\n" for e in entries))
            done = cli("publish", str(path))
            assert done.returncode == 2, done.stdout + done.stderr
            assert why in done.stderr, done.stderr
            assert "nothing sent" in done.stdout

        moved = [e.model_copy(update={"fleet_id": "fleet-02"}) for e in run]
        refused(
            "second.jsonl",
            moved,
            f"line 1: run {run[0].run_id} is on the ledger in fleet fleet-01, not fleet-02",
        )
        # one file naming two fleets for one run: refused at the first line of the second
        [other] = list(simulate_runs(1, 1, seed=6))
        mixed = [other[0], *(e.model_copy(update={"fleet_id": "fleet-02"}) for e in other[1:])]
        refused(
            "both.jsonl",
            mixed,
            f"line 2: run {other[0].run_id} is in fleet fleet-02 here and fleet-01 on line 1",
        )
        topic = ledger_topic(d.settings.topic_prefix, "fleet-02")
        assert not await read_all(d.settings.kafka_address, [topic]), "nothing reached fleet-02"
    finally:
        d.drop()
