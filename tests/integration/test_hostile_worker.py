"""`agentledger worker` processes under hostile traffic on the real stack (issue 13).

Over 10,000 adversarial records (random bytes, empty and null values, the magic header with a
random body, unknown fingerprints, truncated and bit-flipped valid records, wrong and missing
keys, records near the broker's size limit, entries that break the contract) interleaved with
over 5,000 good ones, while a second worker joins (a rebalance mid-stream): every good entry is
applied exactly once, every bad record is dead-lettered with its reason or, if it is a valid
entry after all, applied; no worker exits, none stalls, and ``verify --all`` finds the live
projections equal to a clean replay. And: Redis flushed while the pipeline is idle comes back
without new traffic.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
import redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from infra.settings import Settings
from projectors.registry import all_projections
from projectors.stores.redis import delete_matching, view_key
from schemas.codec import LedgerCodec
from schemas.errors import LedgerDecodeError
from schemas.models import LedgerEntry
from schemas.topics import ledger_topic
from streams.contract import check_record
from streams.deployment import PrivateDeployment
from streams.dlq import read_dead_letters
from streams.simulate import simulate

pytestmark = pytest.mark.integration

FLEETS = ["fleet-01", "fleet-02"]
CODEC = LedgerCodec()
RAW = LedgerCodec(validate=False)
Record = tuple[str, bytes | None, bytes | None]  # (fleet, key, value)


@pytest.fixture
def deployment(services: Settings, tmp_path: Path) -> Iterator[PrivateDeployment]:
    worker_env = {
        "AGENTLEDGER_WORKER_SESSION_TIMEOUT_S": "6",
        "AGENTLEDGER_WORKER_BATCH_SIZE": "1000",
        "AGENTLEDGER_WORKER_VIEW_CHECK_S": "0.5",
    }
    d = PrivateDeployment(services, "hostile", FLEETS, tmp_path, worker_env)
    asyncio.run(d.create())
    yield d
    d.drop()


def _adversarial(rng: random.Random, victims: list[LedgerEntry], n: int) -> list[Record]:
    """``n`` hostile records made from ``victims`` (entries of runs no good entry belongs to, so
    that a flip which still decodes touches no good run)."""
    fingerprint = CODEC.writer.fingerprint
    makers: list[Callable[[LedgerEntry, str], Record]] = [
        lambda v, f: (f, b"k", bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300)))),
        lambda v, f: (f, b"k", b""),
        lambda v, f: (f, b"k", None),  # a tombstone: no value at all
        lambda v, f: (f, b"k", b"\xc3\x01" + fingerprint + rng.randbytes(rng.randrange(0, 400))),
        lambda v, f: (f, v.run_id.encode(), b"\xc3\x01" + rng.randbytes(8) + CODEC.encode(v)[10:]),
        lambda v, f: (f, v.run_id.encode(), CODEC.encode(v)[: rng.randrange(1, 200)]),
        lambda v, f: (f, v.run_id.encode(), _flip(rng, CODEC.encode(v))),
        lambda v, f: (f, v.run_id.encode(), _flip(rng, _flip(rng, CODEC.encode(v)))),
        lambda v, f: (f, b"not-the-run", CODEC.encode(v)),  # wrong key
        lambda v, f: (f, None, CODEC.encode(v)),  # missing key
        lambda v, f: (f, v.run_id.encode(), CODEC.encode(v) + rng.randbytes(3)),
        lambda v, f: (f, v.run_id.encode(), RAW.encode(_broken(rng, v))),  # breaks the contract
        lambda v, f: (_other(f), v.run_id.encode(), CODEC.encode(v)),  # another fleet's topic
    ]
    out: list[Record] = []
    for i in range(n):
        victim = victims[i % len(victims)]
        out.append(rng.choice(makers)(victim, victim.fleet_id))
    for size in (700_000, 900_000, 1_000_000):  # near the broker's 1 MiB message limit
        out.append(("fleet-01", b"big", b"\xc3\x01" + rng.randbytes(size)))
    return out


def _other(fleet: str) -> str:
    return FLEETS[1] if fleet == FLEETS[0] else FLEETS[0]


def _flip(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data))
    return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]


def _broken(rng: random.Random, v: LedgerEntry) -> LedgerEntry:
    return rng.choice(
        [
            v.model_copy(update={"fleet_id": "no such fleet!"}),
            v.model_copy(update={"occurred_at": datetime(9999, 1, 1, tzinfo=UTC)}),
            v.model_copy(update={"sequence_no": 2**62}),
            v.model_copy(update={"run_id": "has spaces and \x00 a NUL"}),
            v.model_copy(update={"trace_id": "zz"}),
            v.model_copy(update={"metadata": {"key with spaces": "v"}}),
        ]
    )


async def _produce(settings: Settings, records: list[Record]) -> list[tuple[str, int, int]]:
    """Send in this order; return each record's (topic, partition, offset)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_address,
        acks="all",
        linger_ms=5,
        max_request_size=1_048_576,
    )
    await producer.start()
    try:
        futures = []
        for fleet, key, value in records:
            topic = ledger_topic(settings.topic_prefix, fleet)
            futures.append(await producer.send(topic, value, key=key))
        metadata = [await f for f in futures]
    finally:
        await producer.stop()
    return [(m.topic, m.partition, m.offset) for m in metadata]


