"""Hostile records on the real stack, one defect each (issue 13): NUL bytes, deep JSON, a NUL
flipped into an id, a poison record near 1 MiB, records keyed by something other than their run,
a run split over partitions, entries that break the contract downstream, and a rebalance asking
for positions while a batch is in flight. Each ends applied or dead-lettered with its reason,
the engine moving on."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from infra.settings import Settings
from projectors.registry import all_projections
from projectors.run_stats import RunStats, RunStatsProjection
from projectors.stores.redis import RedisViewStore
from schemas.codec import LedgerCodec
from schemas.errors import LedgerValidationError
from schemas.factory import EntryBuilder
from schemas.models import EntryKind, JsonPart, LedgerEntry, TextPart, ToolResultPart
from schemas.models import ToolResultStatus as Status
from schemas.topics import ledger_topic
from streams.dlq import (
    ORIGINAL_SHA256,
    ORIGINAL_SIZE,
    KafkaDeadLetterSink,
    read_dead_letters,
    redrive,
)
from streams.engine import Engine, Target
from streams.publish_file import publish_file
from streams.publisher import SequenceBook, prepare
from streams.simulate import simulate
from streams.source import drain
from tests.integration.engine_support import Env, current_states, make_env, produce_raw, run_rows

pytestmark = pytest.mark.integration

CODEC = LedgerCodec()
RAW = LedgerCodec(validate=False)  # encodes what a raw producer might send, unchecked


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _all_targets(env: Env) -> list[Target]:
    return [Target(p, env.build) for p in all_projections()]


async def _drain_all(env: Env, timeout_s: float = 120) -> None:
    sink = KafkaDeadLetterSink(env.settings)
    engine = Engine(
        _all_targets(env),
        env.settings.pg_address,
        env.settings.redis_address,
        sink,
        redis_prefix=env.redis_prefix,
    )
    await engine.start()
    try:
        await asyncio.wait_for(
            drain(engine, env.settings.kafka_address, env.topics, batch_size=200), timeout_s
        )
    finally:
        await engine.close()
        await sink.close()


def _states(env: Env, projection: str) -> dict[str, Any]:
    found = current_states(env.settings.pg_address, projection, env.build)
    return {r: doc for r, (_seq, doc) in found.items()}


async def test_nul_bytes_in_tool_output_are_stored_and_shown_losslessly(
    services: Settings,
) -> None:
    env = await make_env(services)
    b = EntryBuilder("run-nul")
    binary = "PK\x03\x04\x00\x00 \x1b[31mred\x1b[0m \x00 \ue000 tail\x00"
    run = [
        b.add(EntryKind.USER_TASK, parts=(TextPart(text=f"goal with a NUL\x00{binary}"),)),
        b.add(EntryKind.TOOL_CALL_REQUEST),
        b.add(
            EntryKind.TOOL_CALL_RESULT,
            parts=(
                ToolResultPart(
                    tool_call_id="call-1",
                    status=Status.SUCCEEDED,
                    exit_code=0,
                    timed_out=False,
                    summary=binary,
                ),
            ),
        ),
        b.add(EntryKind.RUN_FINISHED),
    ]
    await produce_raw(env, run)
    await _drain_all(env)
    for name in ("run-stats", "working-memory", "context-manifests", "failure-classifications"):
        assert "run-nul" in _states(env, name), f"{name} shows the run"
    assert run_rows(env)["run-nul"]["applied_seq"] == len(run)
    memory = _states(env, "working-memory")["run-nul"]
    assert memory["task_goal"] == f"goal with a NUL\x00{binary}", "NULs come back as written"
    assert "\ue000 tail" in memory["task_goal"], "the escape character itself survives too"
    view = await redis_views_of(env, "working-memory", "run-nul")
    assert view["state"]["task_goal"] == memory["task_goal"], "Redis serves the same text"
    assert await read_dead_letters(env.settings, env.fleets) == []


async def test_deep_json_is_refused_at_the_publisher_and_dead_lettered_on_the_topic(
    services: Settings, tmp_path: Any
) -> None:
    env = await make_env(services)
    b = EntryBuilder("run-deep")
    deep = b.add(EntryKind.RUN_SUMMARY).model_copy(
        update={"parts": (JsonPart.model_construct(json_text=_deep(980)),)}
    )
    with pytest.raises(LedgerValidationError, match="nested"):  # never a RecursionError
        prepare(deep, SequenceBook(), LedgerCodec(), env.settings, now=datetime.now(UTC))
    line = deep.model_dump_json()
    file = tmp_path / "deep.jsonl"
    file.write_text(line + "\n")
    report = await publish_file(file, env.settings)
    assert report.sent == 0 and report.invalid and "nested" in report.invalid[0][1]

    good = simulate(1, 2, seed=3)
    await produce_raw(env, [RAW.encode(deep), *good])
    await _drain_all(env)
    letters = await read_dead_letters(env.settings, env.fleets)
    assert len(letters) == 1 and "nested" in letters[0].message
    applied = {r: row["applied_seq"] for r, row in run_rows(env).items()}
    assert applied == {r: n for r, n in _counts(good).items()}


async def test_a_nul_flipped_into_the_run_id_is_dead_lettered(services: Settings) -> None:
    env = await make_env(services)
    entry = EntryBuilder("run-Qx").add(EntryKind.USER_TASK)
    data = bytearray(LedgerCodec().encode(entry))
    at = data.index(b"\x0crun-Qx")  # the run_id field: its length (6, zigzag 12), then text
    data[at + 5] = 0  # 'Q' -> NUL: still valid Avro, no longer a valid run id
    good = simulate(1, 1, seed=4)
    await produce_raw(env, [bytes(data), *good])
    await _drain_all(env)
    letters = await read_dead_letters(env.settings, env.fleets)
    assert len(letters) == 1 and "run_id" in letters[0].message
    assert letters[0].value == bytes(data), "the original bytes, as they came"
    assert set(run_rows(env)) == set(_counts(good))


async def test_a_poison_record_near_1_mib_is_dead_lettered_as_a_bounded_copy(
    services: Settings,
) -> None:
    env = await make_env(services)
    poison = b"\xc3\x01" + bytes(range(256)) * 3900  # ~1,000,000 bytes of garbage
    good = simulate(1, 2, seed=6)
    producer = AIOKafkaProducer(
        bootstrap_servers=env.settings.kafka_address, max_request_size=1_048_576
    )
    await producer.start()
    try:
        topic = ledger_topic(env.settings.topic_prefix, "fleet-01")
        await producer.send_and_wait(topic, poison, key=b"r", headers=[("h", b"x" * 40_000)])
    finally:
        await producer.stop()
    await produce_raw(env, good)
    await _drain_all(env, timeout_s=90)  # before the fix: retried without end
    (letter,) = await read_dead_letters(env.settings, env.fleets)
    headers = dict(letter.headers)
    assert letter.truncated and letter.size == len(poison)
    assert headers[ORIGINAL_SIZE] == str(len(poison)).encode()
    assert headers[ORIGINAL_SHA256] == hashlib.sha256(poison).hexdigest().encode()
    assert letter.value == poison[: len(letter.value)] and len(letter.value) <= 64 * 1024
    assert letter.source_offset == 0 and letter.message
    assert {r: row["applied_seq"] for r, row in run_rows(env).items()} == _counts(good)
    report = await redrive(env.settings, env.fleets)
    assert report.redriven == 0 and "bytes kept" in report.still_bad[0][1]


async def test_records_not_keyed_by_their_run_are_dead_lettered_then_redriven_whole(
    services: Settings,
) -> None:
    env = await make_env(services)
    b = EntryBuilder("run-keys")
    run = [b.add(EntryKind.USER_TASK) for _ in range(28)]
    producer = AIOKafkaProducer(bootstrap_servers=env.settings.kafka_address)
    await producer.start()
    try:
        topic = ledger_topic(env.settings.topic_prefix, "fleet-a")
        for i, entry in enumerate(run):
            key = entry.run_id.encode() if i % 3 else f"wrong-{i}".encode()  # 1, 4, 7, ...
            await producer.send_and_wait(topic, LedgerCodec().encode(entry), key=key)
    finally:
        await producer.stop()
    await _drain_all(env)
    letters = await read_dead_letters(env.settings, env.fleets)
    assert len(letters) == 10 and all("key" in d.message for d in letters)
    row = run_rows(env)["run-keys"]
    assert row["applied_seq"] == 0 and row["gaps"], "what is missing shows as gaps, not silence"
    report = await redrive(env.settings, env.fleets)
    assert report.redriven == 10
    await _drain_all(env)
    row = run_rows(env)["run-keys"]
    assert row["applied_seq"] == 28 and row["held"] == [] and row["state"]["entries"] == 28


async def test_a_run_split_over_two_partitions_is_dead_lettered_on_the_second(
    services: Settings,
) -> None:
    env = await make_env(services)
    b = EntryBuilder("run-split")
    run = [b.add(EntryKind.USER_TASK) for _ in range(10)]
    topic = ledger_topic(env.settings.topic_prefix, "fleet-a")
    producer = AIOKafkaProducer(bootstrap_servers=env.settings.kafka_address)
    await producer.start()
    try:
        for entry in run[:6]:
            await producer.send_and_wait(topic, CODEC.encode(entry), key=b"run-split", partition=0)
        await _drain_all(env)
        for entry in run[6:]:  # a custom partitioner: right key, another partition
            await producer.send_and_wait(topic, CODEC.encode(entry), key=b"run-split", partition=5)
    finally:
        await producer.stop()
    await _drain_all(env)
    letters = await read_dead_letters(env.settings, env.fleets)
    assert len(letters) == 4 and all("one partition" in d.message for d in letters)
    assert {d.source_partition for d in letters} == {5}
    assert run_rows(env)["run-split"]["applied_seq"] == 6


async def test_entries_that_break_the_contract_downstream_are_dead_lettered(
    services: Settings,
) -> None:
    env = await make_env(services, fleets=("fleet-01", "fleet-02"))
    good = simulate(1, 2, seed=9)  # fleet-01
    other = simulate(2, 1, seed=10)[-3:]  # fleet-02 entries
    b = EntryBuilder("run-bad", fleet_id="fleet-01")
    first = b.add(EntryKind.USER_TASK)
    bad = [
        first.model_copy(update={"fleet_id": "no such fleet!"}),
        first.model_copy(update={"occurred_at": datetime(9999, 1, 1, tzinfo=UTC)}),
        first.model_copy(update={"sequence_no": 2**62}),
        first.model_copy(update={"trace_id": "not hex at all"}),
        first.model_copy(update={"metadata": {"bad key with spaces": "v"}}),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=env.settings.kafka_address)
    await producer.start()
    try:
        topic = ledger_topic(env.settings.topic_prefix, "fleet-01")
        for entry in [*bad, *other]:  # fleet-02's entries on fleet-01's topic among them
            await producer.send_and_wait(topic, RAW.encode(entry), key=entry.run_id.encode())
    finally:
        await producer.stop()
    await produce_raw(env, good)
    await _drain_all(env)
    letters = await read_dead_letters(env.settings, env.fleets)
    reasons = [d.message for d in letters]
    assert len(letters) == len(bad) + len(other), reasons
    assert sum("fleet" in r for r in reasons) >= 1 + len(other)
    assert any("occurred_at" in r for r in reasons)
    assert any("ahead" in r for r in reasons), "2**62 is dead-lettered, not held forever"
    assert any("trace_id" in r for r in reasons)
    assert all("no such fleet" not in r for r in reasons), "the bad value is not echoed"
    assert {r: row["applied_seq"] for r, row in run_rows(env).items()} == _counts(good)


async def test_positions_read_while_a_batch_is_in_flight(services: Settings) -> None:
    """A rebalance asks for stored positions while a batch may be using the connection (it
    killed a worker: 'another command is already in progress')."""
    env = await make_env(services)
    entries = simulate(1, 80, seed=12)
    await produce_raw(env, entries)
    from streams.source import read_all

    records = await read_all(env.settings.kafka_address, env.topics)
    sink = KafkaDeadLetterSink(env.settings)
    engine = Engine(_all_targets(env), env.settings.pg_address, None, sink)
    await engine.start()
    try:
        batch = asyncio.create_task(engine.process(records))
        partitions = sorted({r.tp for r in records})
        asked = 0
        while not batch.done():
            await engine.positions(partitions)
            asked += 1
            await asyncio.sleep(0)
        stats = await batch
        assert asked > 1 and stats.applied == len(entries) * len(all_projections())
        after = await engine.positions(partitions)
        assert all(after[tp] > 0 for tp in partitions)
    finally:
        await engine.close()
        await sink.close()


async def redis_views_of(env: Env, projection: str, run_id: str) -> Any:
    client = aioredis.Redis.from_url(env.settings.redis_address)
    try:
        found = await RedisViewStore(client, env.redis_prefix).read(projection, env.build, run_id)
    finally:
        await client.aclose()
    assert found is not None, f"no {projection} view of {run_id}"
    return found[1]


class _UnwritableAtThree(RunStatsProjection):
    """run-stats whose document cannot be written once run-unwritable has three entries."""

    def to_json(self, state: RunStats) -> bytes:
        if state.run_id == "run-unwritable" and state.entries >= 3:
            raise OverflowError("no document can hold this")
        return super().to_json(state)


async def test_a_state_no_document_can_hold_dead_letters_its_entries_and_moves_on(
    services: Settings,
) -> None:
    env = await make_env(services)
    b = EntryBuilder("run-unwritable")
    run = [b.add(EntryKind.USER_TASK) for _ in range(5)]
    good = simulate(1, 1, seed=15)
    await produce_raw(env, [*run, *good])
    sink = KafkaDeadLetterSink(env.settings)
    engine = Engine([Target(_UnwritableAtThree(), env.build)], env.settings.pg_address, None, sink)
    await engine.start()
    try:
        await asyncio.wait_for(drain(engine, env.settings.kafka_address, env.topics), 60)
    finally:
        await engine.close()
        await sink.close()
    letters = await read_dead_letters(env.settings, env.fleets)
    assert len(letters) == 5 and all(d.error_class == "ProjectionFoldError" for d in letters)
    rows = run_rows(env)
    assert rows["run-unwritable"]["applied_seq"] == 5, "the run moves on without them"
    assert {r: rows[r]["applied_seq"] for r in _counts(good)} == _counts(good)


def _counts(entries: list[LedgerEntry]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.run_id] = max(counts.get(e.run_id, 0), e.sequence_no)
    return counts
