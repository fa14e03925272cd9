"""A private deployment on the configured services: its own database, topic prefix, Redis prefix
and worker processes, so benchmarks and tests never touch anyone's live projections."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infra.admin import create_fleet_topics, delete_change_topics, delete_fleet_topics
from infra.clients import redis_sync_client
from infra.databases import create_database, drop_database
from infra.migrate import migrate_and_claim
from infra.settings import Settings
from projectors.stores.redis import delete_matching
from streams.changes import ensure_change_topics


class PrivateDeployment:
    def __init__(
        self,
        settings: Settings,
        kind: str,
        fleets: Sequence[str],
        logs: Path,
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        tag = f"{kind}{uuid.uuid4().hex[:6]}"
        self.db = f"al_{tag}"
        self.admin_dsn = settings.pg_address
        self.fleets = list(fleets)
        self.logs = logs
        self.worker_env = dict(worker_env or {})
        base = settings.pg_address.rsplit("/", 1)[0]
        self.settings = settings.model_copy(
            update={
                "pg_dsn": f"{base}/{self.db}",
                "topic_prefix": tag,
                "redis_prefix": tag,
                "fleets": ",".join(self.fleets),
            }
        )
        self.workers: list[subprocess.Popen[bytes]] = []

    async def create(self) -> None:
        create_database(self.admin_dsn, self.db)
        migrate_and_claim(self.settings.pg_address, self.settings.topic_prefix)
        await create_fleet_topics(self.settings, self.fleets)
        await ensure_change_topics(self.settings)

    def drop(self) -> None:
        """Stop its processes, drop its database and delete its topics and Redis keys."""
        for worker in self.workers:
            self.stop_worker(worker)
        drop_database(self.admin_dsn, self.db)
        # drop() is also called from inside running event loops (the bench): a thread of its own.
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, delete_fleet_topics(self.settings, self.fleets)).result()
            pool.submit(asyncio.run, delete_change_topics(self.settings)).result()
        client = redis_sync_client(self.settings)
        try:
            delete_matching(client, f"{self.settings.redis_prefix}:*")
        finally:
            client.close()

    def env(self) -> dict[str, str]:
        s = self.settings
        return {
            **os.environ,
            "AGENTLEDGER_KAFKA_BOOTSTRAP": s.kafka_address,
            "AGENTLEDGER_PG_DSN": s.pg_address,
            "AGENTLEDGER_REDIS_URL": s.redis_address,
            "AGENTLEDGER_TOPIC_PREFIX": s.topic_prefix,
            "AGENTLEDGER_REDIS_PREFIX": s.redis_prefix,
            "AGENTLEDGER_FLEETS": s.fleets,
            **self.worker_env,
        }

    def log_of(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def start_worker(self, name: str, projections: str = "all") -> subprocess.Popen[bytes]:
        """A detached ``agentledger worker`` process of this deployment, logging to its file."""
        command = ["-m", "infra.main", "worker", "--loglevel", "info"]
        return self.start_process(name, [*command, "--projections", projections])

    def start_process(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        """``python ARGS`` detached, with this deployment's environment, logging to its file."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with self.log_of(name).open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, *args],
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.workers.append(process)
        return process

    def has_partitions(self, name: str) -> bool:
        """Whether the named worker has been assigned partitions and positioned them."""
        log = self.log_of(name)
        return log.exists() and "resumed" in log.read_text(errors="replace")

    def wait_partitions(self, name: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.has_partitions(name):
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {name} never got partitions; see {self.log_of(name)}")
            time.sleep(0.2)

    @staticmethod
    def stop_worker(worker: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
        if worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
