"""Services for tests and benchmarks: configured ones, else containers, else the local stack.

Order of preference: every address set in the environment is used as is; when none is set and a
Docker engine answers, throwaway containers (testcontainers); otherwise the local stack of
``infra up``. Whatever this module starts, it stops again.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator

from rich.console import Console

from infra import local
from infra.services import all_services
from infra.settings import Settings, load_settings


def docker_engine_answers() -> bool:
    """Asked of the docker CLI in a child process, so a missing engine leaks nothing here."""
    if shutil.which("docker") is None:
        return False
    try:
        proc = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            timeout=10,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0 and bool(proc.stdout.strip())


@contextlib.contextmanager
def provisioned(console: Console | None = None) -> Iterator[Settings]:
    """Yield settings whose three addresses answer, for the duration of the block."""
    console = console or Console(stderr=True)
    settings = load_settings()
    externals = (settings.kafka_external, settings.pg_external, settings.redis_external)
    if all(externals):
        yield settings
    elif not any(externals) and docker_engine_answers():
        with _containers(settings) as contained:
            yield contained
    else:
        with _local_stack(settings, console):
            yield settings


@contextlib.contextmanager
def _local_stack(settings: Settings, console: Console) -> Iterator[None]:
    services = all_services(settings, console)
    started_here = [s for s in services if not s.external and s.pid() is None]
    try:  # a start that fails half way stops what it did start (a fresh machine's first
        local.up(settings, console)  # run left Kafka and PostgreSQL up when Redis failed)
        yield
    finally:
        for service in reversed(started_here):
            console.print(service.down())


@contextlib.contextmanager
def _containers(settings: Settings) -> Iterator[Settings]:
    from testcontainers.community.kafka import KafkaContainer
    from testcontainers.community.postgres import PostgresContainer
    from testcontainers.community.redis import RedisContainer

    with (
        KafkaContainer("confluentinc/cp-kafka:7.7.1").with_kraft() as kafka,
        PostgresContainer("postgres:15", driver=None) as pg,
        RedisContainer("redis:7") as rds,
    ):
        redis_url = f"redis://{rds.get_container_host_ip()}:{rds.get_exposed_port(6379)}/0"
        yield settings.model_copy(
            update={
                "kafka_bootstrap": kafka.get_bootstrap_server(),
                "pg_dsn": pg.get_connection_url(),
                "redis_url": redis_url,
            }
        )
