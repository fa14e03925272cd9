"""Pure checks of settings and process plumbing (no services)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from rich.console import Console

from infra.errors import PortInUseError
from infra.process import is_alive, live_pid, log_tail, port_free, require_free_ports
from infra.services import KafkaService
from infra.settings import load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AGENTLEDGER_"):
            monkeypatch.delenv(name)


def test_unset_addresses_mean_local_services(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEDGER_KAFKA_PORT", "29092")
    s = load_settings()
    assert not (s.kafka_external or s.pg_external or s.redis_external)
    assert s.kafka_address == "127.0.0.1:29092"
    assert s.pg_address.endswith(":15432/agentledger")


def test_set_address_means_external(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEDGER_KAFKA_BOOTSTRAP", "broker-1:9092")
    monkeypatch.setenv("AGENTLEDGER_REDIS_URL", "redis://cache:6379/2")
    s = load_settings()
    assert s.kafka_external and s.redis_external
    assert s.kafka_address == "broker-1:9092"
    assert s.redis_address == "redis://cache:6379/2"


@pytest.mark.parametrize(("brokers", "running"), [(0, False), (1, True), (3, True)])
def test_an_external_kafka_of_any_number_of_brokers_is_running(
    monkeypatch: pytest.MonkeyPatch, brokers: int, running: bool
) -> None:
    """Found on a real 3-broker cluster: only exactly one broker counted as running, so
    `infra status` showed the cluster stopped and never said that nothing was applying."""
    import infra.services

    async def count(bootstrap: str) -> int:
        assert bootstrap == "b1:9092,b2:9092,b3:9092"
        return brokers

    monkeypatch.setenv("AGENTLEDGER_KAFKA_BOOTSTRAP", "b1:9092,b2:9092,b3:9092")
    monkeypatch.setattr(infra.services, "_kafka_broker_count", count)
    status = KafkaService(load_settings(), Console(quiet=True)).status()
    assert status.running is running and not status.managed


def test_taken_port_gives_error_naming_port_and_setting() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_free(port)
        with pytest.raises(PortInUseError, match=rf"port {port}.*AGENTLEDGER_REDIS_PORT"):
            require_free_ports("redis", {"REDIS_PORT": port})
    assert port_free(port)


def test_live_pid_needs_a_live_process_with_the_marker(tmp_path: Path) -> None:
    pidfile = tmp_path / "x.pid"
    assert live_pid(pidfile, "x") is None
    pidfile.write_text(f"{os.getpid()}\n")
    assert live_pid(pidfile, "no-such-marker-in-cmdline") is None
    assert live_pid(pidfile, "python") == os.getpid() or live_pid(pidfile, "pytest") == os.getpid()
    pidfile.write_text("999999999\n")
    assert not is_alive(999999999)
    assert live_pid(pidfile, "") is None


def test_log_tail_keeps_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(log, 3).splitlines() == ["line 97", "line 98", "line 99"]
    assert "no log" in log_tail(tmp_path / "missing.log")


def test_kafka_config_is_single_node_kraft_without_inline_comments(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, kafka_port=30001, kafka_controller_port=30002)
    service = KafkaService(settings, Console(quiet=True))
    service.home.mkdir(parents=True)
    service._write_config()
    props = dict(
        line.split("=", 1) for line in (service.home / "server.properties").read_text().splitlines()
    )
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:30002"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:30001"
    assert not any("#" in v for v in props.values())


def test_one_answer_for_what_is_retried() -> None:
    """infra.errors.is_retriable: drivers' transient errors and our errors marked retriable."""
    import psycopg
    import redis
    from aiokafka.errors import KafkaConnectionError

    from infra.errors import ServiceUnreachableError, is_retriable
    from schemas.errors import BadArgumentError, LedgerDecodeError

    for transient in (
        psycopg.OperationalError("gone"),
        redis.exceptions.ConnectionError("gone"),
        KafkaConnectionError(),
        ConnectionResetError(),
        ServiceUnreachableError("later"),
    ):
        assert is_retriable(transient), transient
    for final in (LedgerDecodeError("bad bytes"), BadArgumentError("no"), ValueError("x")):
        assert not is_retriable(final), final


