"""The three local services: Kafka (KRaft, from Maven Central jars), PostgreSQL 15, Redis.

Each keeps its state under ``<state_dir>/<name>/`` and is started detached with its output in a
log file there, so a CI runner waiting on stdout never waits on a daemon.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import ClassVar

import psycopg
import redis
from rich.console import Console

from infra.databases import ensure_database, probe
from infra.errors import InfraError
from infra.process import (
    died_at_start,
    is_alive,
    live_pid,
    require_free_ports,
    run_checked,
    spawn,
    stop_pid,
    wait_until,
)
from infra.settings import KAFKA_VERSION, PG_DATABASE, Settings

PG_BIN = Path("/usr/lib/postgresql/15/bin")


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    address: str
    managed: bool
    running: bool
    pid: int | None

    def as_dict(self) -> dict[str, object]:
        return {
            "address": self.address,
            "managed": self.managed,
            "running": self.running,
            "pid": self.pid,
        }


class LocalService(ABC):
    """A service this project runs on loopback, or an external one it only checks."""

    name: str
    setting: ClassVar[str]  # the prefix of this service's settings: kafka, pg or redis

    def __init__(self, settings: Settings, console: Console) -> None:
        self.settings = settings
        self.console = console
        self.home = settings.state_dir / self.name
        self._spawned: int | None = None

    @property
    def external(self) -> bool:
        """Configured with an address of its own (``AGENTLEDGER_<...>``): only checked."""
        return bool(getattr(self.settings, f"{self.setting}_external"))

    @property
    def address(self) -> str:
        return str(getattr(self.settings, f"{self.setting}_address"))

    @abstractmethod
    def pid(self) -> int | None:
        """Pid of our running server, or None."""

    @abstractmethod
    def ready(self) -> bool:
        """One quick health probe against :attr:`address`."""

    @abstractmethod
    def _start(self) -> None: ...

    @abstractmethod
    def _ports(self) -> dict[str, int]: ...

    def stop_signal(self) -> signal.Signals:
        return signal.SIGTERM

    @property
    def log(self) -> Path:
        return self.home / f"{self.name}.log"

    def status(self) -> ServiceStatus:
        if self.external:
            return ServiceStatus(self.name, self.address, False, self.ready(), None)
        pid = self.pid()
        return ServiceStatus(self.name, self.address, True, pid is not None, pid)

    def up(self) -> str:
        """Start unless running or external; returns a one-line account of what happened."""
        if self.external:
            return f"{self.name}: external at {self.address}, not started"
        pid = self.pid()
        if pid is not None:
            return f"{self.name}: already running at {self.address} (pid {pid})"
        require_free_ports(self.name, self._ports())
        self.home.mkdir(parents=True, exist_ok=True)
        self._start()
        self._wait_ready()
        return f"{self.name}: started at {self.address} (pid {self.pid()})"

    def _wait_ready(self) -> None:
        with self.console.status(f"waiting for {self.name} at {self.address}"):
            wait_until(self._ready_or_dead, self.settings.start_timeout_s, 0.5)
        if self.ready():
            return
        if not self._alive():
            raise died_at_start(self.name, self.log)
        raise InfraError(
            f"{self.name} did not become ready within {self.settings.start_timeout_s:.0f}s; "
            f"see {self.log}"
        )

    def _ready_or_dead(self) -> bool:
        return not self._alive() or self.ready()

    def _alive(self) -> bool:
        """The process we just started still runs (by its pid, not its changing title)."""
        if self._spawned is not None:
            return is_alive(self._spawned)
        return self.pid() is not None

    def down(self) -> str:
        if self.external:
            return f"{self.name}: external, left alone"
        pid = self.pid()
        if pid is None:
            return f"{self.name}: not running"
        clean = stop_pid(pid, self.settings.stop_timeout_s, self.stop_signal())
        how = "stopped" if clean else "killed after timeout"
        return f"{self.name}: {how} (pid {pid})"


def kafka_cluster_id() -> str:
    """A KRaft cluster id: a random UUID, URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22]


