"""Worker health and supervision decisions (issue 25), pure: no services."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from schemas.topics import (
    change_schema_topic,
    change_topic,
    fleet_in_ledger_topic,
    fleet_of_ledger_topic,
    fleets_among,
    ledger_topic,
    projection_of_change_topic,
)
from streams.health import (
    KAFKA,
    POSTGRESQL,
    Health,
    Supervision,
    WorkerHealth,
    out_of_touch,
    stall,
    waiting,
)
from streams.supervisor import (
    EXIT_RESTART,
    SignOfLife,
    describe_exit,
    next_delay,
    stopped_code,
)
from streams.worker import EXIT_RESTART as WORKER_EXIT_RESTART

A = ("p.ledger.a", 0)
B = ("p.ledger.a", 1)


def test_lag_is_per_assigned_partition_from_the_stored_position_then_the_batches() -> None:
    h = Health(started=0.0)
    h.assigned({A: 10, B: 0}, now=1.0)
    assert h.lag({A: 15, B: None}) == {A: 5}  # B's mark unknown: no figure, never 0
    h.applied({A: 14, ("other", 3): 99}, records=5, now=2.0)
    assert h.lag({A: 15, B: 4}) == {A: 0, B: 4}
    assert h.next_offset == {A: 15, B: 0}  # a partition not assigned is not tracked
    assert (h.batches, h.records) == (1, 5)


def test_stalled_only_with_lag_and_nothing_applied_or_assigned_for_longer_than_the_setting() -> (
    None
):
    h = Health(started=0.0)
    h.assigned({A: 0}, now=0.0)
    assert stall(h, {A: 3}, stall_s=60, now=59) is None
    why = stall(h, {A: 3}, stall_s=60, now=61)
    assert why is not None and "nothing applied for 61s" in why and "3 entries" in why
    assert stall(h, {A: 0}, stall_s=60, now=600) is None  # idle without lag is fine
    h.applied({A: 2}, records=3, now=100)
    assert stall(h, {A: 3}, stall_s=60, now=150) is None
    h.assigned({A: 3}, now=170)  # a rebalance is progress of its own
    assert stall(h, {A: 3}, stall_s=60, now=200) is None


def test_a_batch_running_longer_than_the_setting_is_a_stall_whatever_the_lag() -> None:
    h = Health(started=0.0)
    h.begin(now=10.0)
    assert stall(h, {}, stall_s=60, now=69) is None
    why = stall(h, {}, stall_s=60, now=71)
    assert why is not None and "one batch has been applying for 61s" in why


def _row(applied_ago: float | None, lag: dict[str, int], reported_ago: float = 1) -> WorkerHealth:
    return WorkerHealth(
        "host:1",
        1,
        "g",
        "all",
        datetime.now(UTC) - timedelta(seconds=300),
        reported_ago,
        applied_ago,
        1,
        1,
        lag,
        1,
        0,
        None,
    )


def test_a_worker_whose_services_do_not_answer_is_stalled_whatever_its_lag() -> None:
    """Found trying the product: with Kafka and PostgreSQL stopped, a worker with no known lag
    logged errors for minutes, alive and applying nothing. A service that has not answered for
    longer than the setting (since its last answer, or since the start) is a stall now."""
    h = Health(started=0.0)
    assert out_of_touch(h, 60, now=59) is None  # just started: no answer is owed yet
    h.answered(KAFKA, POSTGRESQL, now=50)
    assert out_of_touch(h, 60, now=100) is None
    h.answered(POSTGRESQL, now=120)  # (the health row written; Kafka silent since 50)
    why = out_of_touch(h, 60, now=125)
    assert why == "no answer from Kafka for 75s (over 60s)"
    assert stall(h, {}, 60, now=125) is None  # no lag known: the lag rule alone saw nothing
    h.answered(KAFKA, now=124)
    assert out_of_touch(h, 60, now=181) == "no answer from PostgreSQL for 61s (over 60s)"


def test_status_calls_a_reporting_worker_with_lag_and_an_old_last_batch_stalled() -> None:
    assert _row(100, {"t:0": 5}).stalled(60)
    assert not _row(10, {"t:0": 5}).stalled(60)
    assert not _row(100, {"t:0": 0}).stalled(60)
    assert _row(None, {"t:0": 5}).stalled(60)  # never applied, started 300 s ago
    assert not _row(100, {"t:0": 5}, reported_ago=120).stalled(60)  # gone, not stalled
    assert _row(100, {"t:0": 5}, reported_ago=120).as_dict(60)["state"] == "gone"


def test_supervision_comes_from_the_supervisor_environment() -> None:
    s = Supervision.from_env(
        {"AGENTLEDGER_WORKER_RESTARTS": "3", "AGENTLEDGER_WORKER_LAST_EXIT": "exit 71: x"}
    )
    assert s == Supervision(3, "exit 71: x")
    assert Supervision.from_env({"AGENTLEDGER_WORKER_RESTARTS": "?"}) == Supervision(0, None)


def test_restart_backoff_doubles_resets_after_a_healthy_run_and_skips_asked_restarts() -> None:
    assert WORKER_EXIT_RESTART == EXIT_RESTART  # one code, two processes
    from streams.supervisor import EXIT_CONFIG
    from streams.worker import EXIT_CONFIG as WORKER_EXIT_CONFIG

    assert WORKER_EXIT_CONFIG == EXIT_CONFIG
    assert next_delay(EXIT_RESTART, 1, 8, 30) == 0
    assert next_delay(71, 1, 0, 30) == 1
    assert next_delay(71, 1, 1, 30) == 2
    assert next_delay(71, 1, 16, 30) == 30
    assert next_delay(71, 1, 30, 30) == 30
    assert next_delay(71, 61, 30, 30) == 1


def test_exits_are_described_with_their_code_or_signal_and_reason() -> None:
    assert describe_exit(-9, None) == "killed by SIGKILL"
    assert describe_exit(71, "faust service Fetcher crashed") == (
        "exit 71: faust service Fetcher crashed"
    )
    assert describe_exit(0, None) == "exit 0"


def test_the_fleets_that_exist_are_those_with_a_ledger_topic_under_the_prefix() -> None:
    topics = [
        "p.ledger.a",
        "p.ledger.b-2",
        "p.dlq.c",
        "q.ledger.d",
        "p.ledger.",
        "p.ledger.x.y",
        "p.changes.run-stats",
        "p.ledger.acme_1",
    ]
    assert fleets_among("p", topics) == ["a", "acme_1", "b-2"]
    assert fleet_of_ledger_topic("p", "p.ledger.a") == "a"
    assert fleet_of_ledger_topic("p", "p.ledgers.a") is None
    # without the prefix (a record's topic, a worker's lag keys): the same format, one rule
    assert fleet_in_ledger_topic("p.ledger.a") == "a"
    assert fleet_in_ledger_topic("x.ledger.y.ledger.b-2") == "b-2"
    assert fleet_in_ledger_topic(ledger_topic("q.r", "acme_1")) == "acme_1"
    for other in ("p.dlq.c", "ledger.a", ".ledger.a", "p.changes.run-stats"):
        assert fleet_in_ledger_topic(other) is None


def test_a_change_topic_names_its_projection_under_its_prefix_only() -> None:
    assert change_topic("p", "run-stats") == "p.changes.run-stats"
    assert projection_of_change_topic("p", change_topic("p", "cost-metrics")) == "cost-metrics"
    assert projection_of_change_topic("p", change_schema_topic("p")) == "_schemas"
    # another deployment's (a prefix that begins the same), a ledger topic, a bare name
    for other in ("pq.changes.run-stats", "q.changes.run-stats", "p.ledger.a", "changes.x"):
        assert projection_of_change_topic("p", other) is None


def test_entry_ids_are_stored_as_spans_of_consecutive_sequence_numbers() -> None:
    from projectors.stores.postgres import id_spans

    ids = {3: "c", 1: "a", 2: "b", 7: "g", 8: "h", 10: "j"}
    assert id_spans(ids) == [(1, ["a", "b", "c"]), (7, ["g", "h"]), (10, ["j"])]
    assert id_spans({}) == []


def test_a_stopped_supervisor_exits_0_unless_its_child_failed() -> None:
    """SIGTERM while the faust process was leaving to restart onto new fleet topics (exit 75,
    seen in the worker drill) is a clean stop; a crash is not hidden."""
    import signal

    assert stopped_code(0) == 0
    assert stopped_code(-signal.SIGTERM) == 0
    assert stopped_code(EXIT_RESTART) == 0
    assert stopped_code(70) == 70
    assert stopped_code(-signal.SIGKILL) == -signal.SIGKILL


def test_entries_waiting_are_the_end_less_the_lowest_live_position() -> None:
    """What ``infra status`` says waits whatever the workers report: per partition, the end
    less the lowest position of the live builds (none stored there: from the beginning)."""
    ends = {A: 10, B: 5, ("p.ledger.b", 0): 0}
    live = {"run-stats": {A: 9, B: 2}, "cost-metrics": {A: 6}}
    assert waiting(ends, live, {B: 1}) == {"p.ledger.a:0": 3, "p.ledger.a:1": 4}
    assert waiting(ends, {}, {}) == {"p.ledger.a:0": 10, "p.ledger.a:1": 5}  # no build yet
    assert waiting({A: 10}, {"run-stats": {A: 9}}, {}) == {}


def test_a_gone_workers_lag_is_unknown_not_its_last_report() -> None:
    at = datetime.now(UTC) - timedelta(seconds=100)
    gone = WorkerHealth("h:1", 1, "g", "all", at, 90.0, 95.0, 3, 30, {"t:0": 0}, 1, 0, None)
    shown = gone.as_dict(60)
    assert shown["state"] == "gone" and shown["behind"] is None
    assert shown["lag"] is None and shown["fleets"] is None  # not its last report's
    # a row just written, whose process this host sees dead or stopped: gone now
    fresh = WorkerHealth("h:1", 1, "g", "all", at, 1.0, 2.0, 3, 30, {"t:0": 0}, 1, 0, None)
    assert not fresh.gone and replace(fresh, not_running=True).as_dict(60)["state"] == "gone"


def test_a_stopped_or_dead_process_is_not_running() -> None:
    import os
    import signal
    import subprocess
    import time

    from infra.process import is_running

    child = subprocess.Popen(["sleep", "30"])
    try:
        assert is_running(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while is_running(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_running(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not is_running(child.pid)


def test_a_worker_shows_the_fleets_whose_partitions_it_holds_not_the_configured_ones() -> None:
    at = datetime.now(UTC) - timedelta(seconds=100)
    lag = {"p.ledger.fleet-01:0": 0, "p.ledger.later:1": 2, "p.ledger.later:0": 0, "p.x:0": 1}
    row = WorkerHealth("h:1", 1, "g", "all", at, 1.0, 2.0, 3, 30, lag, 2, 0, None)
    assert row.as_dict(60)["fleets"] == ["fleet-01", "later"]


def test_a_repeated_kafka_client_error_is_let_through_once_per_window_with_a_count() -> None:
    import logging

    from streams.kafka_logs import RepeatFilter

    f = RepeatFilter(window_s=10)

    def record(at: float, msg: str = "Unable connect to node with id %s: %s") -> logging.LogRecord:
        r = logging.LogRecord("aiokafka", logging.ERROR, "x", 1, msg, (1, "refused"), None)
        r.created = at
        return r

    passed = [f.filter(record(t / 100)) for t in range(0, 1500)]  # 15 s, 100 a second
    assert passed.count(True) == 2  # at 0 s and at 10 s
    again = record(10.0)
    f2 = RepeatFilter(window_s=10)
    assert f2.filter(record(0.0)) and not f2.filter(record(5.0)) and f2.filter(again)
    assert again.getMessage() == (
        "Unable connect to node with id 1: refused (and 1 more like it in the 10s before)"
    )
    assert f2.filter(record(5.0, "another kind of message %s %s"))  # each kind on its own
    # a burst that stops: what it held is given once its window ends, then never again
    f3 = RepeatFilter(window_s=10)
    assert [f3.filter(record(t)) for t in (0.0, 1.0, 2.0)] == [True, False, False]
    assert f3.held_back(9.0) == []  # the window is still open
    assert f3.held_back(10.5) == [("aiokafka", "Unable connect to node with id %s: %s", 2)]
    assert f3.held_back(30.0) == []
    later = record(31.0)
    assert f3.filter(later) and "more like it" not in later.getMessage()  # counted once only
    # below the level in force: passed on untouched (the handlers drop them), never counted,
    # so never summarised at WARNING (an idle worker's heartbeats were, on a real cluster)
    f4 = RepeatFilter(window_s=10, level=logging.WARNING)
    debug = [
        logging.LogRecord("aiokafka", logging.DEBUG, "x", 1, "Sending %s", (n,), None)
        for n in range(50)
    ]
    assert all(f4.filter(r) for r in debug)
    assert f4.held_back(1e12) == [] and debug[0].getMessage() == "Sending 0"
    assert [f4.filter(record(t)) for t in (0.0, 1.0)] == [True, False]  # errors still held


def test_a_faust_process_is_silent_from_when_its_sign_of_life_last_changed() -> None:
    life = SignOfLife(began_wall=100.0)
    assert life.silent_s(None, now=5.0) == 0  # no sign yet: still starting
    assert life.silent_s(90.0, now=6.0) == 0  # a file left by an earlier process
    assert life.silent_s(101.0, now=10.0) == 0  # the first sign
    assert life.silent_s(101.0, now=25.0) == 15.0  # unchanged for 15 s of this clock
    assert life.silent_s(102.0, now=26.0) == 0  # touched again
    # a wall clock stepping (or a machine resumed) moves the file's time, not this clock
    assert life.silent_s(5000.0, now=27.0) == 0 and life.silent_s(5000.0, now=30.0) == 3.0