def _valid_here(topic: str, key: bytes | None, value: bytes | None) -> bool:
    """Whether a record holds an entry the contract accepts (the worker may still refuse it
    for its run: another partition, too far ahead)."""
    try:
        entry = CODEC.decode(value or b"")
    except LedgerDecodeError:
        return False
    return check_record(entry, topic, key, None) is None


async def _end_offsets(settings: Settings) -> dict[tuple[str, int], int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_address)
    await consumer.start()
    try:
        tps = [
            TopicPartition(ledger_topic(settings.topic_prefix, f), p)
            for f in FLEETS
            for p in range(settings.topic_partitions)
        ]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {(tp.topic, tp.partition): o for tp, o in ends.items()}


def _stored_offsets(d: PrivateDeployment) -> dict[str, dict[tuple[str, int], int]]:
    with psycopg.connect(d.settings.pg_address) as conn:
        rows = conn.execute(
            'SELECT o.projection, o.topic, o.partition, o."offset" FROM al_offsets o '
            "JOIN al_live l USING (projection, build)"
        ).fetchall()
    out: dict[str, dict[tuple[str, int], int]] = {}
    for projection, topic, partition, offset in rows:
        out.setdefault(projection, {})[(topic, partition)] = offset
    return out


def _wait_caught_up(
    d: PrivateDeployment, ends: dict[tuple[str, int], int], timeout_s: float
) -> None:
    """Every live projection's stored offset at the end of every non-empty partition."""
    deadline = time.monotonic() + timeout_s
    wanted = {tp: end - 1 for tp, end in ends.items() if end > 0}
    stored: dict[str, dict[tuple[str, int], int]] = {}
    while time.monotonic() < deadline:
        stored = _stored_offsets(d)
        if len(stored) == len(all_projections()) and all(
            all(by_tp.get(tp, -1) >= last for tp, last in wanted.items())
            for by_tp in stored.values()
        ):
            return
        time.sleep(0.5)
    behind = {
        p: {tp: (by_tp.get(tp), last) for tp, last in wanted.items() if by_tp.get(tp, -1) < last}
        for p, by_tp in stored.items()
    }
    raise AssertionError(f"stalled: positions behind the end after {timeout_s}s: {behind}")


def _good_rows(d: PrivateDeployment, runs: set[str]) -> dict[str, tuple[int, int, list[int]]]:
    """run-stats of the good runs: (applied_seq, entries counted, held)."""
    with psycopg.connect(d.settings.pg_address) as conn:
        rows = conn.execute(
            "SELECT run_id, applied_seq, (coalesce(head, state)->>'entries')::int, held "
            "FROM al_run_state "
            "JOIN al_live USING (projection, build) WHERE projection = 'run-stats' "
            "AND run_id = ANY(%s)",
            (sorted(runs),),
        ).fetchall()
    return {r: (seq, n, list(held)) for r, seq, n, held in rows}


def _assert_alive(d: PrivateDeployment, workers: list[subprocess.Popen[bytes]]) -> None:
    for name, worker in zip(("a", "b"), workers, strict=True):
        log = d.log_of(name).read_text(errors="replace")
        assert worker.poll() is None, f"worker {name} exited ({worker.returncode}): {log[-3000:]}"
        assert "non-retriable failure" not in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]


