"""The Kafka client's log kept readable: what the brokers refused is remembered for the error
a timed-out send gives, and the retry flood is held back."""

from __future__ import annotations

import logging
import time

from aiokafka import TopicPartition
from aiokafka.errors import NotEnoughReplicasError

from streams.kafka_logs import PRODUCE_REFUSALS, REPEATS, ProduceRefusals, hold_back_kafka_floods
from streams.publisher import _unacknowledged


def test_a_refused_send_says_what_kafka_answered_not_only_that_it_timed_out() -> None:
    """Found on a real cluster: a partition with too few in-sync replicas was refused 1,148
    times in 30 s, each retry a log line, and publish said Kafka 'stopped answering'."""
    hold_back_kafka_floods()
    hold_back_kafka_floods()  # once per process, however often asked
    sender = logging.getLogger("aiokafka.producer.sender")
    assert sender.filters.count(PRODUCE_REFUSALS) == 1 and sender.filters.count(REPEATS) == 1
    assert sender.filters.index(PRODUCE_REFUSALS) < sender.filters.index(REPEATS)
    began = time.monotonic()
    for _ in range(200):
        for partition in (7, 4):
            tp = TopicPartition("p.ledger.fleet-04", partition)
            sender.warning(ProduceRefusals.FORMAT, tp, NotEnoughReplicasError)
    said = PRODUCE_REFUSALS.since(began)
    assert said == (
        "Kafka kept refusing the sends: NotEnoughReplicasError (fewer in-sync replicas than "
        "the topic's min.insync.replicas) on p.ledger.fleet-04 partitions 4, 7"
    )
    assert PRODUCE_REFUSALS.since(time.monotonic() + 1) is None  # only those since a send began
    error = _unacknowledged([], [], TimeoutError(), 15.2, "k:9092", said)
    assert "timed out after 15.2s; Kafka kept refusing the sends: NotEnoughReplicasError" in str(
        error.cause
    )
    assert "min.insync.replicas" in str(error) and error.refusals == said


def test_other_records_pass_and_are_not_taken_for_refusals() -> None:
    refusals = ProduceRefusals()
    other = logging.LogRecord(
        "aiokafka", logging.WARNING, "x", 1, "Got error produce response: %s", ("e",), None
    )
    odd = logging.LogRecord(
        "aiokafka", logging.WARNING, "x", 1, ProduceRefusals.FORMAT, ("tp", "e"), None
    )
    assert refusals.filter(other) and refusals.filter(odd)
    assert refusals.since(0.0) is None


def test_a_file_cut_short_by_refusals_says_kafka_refused_not_that_it_stopped_answering() -> None:
    """A re-trial on the cluster: the account named the refusal but still began 'stopped
    answering'; a broker that does not answer at all is still said so."""
    from pathlib import Path

    from infra.settings import Settings
    from streams.publish_file import PublishReport, _Progress, _stopped
    from streams.publisher import BrokerUnavailableError

    settings = Settings()
    progress = _Progress(read=189, line=189, sending=94, eof=True)
    refused = BrokerUnavailableError(
        "x",
        acknowledged=[],
        unacknowledged=[],
        cause="timed out after 15.0s; Kafka kept refusing the sends: NotEnoughReplicasError",
        refusals="Kafka kept refusing the sends: NotEnoughReplicasError",
    )
    said = str(_stopped(Path("f.jsonl"), settings, PublishReport(sent=95), progress, refused))
    assert f"Kafka at {settings.kafka_address} refused the sends (timed out" in said, said
    assert "95 of the file's 189 entries read so far acknowledged, 94 not" in said, said
    silent = BrokerUnavailableError("x", acknowledged=[], unacknowledged=[], cause="timed out")
    said = str(_stopped(Path("f.jsonl"), settings, PublishReport(sent=95), progress, silent))
    assert "stopped answering (timed out)" in said, said
