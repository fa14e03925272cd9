"""The Kafka client's log, kept readable: floods held back, refusals remembered.

aiokafka logs in tight loops while a broker is unreachable or refuses a request (one record per
retry). :class:`RepeatFilter` lets one of a kind through per window and counts the rest;
:class:`ProduceRefusals` remembers the broker's last refusal of each partition's produce
requests, so a send that times out can say what Kafka answered, not only that it timed out.
Used by the worker and the publisher (no faust here).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass


class RepeatFilter(logging.Filter):
    """Lets one record of a kind (logger and message format) through per ``window_s``; the next
    one after the window says how many like it were held back. aiokafka logs a broker it
    cannot reach in a tight loop (a user found 11,694 ERROR lines a minute, ~2,000 a second
    here): the reason is kept, the flood is not."""

    def __init__(self, window_s: float = 10.0, level: int = logging.NOTSET) -> None:
        super().__init__()
        self.window_s = window_s
        self.level = level  # records below it pass untouched, to the handlers that drop them
        self._seen: dict[tuple[str, object], tuple[float, int]] = {}  # kind -> (since, held)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            # never counted: their summaries, said at WARNING, were the log of an idle worker
            # ("56 more records like 'Sending (key=%s ...'", found on a real cluster)
            return True
        key = (record.name, record.msg)
        now = record.created
        since, held = self._seen.get(key, (float("-inf"), 0))
        if now - since < self.window_s:
            self._seen[key] = (since, held + 1)
            return False
        if len(self._seen) > 1000:  # (kinds are few; a bound all the same)
            self._seen.clear()
        self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} (and {held} more like it in the {self.window_s:g}s before)"
        return True

    def held_back(self, now: float) -> list[tuple[str, str, int]]:
        """``(logger, message format, count)`` of the kinds whose window has ended with records
        held back and none let through since: a burst that stops would otherwise never say how
        many it held. Each count is given once."""
        out: list[tuple[str, str, int]] = []
        for key, (since, held) in list(self._seen.items()):
            if held and now - since >= self.window_s:
                out.append((key[0], str(key[1]), held))
                self._seen[key] = (since, 0)
        return out


# the loggers of the Kafka client, whose connection errors repeat in a tight loop
KAFKA_LOGGERS = (
    "aiokafka",
    "aiokafka.conn",
    "aiokafka.cluster",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
    "aiokafka.admin.client",
)


@dataclass(frozen=True)
class Refusal:
    topic: str
    partition: int
    error: str  # the error class's name, e.g. "NotEnoughReplicasError"
    at: float  # time.monotonic()


# What a refusal means to someone publishing, for the errors a cluster gives while degraded.
MEANING = {
    "NotEnoughReplicasError": "fewer in-sync replicas than the topic's min.insync.replicas",
    "NotEnoughReplicasAfterAppendError": "fewer in-sync replicas than min.insync.replicas",
    "NotLeaderForPartitionError": "the partition's leader moved",
    "LeaderNotAvailableError": "the partition has no leader",
    "RequestTimedOutError": "the broker timed out",
}


class ProduceRefusals(logging.Filter):
    """Remembers, per partition, the last error aiokafka's sender logged before retrying a
    produce request (it retries until the send times out, and the caller saw only the
    timeout). Passes every record on."""

    FORMAT = "Got error produce response on topic-partition %s, retrying. Error: %s"

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[tuple[str, int], Refusal] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == self.FORMAT and isinstance(record.args, tuple) and len(record.args) == 2:
            tp, error = record.args
            topic, partition = getattr(tp, "topic", None), getattr(tp, "partition", None)
            if isinstance(topic, str) and isinstance(partition, int):
                name = getattr(error, "__name__", None) or type(error).__name__
                self._last[(topic, partition)] = Refusal(topic, partition, name, time.monotonic())
        return True

    def since(self, began: float) -> str | None:
        """The refusals seen since ``began`` (time.monotonic()), in words, or None."""
        fresh = [r for r in self._last.values() if r.at >= began]
        if not fresh:
            return None
        by: dict[tuple[str, str], list[int]] = {}
        for r in fresh:
            by.setdefault((r.error, r.topic), []).append(r.partition)
        said = []
        for (error, topic), partitions in sorted(by.items()):
            meaning = f" ({MEANING[error]})" if error in MEANING else ""
            listed = ", ".join(map(str, sorted(partitions)))
            said.append(f"{error}{meaning} on {topic} partitions {listed}")
        return "Kafka kept refusing the sends: " + "; ".join(said)


PRODUCE_REFUSALS = ProduceRefusals()
REPEATS = RepeatFilter()


def hold_back_kafka_floods(level: int | None = None) -> RepeatFilter:
    """Install :data:`REPEATS` (at ``level``, when given) and :data:`PRODUCE_REFUSALS` on the
    Kafka client's loggers, once per process; the refusals are read before the repeats drop
    any. The worker calls it, and the publisher as it starts (a send Kafka refuses logged
    1,148 retry lines in 30 s, found on a real cluster)."""
    if level is not None:
        REPEATS.level = level
    sender = logging.getLogger("aiokafka.producer.sender")
    if PRODUCE_REFUSALS not in sender.filters:
        sender.addFilter(PRODUCE_REFUSALS)
    for name in KAFKA_LOGGERS:
        logger = logging.getLogger(name)
        if REPEATS not in logger.filters:
            logger.addFilter(REPEATS)
    return REPEATS