def test_adversarial_records_never_stop_or_stall_a_worker(deployment: PrivateDeployment) -> None:
    d = deployment
    rng = random.Random(1313)
    good = simulate(len(FLEETS), 90, seed=131)
    victims = [e for e in simulate(len(FLEETS), 40, seed=132)]
    bad = _adversarial(rng, victims, 10_000)
    records: list[Record] = [(e.fleet_id, e.run_id.encode(), CODEC.encode(e)) for e in good]
    is_bad = [False] * len(records)
    for record in bad:  # interleaved; each good run keeps its own order
        at = rng.randrange(len(records) + 1)
        records.insert(at, record)
        is_bad.insert(at, True)
    assert len(good) >= 5000 and len(bad) >= 10_000

    a = d.start_worker("a")
    workers = [a]
    try:
        d.wait_partitions("a")
        half = len(records) // 2
        positions = asyncio.run(_produce(d.settings, records[:half]))
        b = d.start_worker("b")  # a rebalance while records are being applied
        workers.append(b)
        positions += asyncio.run(_produce(d.settings, records[half:]))
        _wait_caught_up(d, asyncio.run(_end_offsets(d.settings)), timeout_s=420)
        _assert_alive(d, workers)

        lengths: dict[str, int] = {}
        for e in good:
            lengths[e.run_id] = max(lengths.get(e.run_id, 0), e.sequence_no)
        rows = _good_rows(d, set(lengths))
        assert rows == {r: (n, n, []) for r, n in lengths.items()}, "each good entry once"

        letters = {d_.source: d_ for d_ in asyncio.run(read_dead_letters(d.settings, FLEETS))}
        victim_runs = {v.run_id for v in victims}
        unaccounted = []
        for (_fleet, key, value), bad_one, where in zip(records, is_bad, positions, strict=True):
            if not bad_one:
                assert where not in letters, "a good entry was dead-lettered"
                continue
            if where in letters:
                assert letters[where].error_class and letters[where].message
            elif not _valid_here(where[0], key, value):
                unaccounted.append(where)
            else:  # a valid entry after all (a flip that still decodes): applied to its run
                assert CODEC.decode(value or b"").run_id in victim_runs | {"big"}
        assert not unaccounted, f"{len(unaccounted)} bad records neither applied nor dead-lettered"
        assert len(letters) >= 9000, "nearly all of them are poison"
        truncated = [x for x in letters.values() if x.truncated]
        assert len(truncated) >= 2, "the records near 1 MiB keep a bounded copy"

        verify = subprocess.run(
            [sys.executable, "-m", "infra.main", "verify", "--all"],
            env=d.env(),
            capture_output=True,
            timeout=600,
        )
        assert verify.returncode == 0, (
            verify.stdout.decode()[-3000:] + verify.stderr.decode()[-3000:]
        )
        _assert_alive(d, workers)
    finally:
        for worker in workers:
            _stop(worker)


def test_views_lost_while_idle_come_back_without_new_traffic(
    deployment: PrivateDeployment,
) -> None:
    d = deployment
    entries = simulate(len(FLEETS), 10, seed=141)
    records: list[Record] = [(e.fleet_id, e.run_id.encode(), CODEC.encode(e)) for e in entries]
    worker = d.start_worker("a")
    client = redis.Redis.from_url(d.settings.redis_address)
    try:
        d.wait_partitions("a")
        asyncio.run(_produce(d.settings, records))
        _wait_caught_up(d, asyncio.run(_end_offsets(d.settings)), timeout_s=120)
        live = client.get(f"{d.settings.redis_prefix}:live:working-memory")
        assert isinstance(live, bytes)
        key = view_key(d.settings.redis_prefix, "working-memory", live.decode(), entries[0].run_id)
        _wait_for(lambda: bool(client.exists(key)), 30, "the view before the flush")
        assert delete_matching(client, f"{d.settings.redis_prefix}:*") > 0  # Redis lost it all
        assert not client.exists(key)
        _wait_for(lambda: bool(client.exists(key)), 20, "the view refilled while idle")
        assert client.get(f"{d.settings.redis_prefix}:live:working-memory") == live
        assert worker.poll() is None
    finally:
        client.close()
        _stop(worker)


def _wait_for(condition: object, timeout_s: float, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