class KafkaService(LocalService):
    """Apache Kafka, one node in KRaft combined mode."""

    name = "kafka"
    setting = "kafka"

    @property
    def _pidfile(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def _props(self) -> Path:
        return self.home / "server.properties"

    def pid(self) -> int | None:
        return live_pid(self._pidfile, str(self._props))

    def _ports(self) -> dict[str, int]:
        s = self.settings
        return {"KAFKA_PORT": s.kafka_port, "KAFKA_CONTROLLER_PORT": s.kafka_controller_port}

    def ready(self) -> bool:
        # any number of brokers: ours is one node, a real cluster is several (found on a
        # 3-broker cluster: `== 1` showed it stopped and kept `infra status` from its checks)
        return asyncio.run(_kafka_broker_count(self.address)) >= 1

    def _start(self) -> None:
        libs = resolve_kafka_jars(self.settings.resolved_kafka_libs, self.console)
        self._write_config()
        data = self.home / "data"
        if not (data / "meta.properties").exists():
            cluster_id = kafka_cluster_id()
            with self.console.status("formatting Kafka storage (KRaft)"):
                run_checked(
                    [
                        *self._java(libs),
                        "kafka.tools.StorageTool",
                        "format",
                        f"--cluster-id={cluster_id}",  # "=": an id may begin with "-"
                        "-c",
                        str(self._props),
                    ],
                    "Kafka storage format",
                )
        argv = [*self._java(libs), "kafka.Kafka", str(self._props)]
        pid = spawn(argv, self.log)
        self._spawned = pid
        self._pidfile.write_text(f"{pid}\n")

    def _java(self, libs: Path) -> list[str]:
        heap = self.settings.kafka_heap_mb
        return [
            "java",
            f"-Xms{min(256, heap)}m",
            f"-Xmx{heap}m",
            "-XX:+UseG1GC",
            *self.settings.kafka_java_options.split(),
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={self.home / 'logs'}",
            f"-Dlog4j.configuration=file:{self.home / 'log4j.properties'}",
            "-cp",
            f"{libs}/*",
        ]

    def _write_config(self) -> None:
        s = self.settings
        port, ctl = s.kafka_port, s.kafka_controller_port
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{ctl}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{ctl}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.home / "data"),
            "num.partitions": str(s.topic_partitions),
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "8",
            "group.initial.rebalance.delay.ms": "0",
            "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
            "auto.create.topics.enable": "false",
            "compression.type": "producer",
        }
        self._props.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        log_file = self.home / "logs" / "server.log"
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        (self.home / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, file\n"
            "log4j.appender.file=org.apache.log4j.RollingFileAppender\n"
            f"log4j.appender.file.File={log_file}\n"
            "log4j.appender.file.MaxFileSize=20MB\n"
            "log4j.appender.file.MaxBackupIndex=3\n"
            "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            "log4j.logger.kafka=INFO\n"
            "log4j.logger.org.apache.kafka=INFO\n"
            "log4j.logger.state.change.logger=WARN\n"
            "log4j.logger.kafka.request.logger=WARN\n"
        )


async def _kafka_broker_count(bootstrap: str) -> int:
    """Number of brokers a metadata request returns (0 when unreachable)."""
    from aiokafka import AIOKafkaClient
    from aiokafka.errors import KafkaError

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        with _quiet("aiokafka"):
            await asyncio.wait_for(client.bootstrap(), 8)
        return len(client.cluster.brokers())
    except (KafkaError, OSError, TimeoutError):
        return 0
    finally:
        await client.close()


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Readiness probes expect refused connections; keep the library from reporting each one."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def resolve_kafka_jars(libs: Path, console: Console) -> Path:
    """Copy Kafka's runtime classpath from Maven Central into ``libs`` once (pinned pom)."""
    libs = libs.absolute()  # (Maven takes a relative output folder as relative to the pom's)
    pom = resources.files("infra") / "kafka" / "pom.xml"
    pom_bytes = pom.read_bytes()
    stamp = libs / ".pom-sha256"
    digest = hashlib.sha256(pom_bytes).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return libs
    if shutil.which("mvn") is None:
        raise InfraError("Maven (mvn) is needed once to fetch the Kafka jars; install maven.")
    shutil.rmtree(libs, ignore_errors=True)
    libs.mkdir(parents=True)
    pom_path = libs / "pom.xml"
    pom_path.write_bytes(pom_bytes)
    argv = [
        "mvn",
        "-B",
        "-f",
        str(pom_path),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={libs}",
    ]
    _run_with_progress(
        argv,
        console,
        f"resolving Kafka {KAFKA_VERSION} jars (first run only)",
        count=r"Downloaded from",
    )
    stamp.write_text(digest)
    return libs


