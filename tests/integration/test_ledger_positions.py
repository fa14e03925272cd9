"""Where runs stand, read once (issue 26, import speed): a publisher reads a partition once for
the first run it does not know, and after that only the records appended since, however many
new runs it is asked about; and it stays exact: a run partly on the ledger continues at its next
number, an import again publishes nothing, poison and records keyed by another run hold no
place, and a second publisher (another process, a restart) sees what the first one sent."""

from __future__ import annotations

import pytest

from infra.settings import Settings
from infra.topics import partition_for
from schemas.codec import LedgerCodec
from schemas.factory import EntryBuilder
from schemas.models import EntryKind, LedgerEntry
from schemas.topics import ledger_topic
from streams.importers.base import ImportedRun
from streams.importers.publish import send_new
from streams.ledger_position import LedgerPositions, last_sequence_nos
from streams.publisher import AsyncPublisher
from streams.source import read_all
from tests.integration.engine_support import make_env, produce_raw

pytestmark = pytest.mark.integration

FLEET = "fleet-a"


def _run(run_id: str, entries: int) -> list[LedgerEntry]:
    b = EntryBuilder(run_id, fleet_id=FLEET)
    b.add(EntryKind.RUN_STARTED)
    for _ in range(entries - 1):
        b.add(EntryKind.USER_TASK)
    return b.entries


def _imported(run_id: str, entries: int) -> ImportedRun:
    return ImportedRun(run_id, FLEET, "session-1", "test", entries=_run(run_id, entries))


def _same_partition(prefix: str, partitions: int, target: int, count: int) -> list[str]:
    """``count`` run ids (starting with ``prefix``) that Kafka places on partition ``target``."""
    out: list[str] = []
    n = 0
    while len(out) < count:
        run_id = f"{prefix}-{n}"
        if partition_for(run_id.encode(), partitions) == target:
            out.append(run_id)
        n += 1
    return out


async def test_new_runs_read_their_partition_once_then_only_what_was_appended(
    services: Settings,
) -> None:
    env = await make_env(services, fleets=(FLEET,))
    parts = env.settings.topic_partitions
    target = partition_for(b"run-new-0", parts)
    others = _same_partition("other", parts, target, 40)
    partly = others[0]  # 12 of its 30 entries on the ledger already
    backlog = [e for run_id in others[1:] for e in _run(run_id, 30)] + _run(partly, 12)
    await produce_raw(env, backlog)
    # poison keyed by new runs (they hold no place), and a record of one run keyed by another
    new = ["run-new-0", *_same_partition("run-new", parts, target, 6)[1:]]
    await produce_raw(env, [b"not avro", b"\xc3\x01" + b"\x00" * 30], key=new[0].encode())
    truncated = LedgerCodec().encode(_run(new[1], 1)[0])[:40]
    await produce_raw(env, [truncated], key=new[1].encode())
    stray = LedgerCodec().encode(_run(new[2], 3)[2])  # run 2's seq 3, keyed by run 3
    await produce_raw(env, [stray], key=new[3].encode())
    on_partition = len(backlog) + 4

    async with AsyncPublisher(env.settings) as publisher:
        assert await publisher.resume({(FLEET, new[0])}) == {new[0]: 0}
        assert publisher.positions is not None
        first = publisher.positions.records_read
        assert first == on_partition  # the whole partition, once
        # more new runs of the same partition: nothing appended since, nothing read
        assert await publisher.resume({(FLEET, r) for r in new[1:4]}) == dict.fromkeys(new[1:4], 0)
        assert publisher.positions.records_read == first
        # another process appends 7 records: only those are read
        await produce_raw(env, _run(new[4], 7))
        assert await publisher.resume({(FLEET, new[4])}) == {new[4]: 7}
        assert publisher.positions.records_read == first + 7
        # the run partly on the ledger continues at 13; the new ones start at 1
        sent = await send_new(publisher, [_imported(partly, 30), _imported(new[5], 5)])
        assert [(s.already, s.sent) for s in sent] == [(12, 18), (0, 5)]
        assert publisher.positions.records_read == first + 7  # (nothing appended since)

    # A second publisher (another process, a restart) sees what the first sent: importing the
    # same runs again publishes nothing, and continues a run that grew where it stands.
    async with AsyncPublisher(env.settings) as again:
        sent = await send_new(again, [_imported(partly, 30), _imported(new[5], 6)])
        assert [(s.already, s.sent) for s in sent] == [(30, 0), (5, 1)]
        assert again.positions is not None
        read = again.positions.records_read
        sent = await send_new(again, [_imported(r, 2) for r in new[:4]])
        assert [(s.already, s.sent) for s in sent] == [(0, 2)] * 4  # poison held no place
        assert again.positions.records_read == read + 1  # only its own entry sent since

    records = await read_all(
        env.settings.kafka_address, [ledger_topic(env.settings.topic_prefix, FLEET)]
    )
    seqs: dict[str, list[int]] = {}
    for e in LedgerCodec().decode_each([r.value or b"" for r in records]):
        if isinstance(e, LedgerEntry) and e.run_id in (partly, new[5], *new[:2]):
            seqs.setdefault(e.run_id, []).append(e.sequence_no)
    assert sorted(seqs[partly]) == list(range(1, 31))  # each number once
    assert sorted(seqs[new[5]]) == list(range(1, 7))
    assert sorted(seqs[new[0]]) == sorted(seqs[new[1]]) == [1, 2]


async def test_a_run_still_being_written_is_found_without_reading_the_whole_partition(
    services: Settings,
) -> None:
    env = await make_env(services, fleets=(FLEET,))
    parts = env.settings.topic_partitions
    [busy, *others] = _same_partition("busy", parts, 0, 30)
    await produce_raw(env, [e for run_id in others for e in _run(run_id, 100)])
    await produce_raw(env, _run(busy, 9))
    positions = LedgerPositions(env.settings, chunk=50)
    try:
        assert await positions.last_sequence_nos([(FLEET, busy)]) == {busy: 9}
        assert positions.records_read == 50  # the first chunk back from the end
        assert await positions.last_sequence_nos([(FLEET, others[-5])]) == {others[-5]: 100}
        assert positions.records_read == 50 + 50 + 100 + 200 + 400  # until found, not to 0
    finally:
        await positions.close()
    # the one-shot form agrees
    found = await last_sequence_nos(env.settings, [(FLEET, busy), (FLEET, "nobody")])
    assert found == {busy: 9, "nobody": 0}
