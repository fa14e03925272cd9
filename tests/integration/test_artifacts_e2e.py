"""Content over the entry limit, end to end on the real services: `agentledger publish` moves a
tool output too large for an entry into the artifact store (secret redacted before the write),
the ledger entry carries the ref, a worker folds the run, `artifact get` reads the content back,
and the run's replay package carries the artifact and loads."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.settings import Settings
from schemas.factory import sample_run
from schemas.json_form import from_json_text, to_json_text
from schemas.models import EntryKind, RedactionLevel, ToolResultPart
from streams.deployment import PrivateDeployment
from tests.integration.engine_support import current_states

pytestmark = pytest.mark.integration

LIMIT = 32 * 1024


@pytest.fixture
def deployment(services: Settings, tmp_path: Path) -> Iterator[PrivateDeployment]:
    env = {
        "AGENTLEDGER_MAX_ENTRY_BYTES": str(LIMIT),
        "AGENTLEDGER_ARTIFACT_DIR": str(tmp_path / "artifacts"),
    }
    d = PrivateDeployment(services, "artifacts", ["fleet-a"], tmp_path, env)  # sample_run's
    asyncio.run(d.create())
    yield d
    d.drop()


def _cli(d: PrivateDeployment, *args: str) -> subprocess.CompletedProcess[bytes]:
    exe = Path(sys.executable).with_name("agentledger")
    return subprocess.run(
        [str(exe), *args], env=d.env(), capture_output=True, timeout=300, check=False
    )


def _big_output(secret: str) -> str:
    rng = random.Random(26)
    lines = [
        f"tests/test_orders.py::test_page_{n} {rng.choice(['PASSED', 'FAILED'])} [{n % 100}%]"
        for n in range(3000)
    ]
    lines.insert(1500, f"AWS_ACCESS_KEY_ID={secret}")
    return "\n".join(lines)


def _wait_applied(d: PrivateDeployment, run_id: str, last: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while current_states(d.settings.pg_address, "run-stats").get(run_id, (0, None))[0] < last:
        assert time.monotonic() < deadline, "the worker did not apply the run in time"
        time.sleep(0.3)


def test_an_output_over_the_limit_goes_to_the_store_and_comes_back(
    deployment: PrivateDeployment, tmp_path: Path
) -> None:
    d = deployment
    secret = "AKIA" + "".join(random.Random(7).choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", k=16))
    output = _big_output(secret)
    assert len(output) > 2 * LIMIT
    run_id = f"run-art-{uuid.uuid4().hex[:8]}"
    run = sample_run(run_id)
    at = next(i for i, e in enumerate(run) if e.kind is EntryKind.TOOL_CALL_RESULT)
    [result] = run[at].parts
    assert isinstance(result, ToolResultPart)
    run[at] = run[at].model_copy(update={"parts": (result.model_copy(update={"summary": output}),)})
    source = tmp_path / "run.jsonl"
    source.write_text("".join(to_json_text(e) + "\n" for e in run))

    published = _cli(d, "publish", str(source))
    assert published.returncode == 0, published.stderr.decode()
    assert secret.encode() not in published.stdout + published.stderr

    worker = d.start_worker("w")
    try:
        _wait_applied(d, run_id, len(run))
    finally:
        d.stop_worker(worker)

    package = tmp_path / "package"
    packed = _cli(d, "replay-package", run_id, "--out", str(package))
    assert packed.returncode == 0, packed.stderr.decode()
    assert b"1 of " in packed.stdout, "the stored artifact is included, the factory's are not"
    # The ledger entry, as read back from the topic, has a ref and a preview, not the output.
    entries = [
        from_json_text(line) for line in (package / "entries.jsonl").read_text().split("\n") if line
    ]
    [sent] = entries[at].parts
    assert isinstance(sent, ToolResultPart) and len(sent.summary) < 3000
    *_, ref = sent.artifact_refs  # after the factory's own ref
    assert len(sent.artifact_refs) == len(result.artifact_refs) + 1
    assert ref.artifact_id in sent.summary and ref.redaction_level is RedactionLevel.RESTRICTED
    assert any(r.field == "parts[0].summary" for r in entries[at].redactions)

    got = _cli(d, "artifact", "get", ref.sha256)
    assert got.returncode == 0, got.stderr.decode()
    assert hashlib.sha256(got.stdout).hexdigest() == ref.sha256
    assert got.stdout == output.replace(secret, "[REDACTED:aws-access-token]").encode()
    by_prefix = _cli(d, "artifact", "get", ref.artifact_id[:20], "--out", str(tmp_path / "o.txt"))
    assert by_prefix.returncode == 0 and (tmp_path / "o.txt").read_bytes() == got.stdout
    stored = b"".join(p.read_bytes() for p in (tmp_path / "artifacts").rglob("*") if p.is_file())
    assert secret.encode() not in stored

    manifest = json.loads((package / "package.json").read_text())
    listed = {a["sha256"]: a for a in manifest["artifacts"]}
    assert listed[ref.sha256]["included"] and not all(a["included"] for a in listed.values())
    assert (package / "artifacts" / ref.sha256).read_bytes() == got.stdout
    loaded = _cli(d, "replay-package", "load", str(package))
    assert loaded.returncode == 0, loaded.stderr.decode()
    assert json.loads(loaded.stdout)["run_id"] == run_id
    (package / "artifacts" / ref.sha256).write_bytes(b"tampered")
    tampered = _cli(d, "replay-package", "load", str(package))
    assert tampered.returncode == 1 and b"does not match its sha256" in tampered.stderr

    missing = _cli(d, "artifact", "get", "0" * 64)
    assert missing.returncode == 1 and len(missing.stderr.decode().strip().splitlines()) == 1
