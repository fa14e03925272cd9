"""`agentledger import claude-code FOLDER --follow` on a session being written: new lines appear
on the ledger and in the projections within 2 s, a partly written line waits, and after the
importer is SIGKILLed and started again nothing is lost or doubled."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from consumers.views import live_states
from infra.settings import Settings
from schemas.topics import ledger_topic
from streams.deployment import PrivateDeployment
from streams.importers import claude_code
from streams.source import read_all
from tests.packs import SHARED

pytestmark = pytest.mark.integration

SAMPLE = SHARED / "samples" / "claude-code" / "codemie-incremental-subagents" / "turn-2.jsonl"
FLEET = "follow"


def _expected(path: Path) -> int:
    """Entries a settled import of the file as it stands gives (what must be on the ledger)."""
    runs, _ = claude_code.import_file(path, FLEET, settled=True)
    return len(runs[0].entries) if runs else 0


def _applied(d: PrivateDeployment, run_id: str) -> int:
    found = live_states(d.settings, "run-stats", [run_id]).get(run_id)
    return int(found["applied_seq"]) if found is not None else 0


def _wait_for(d: PrivateDeployment, run_id: str, seq: int, timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if _applied(d, run_id) >= seq:
            return time.monotonic() - start
        time.sleep(0.05)
    pytest.fail(f"{run_id} not applied through {seq} within {timeout_s}s ({_applied(d, run_id)})")


def test_follow_publishes_new_lines_within_2_s_and_survives_a_kill(
    services: Settings, tmp_path: Path
) -> None:
    lines = SAMPLE.read_bytes().splitlines(keepends=True)
    d = PrivateDeployment(services, "follow", [FLEET], tmp_path / "logs")
    asyncio.run(d.create())
    folder = tmp_path / "projects" / "p"
    folder.mkdir(parents=True)
    session = folder / SAMPLE.name
    args = ["-m", "infra.main", "import", "claude-code", str(tmp_path / "projects")]
    args += ["--fleet", FLEET, "--follow", "--poll-s", "0.2"]
    try:
        d.start_worker("w")
        d.wait_partitions("w")
        session.write_bytes(b"".join(lines[:10]))
        importer = d.start_process("importer", args)
        run_id = claude_code.import_file(session, FLEET)[0][0].run_id
        _wait_for(d, run_id, _expected(session), 30)  # the first pass, producer start included
        waits = []
        cut = len(lines) // 2
        for at in range(10, cut, 6):
            with session.open("ab") as f:
                f.write(b"".join(lines[at : min(at + 6, cut)]))
            written = time.monotonic()
            waits.append(_wait_for(d, run_id, _expected(session), 10))
            assert time.monotonic() - written >= waits[-1]
        print(f"follow: new lines projected after {max(waits):.2f}s at most ({len(waits)} appends)")
        assert max(waits) <= 2.0, waits

        # half a line: waited for, not rejected (what stands before it may go settled or whole)
        before = {_expected(session), len(claude_code.import_file(session, FLEET)[0][0].entries)}
        half = lines[cut][: len(lines[cut]) // 2]
        with session.open("ab") as f:
            f.write(half)
        time.sleep(1.0)
        assert _applied(d, run_id) in before and importer.poll() is None

        # SIGKILL the importer, write the rest (finishing the half line), start it again
        os.killpg(importer.pid, signal.SIGKILL)
        importer.wait(timeout=30)
        with session.open("ab") as f:
            f.write(lines[cut][len(half) :])
            f.write(b"".join(lines[cut + 1 :]))
        d.start_process("importer-2", args)
        whole = claude_code.import_file(session, FLEET)[0][0]
        _wait_for(d, run_id, len(whole.entries), 30)
        time.sleep(1.0)  # nothing more may come
        records = asyncio.run(
            read_all(d.settings.kafka_address, [ledger_topic(d.settings.topic_prefix, FLEET)])
        )
        mine = [r for r in records if r.key == run_id.encode()]
        assert len(mine) == len(whole.entries)  # nothing lost, nothing sent twice
        assert _applied(d, run_id) == len(whole.entries)
    finally:
        d.drop()