def test_stacks_starting_at_once_install_a_missing_package_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two stacks on a fresh machine both find redis-server missing: the second waits for the
    first's install (one file lock) and then finds it installed, instead of failing on apt's
    lock. apt-get itself is replaced here; the lock and the threads are real."""
    import subprocess
    import threading
    import time

    from infra import services

    if os.geteuid() != 0:
        pytest.skip("_apt_install refuses to run apt without root")
    monkeypatch.setattr(services, "APT_LOCK", tmp_path / "apt.lock")
    installed = threading.Event()
    calls: list[list[str]] = []

    def apt(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        assert "DPkg::Lock::Timeout=600" in argv  # and apt waits for anyone else's apt
        time.sleep(0.2)
        if "install" in argv:
            installed.set()
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", apt)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            services._apt_install("redis-server", Console(quiet=True), installed.is_set)
        except BaseException as exc:
            errors.append(exc)

    stacks = [threading.Thread(target=start) for _ in range(2)]
    for t in stacks:
        t.start()
    for t in stacks:
        t.join(10)
    assert not errors
    assert [argv[-1] for argv in calls] == ["update", "redis-server"]  # one install, not two


def test_a_local_stack_that_fails_half_way_stops_what_it_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test stack's start failed on Redis on a fresh machine and left Kafka and PostgreSQL
    running (on CI's ports): a start that fails stops the services it found stopped."""
    from infra import local, provision
    from infra.errors import InfraError

    stopped: list[str] = []

    class Service:
        external = False

        def __init__(self, name: str) -> None:
            self.name = name

        def pid(self) -> int | None:
            return None

        def down(self) -> str:
            stopped.append(self.name)
            return f"{self.name}: stopped"

    def failing_up(settings: object, console: object) -> None:
        raise InfraError("installing redis-server failed")

    fakes = [Service("kafka"), Service("postgres"), Service("redis")]
    monkeypatch.setattr(provision, "all_services", lambda settings, console: fakes)
    monkeypatch.setattr(local, "up", failing_up)
    with pytest.raises(InfraError), provision.provisioned(Console(quiet=True)):
        raise AssertionError("the block ran without services")
    assert stopped == ["redis", "postgres", "kafka"]


def test_an_admin_call_is_made_again_while_kafka_calls_its_error_retriable() -> None:
    """Found on a 3-broker cluster: for ~10 s after a broker died, `topics list`, `dlq list`
    and `verify --all` failed with NodeNotReadyError (a request sent to the dead node)."""
    import asyncio

    from aiokafka.errors import InvalidReplicationFactorError, NodeNotReadyError

    from infra.topics import retried

    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise NodeNotReadyError("node 3")
        return "topics"

    assert asyncio.run(retried(flaky, within_s=5)) == "topics" and len(calls) == 3

    async def refused() -> str:
        calls.append(1)
        raise InvalidReplicationFactorError("4 replicas, 3 brokers")

    calls.clear()
    with pytest.raises(InvalidReplicationFactorError):
        asyncio.run(retried(refused, within_s=5))
    assert len(calls) == 1  # not retriable: at once

    async def down() -> str:
        calls.append(1)
        raise NodeNotReadyError("node 3")

    calls.clear()
    with pytest.raises(NodeNotReadyError):
        asyncio.run(retried(down, within_s=0.5))
    assert 2 <= len(calls) <= 4  # then its error, once the time is up


def test_ledger_and_dead_letter_topics_keep_an_acknowledged_entry_on_two_brokers() -> None:
    """Found on a 3-broker cluster: the ledger inherited Kafka's min.insync.replicas of 1, so
    acks=all could be one broker's. With 3 replicas or more, topics we make ask for 2."""
    from infra.topics import fleet_topic_specs

    for replication, wanted in ((1, None), (2, None), (3, "2"), (5, "2")):
        for spec in fleet_topic_specs("p", "f", 8, replication):
            assert spec.config.get("min.insync.replicas") == wanted, (spec.name, replication)
            assert spec.config["retention.ms"] == "-1"  # kept forever, as before


def test_kafka_java_options_reach_the_broker_s_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AGENTLEDGER_KAFKA_JAVA_OPTIONS (the suite's quick JIT) are JVM options of the broker,
    before its class; unset, the command is the plain one."""
    plain = KafkaService(load_settings(state_dir=tmp_path), Console(quiet=True))._java(tmp_path)
    assert not any(arg.startswith("-XX:Tiered") for arg in plain)
    monkeypatch.setenv("AGENTLEDGER_KAFKA_JAVA_OPTIONS", " -XX:TieredStopAtLevel=1  -Xss1m ")
    argv = KafkaService(load_settings(state_dir=tmp_path), Console(quiet=True))._java(tmp_path)
    assert argv[: len(plain) - 5] == plain[: len(plain) - 5]  # (java, heap, GC first)
    assert {"-XX:TieredStopAtLevel=1", "-Xss1m"} <= set(argv[: argv.index("-cp")])
    assert len(argv) == len(plain) + 2
