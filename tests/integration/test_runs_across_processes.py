"""One run written by several processes in turn (an orchestrator and its agent, an agent that
restarts), on the real broker and PostgreSQL: every entry arrives and the run is gapless."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.settings import Settings
from schemas.codec import LedgerCodec
from schemas.factory import EntryBuilder
from schemas.json_form import to_json_text
from schemas.models import EntryKind, RunStatus
from streams.source import drain, read_all
from tests.integration.engine_support import make_env, run_rows

pytestmark = pytest.mark.integration

# A process that numbers the entries itself (assign-sequence mode), continuing the run from
# where the ledger stands: the numbers in the file are ignored.
ASSIGNING = """
import asyncio, sys
from infra.settings import load_settings
from schemas.json_form import from_json_text
from streams.publisher import AsyncPublisher

async def main() -> None:
    entries = [from_json_text(line) for line in open(sys.argv[1], "rb") if line.strip()]
    async with AsyncPublisher(load_settings()) as publisher:
        sent = await publisher.publish_batch(entries, assign_sequence=True)
    print(",".join(str(e.sequence_no) for e in sent))

asyncio.run(main())
"""


def _env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "AGENTLEDGER_KAFKA_BOOTSTRAP": settings.kafka_address,
        "AGENTLEDGER_TOPIC_PREFIX": settings.topic_prefix,
    }


def _publish(settings: Settings, path: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("agentledger")
    return subprocess.run(
        [str(exe), "publish", str(path)],
        capture_output=True,
        text=True,
        env=_env(settings),
        timeout=120,
        check=False,
    )


async def test_a_run_written_by_three_processes_in_turn_is_complete_and_gapless(
    services: Settings, tmp_path: Path
) -> None:
    env = await make_env(services, fleets=("fleet-a",))
    b = EntryBuilder("run-shared", fleet_id="fleet-a")
    b.add(EntryKind.RUN_STARTED)
    for _ in range(4):
        b.add(EntryKind.USER_TASK)
    first, second = b.entries[:2], b.entries[2:]
    for name, part in (("first", first), ("second", second)):
        (tmp_path / f"{name}.jsonl").write_text("".join(to_json_text(e) + "\n" for e in part))

    one = _publish(env.settings, tmp_path / "first.jsonl")  # the orchestrator: 1-2
    assert one.returncode == 0, one.stdout + one.stderr
    two = _publish(env.settings, tmp_path / "second.jsonl")  # the agent, a new process: 3-5
    assert two.returncode == 0, two.stdout + two.stderr
    assert "published 3 entries" in two.stdout

    # The agent restarts and numbers its entries itself: it learns the run stands at 5.
    late = EntryBuilder("run-shared", fleet_id="fleet-a")
    for n in range(2):
        late.add(EntryKind.USER_TASK, entry_id=f"run-shared-late-{n}")
    late.add(EntryKind.RUN_FINISHED, entry_id="run-shared-end", run_status=RunStatus.SUCCEEDED)
    path = tmp_path / "late.jsonl"
    path.write_text("".join(to_json_text(e) + "\n" for e in late.entries))
    three = subprocess.run(
        [sys.executable, "-c", ASSIGNING, str(path)],
        capture_output=True,
        text=True,
        env=_env(env.settings),
        timeout=120,
        check=False,
    )
    assert three.returncode == 0, three.stdout + three.stderr
    assert three.stdout.strip() == "6,7,8"

    records = await read_all(env.settings.kafka_address, env.topics)
    entries = LedgerCodec().decode_many([r.value for r in records if r.value is not None])
    assert sorted(e.sequence_no for e in entries) == list(range(1, 9))
    assert len({e.entry_id for e in entries}) == 8
    async with env.engine() as engine:
        stats = await drain(engine, env.settings.kafka_address, env.topics)
    assert stats.applied == 8 and stats.duplicates == 0 and stats.held == 0
    row = run_rows(env)["run-shared"]
    assert row["applied_seq"] == 8 and row["gaps"] == [] and row["held"] == []
    assert row["state"]["status"] == "SUCCEEDED"