def _run_with_progress(argv: list[str], console: Console, what: str, count: str) -> None:
    """Run a long command, showing how many lines matching ``count`` it has printed."""
    pattern = re.compile(count)
    lines: list[str] = []
    seen = 0
    with (
        console.status(what) as status,
        subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if pattern.search(line):
                seen += 1
                status.update(f"{what}: {seen} done")
        code = proc.wait()
    if code != 0:
        raise InfraError(f"{what} failed (exit {code}):\n{''.join(lines[-30:])}")
    console.print(f"{what}: done ({seen} steps)")


class PostgresService(LocalService):
    """A private PostgreSQL 15 cluster in the state folder, on its own port."""

    name = "postgres"
    setting = "pg"

    @property
    def _data(self) -> Path:
        return self.home / "data"

    def pid(self) -> int | None:
        return live_pid(self._data / "postmaster.pid", str(self._data))

    def _ports(self) -> dict[str, int]:
        return {"PG_PORT": self.settings.pg_port}

    def stop_signal(self) -> signal.Signals:
        return signal.SIGINT  # "fast" shutdown: roll back open sessions, checkpoint, exit

    def ready(self) -> bool:
        try:
            probe(self.address, connect_timeout=3)
            return True
        except psycopg.Error:
            return False

    def _start(self) -> None:
        bin_dir = _pg_bin(self.console)
        run_dir = self.home / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        self._hand_to_pg_user()
        if not (self._data / "PG_VERSION").exists():
            with self.console.status("initialising a private PostgreSQL cluster (initdb)"):
                run_checked(
                    self._as_pg(
                        [
                            str(bin_dir / "initdb"),
                            "-D",
                            str(self._data),
                            "-A",
                            "trust",
                            "-U",
                            "postgres",
                            "-E",
                            "UTF8",
                        ]
                    ),
                    "initdb",
                )
        opts = (
            f"-p {self.settings.pg_port} -k {run_dir} -c listen_addresses=127.0.0.1 "
            "-c shared_buffers=256MB -c max_connections=200 "
            # Projection rows are rewritten and outbox/tail rows deleted all the time: look for
            # dead rows every 5 s (default 60) and vacuum them unthrottled, so their space is
            # reused before the tables grow (PostgreSQL bytes per entry, issue 25).
            "-c autovacuum_naptime=5s -c autovacuum_vacuum_cost_delay=0"
        )
        with self.console.status("starting PostgreSQL"):
            proc = subprocess.run(
                self._as_pg(
                    [
                        str(bin_dir / "pg_ctl"),
                        "-D",
                        str(self._data),
                        "-o",
                        opts,
                        "-l",
                        str(self.log),
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ]
                ),
                capture_output=True,
                text=True,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        if proc.returncode != 0:
            raise died_at_start(self.name, self.log)
        self._create_database()

    def _create_database(self) -> None:
        admin = f"postgresql://postgres@127.0.0.1:{self.settings.pg_port}/postgres"
        ensure_database(admin, PG_DATABASE)

    def _as_pg(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        return ["runuser", "-u", "postgres", "--", *argv]

    def _hand_to_pg_user(self) -> None:
        """As root, PostgreSQL runs as ``postgres``: give it its folder and a path to it."""
        if os.geteuid() != 0:
            return
        try:
            user = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise InfraError("running as root needs the 'postgres' system user") from exc
        for parent in self.home.resolve().parents:
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                parent.chmod(mode | stat.S_IXOTH)
                self.console.print(f"postgres: granted traverse (o+x) on {parent}")
        for path in [self.home, *self.home.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid)


def _pg_bin(console: Console) -> Path:
    if not (PG_BIN / "initdb").exists():
        _apt_install("postgresql-15", console, lambda: (PG_BIN / "initdb").exists())
    return PG_BIN


APT_LOCK = Path("/var/lock/agentledger-apt.lock")
# apt-get waits this long for another apt/dpkg (e.g. unattended-upgrades) to let go of its locks.
APT_LOCK_WAIT_S = 600


def _apt_install(package: str, console: Console, installed: Callable[[], bool]) -> None:
    """Install a Debian package once, even when several stacks start at once on a fresh machine.

    Our own installers take turns on one file lock and look again once they hold it (the one
    before may have installed the package); apt-get waits for anyone else's apt/dpkg locks
    instead of failing at once.
    """
    if os.geteuid() != 0:
        raise InfraError(f"{package} is missing; install it (apt-get install {package}) and retry.")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT_S}"]
    APT_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with APT_LOCK.open("a") as lock:
        with console.status(f"waiting for other installs before {package}"):
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if installed():
                console.print(f"{package}: installed meanwhile")
                return
            for argv, what in (
                (["apt-get", *wait, "update"], "apt-get update"),
                (["apt-get", *wait, "install", "-y", package], f"installing {package}"),
            ):
                with console.status(what):
                    proc = subprocess.run(
                        argv,
                        capture_output=True,
                        text=True,
                        env=env,
                        check=False,
                        stdin=subprocess.DEVNULL,
                    )
                if proc.returncode != 0:
                    raise InfraError(f"{what} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
                console.print(f"{what}: done")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class RedisService(LocalService):
    """redis-server on its own port; views are refillable from PostgreSQL, so no persistence."""

    name = "redis"
    setting = "redis"

    @property
    def _pidfile(self) -> Path:
        return self.home / "redis.pid"

    def pid(self) -> int | None:
        return live_pid(self._pidfile, str(self.settings.redis_port))

    def _ports(self) -> dict[str, int]:
        return {"REDIS_PORT": self.settings.redis_port}

    def ready(self) -> bool:
        client = redis.Redis.from_url(self.address, socket_connect_timeout=2, socket_timeout=2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _start(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            _apt_install(
                "redis-server", self.console, lambda: shutil.which("redis-server") is not None
            )
            server = shutil.which("redis-server") or "/usr/bin/redis-server"
        argv = [
            server,
            "--port",
            str(self.settings.redis_port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.home),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
        ]
        pid = spawn(argv, self.log)
        self._spawned = pid
        self._pidfile.write_text(f"{pid}\n")


def all_services(settings: Settings, console: Console) -> list[LocalService]:
    return [
        KafkaService(settings, console),
        PostgresService(settings, console),
        RedisService(settings, console),
    ]


def purge_state(settings: Settings, services: list[LocalService]) -> None:
    """Remove every service's data (the jar cache is kept)."""
    for service in services:
        if service.pid() is not None:
            raise InfraError(f"{service.name} still runs; stop it before purging")
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(service.home)
