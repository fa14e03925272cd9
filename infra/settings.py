"""The one place the environment is read.

Every setting is ``AGENTLEDGER_<NAME>``. A service whose address is set (``KAFKA_BOOTSTRAP``,
``PG_DSN``, ``REDIS_URL``) is *external*: ``infra up`` leaves it alone and everything talks to the
given address. Unset, the service is *local*: started by ``infra up`` on loopback at its port.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

KAFKA_VERSION = "3.9.2"
PG_DATABASE = "agentledger"


def _default_state_dir() -> Path:
    """The project's state folder, found from anywhere inside the project: the nearest folder
    at or above the current one that has a ``.agentledger`` folder or is this project's root
    (its ``pyproject.toml`` names agentledger); else ``./.agentledger``."""
    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / ".agentledger").is_dir():
            return folder / ".agentledger"
        project = folder / "pyproject.toml"
        if project.is_file() and _is_agentledger(project):
            return folder / ".agentledger"
    return here / ".agentledger"


def _is_agentledger(pyproject: Path) -> bool:
    try:
        head = pyproject.read_text(errors="replace")[:4000]
    except OSError:
        return False
    return 'name = "agentledger"' in head


class Settings(BaseSettings):
    """Frozen settings object built once and passed in."""

    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_", frozen=True, extra="ignore")

    kafka_bootstrap: str | None = Field(default=None, description="external Kafka bootstrap")
    pg_dsn: str | None = Field(default=None, description="external PostgreSQL DSN")
    redis_url: str | None = Field(default=None, description="external Redis URL")

    state_dir: Path = Field(default_factory=_default_state_dir)
    kafka_libs_dir: Path | None = Field(default=None, description="jar cache; default in state")
    kafka_port: int = 19092
    kafka_controller_port: int = 19093

    kafka_heap_mb: int = 768
    kafka_java_options: str = Field(
        default="",
        description="more JVM options for the local broker, space-separated (the suite gives "
        "-XX:TieredStopAtLevel=1: its brokers live minutes, where the full JIT's compiling "
        "cost half their CPU)",
    )
    pg_port: int = 15432
    redis_port: int = 16379
    stop_timeout_s: float = 30.0
    start_timeout_s: float = 120.0

    topic_prefix: str = "agentledger"
    topic_partitions: int = 8
    topic_replication: int = 1
    fleets: str = Field(
        default="fleet-01,fleet-02", description="comma-separated fleet ids for topics create"
    )

    otel: str = Field(default="none", description="telemetry export: none or console")
    worker_projections: str = Field(
        default="all",
        description="what a worker applies: all, agent (hot views), analytics, or a name list",
    )
    worker_batch_size: int = 2000
    worker_batch_wait_s: float = 0.002
    # Analytics projections commit at most this often in steady state (the batches in between
    # go together), so small hot batches do not each pay an analytics transaction
    worker_analytics_interval_s: float = Field(default=0.1, ge=0)
    worker_session_timeout_s: float = 10.0
    # How often an idle worker checks that Redis still holds its views (refilled if lost)
    worker_view_check_s: float = Field(default=2.0, gt=0)
    # How often a worker looks for ledger topics of fleets it does not read yet (a fleet whose
    # topics were created after it started): it then restarts its faust process onto them.
    worker_fleet_scan_s: float = Field(default=2.0, gt=0)
    # A worker that has applied nothing for this long while its partitions have lag (or whose
    # one batch has been retrying for this long) is stalled: it exits non-zero (and is
    # restarted), and `infra status` exits non-zero while a worker's row says so.
    worker_stall_s: float = Field(default=60.0, gt=0)
    serve_port: int = Field(default=8700, ge=1, le=65535)  # the demo's `agentledger serve`
    # How often a worker writes its health row (lag per partition, last applied batch).
    worker_health_s: float = Field(default=5.0, gt=0)
    # `agentledger worker` restarts its faust process after an exit it did not ask for, after
    # 1 s, doubling up to this (a process that ran for a minute starts the count again).
    worker_restart_max_backoff_s: float = Field(default=30.0, gt=0)
    # Processes a rebuild splits the partitions between (one core each; `rebuild --processes`);
    # 0: one per core of the machine
    rebuild_processes: int = Field(default=0, ge=0)
    redis_prefix: str = "al"
    # Change streams (issue 18): which projections' live changes go to
    # <prefix>.changes.<projection>, and whether workers run the relay (one at a time).
    change_streams: str = Field(
        default="all",
        description="projections whose committed changes are streamed: all, none, a group or "
        "a name list",
    )
    change_relay: bool = Field(
        default=True, description="workers run the change relay (one of them at a time)"
    )
    change_relay_batch: int = Field(default=2000, ge=1)

    max_entry_bytes: int = 512 * 1024
    # Where content too large for an entry goes (streams/artifacts.py); default <state>/artifacts
    artifact_dir: Path | None = Field(default=None, description="artifact store folder")
    publish_timeout_s: float = 15.0
    publish_linger_ms: int = 1  # how long the producer waits to fill a batch
    schema_registry_url: str | None = None

    # Projection inputs kept as data; changing one and rebuilding re-derives history.
    price_table: Path | None = Field(
        default=None,
        description="a price table JSON over the maintained price database: the models it "
        "prices are priced by it (cost-metrics)",
    )
    price_source: Literal["genai-prices", "table"] = Field(
        default="genai-prices",
        description="genai-prices: the maintained database (pydantic's genai-prices, its bundled "
        "data) under AGENTLEDGER_PRICE_TABLE; table: our table alone (the shipped one unless "
        "AGENTLEDGER_PRICE_TABLE), as builds before 2026-12 priced",
    )
    failure_taxonomy: Path | None = Field(
        default=None, description="a taxonomy JSON replacing the shipped one (failure classes)"
    )
    context_budget: str | None = Field(
        default=None,
        description=(
            'JSON overriding ContextBudget fields, e.g. {"total_tokens": 64000}; "sections" '
            "merges into the default section budgets (null removes one)"
        ),
    )

    @field_validator("state_dir", "kafka_libs_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        """Folders as absolute paths: the services and tools they are handed to run elsewhere
        (Maven resolved a relative jar folder against its pom's folder)."""
        return None if value is None else value.expanduser().absolute()

    @property
    def fleet_ids(self) -> list[str]:
        return [f.strip() for f in self.fleets.split(",") if f.strip()]

    @property
    def kafka_external(self) -> bool:
        return self.kafka_bootstrap is not None

    @property
    def pg_external(self) -> bool:
        return self.pg_dsn is not None

    @property
    def redis_external(self) -> bool:
        return self.redis_url is not None

    @property
    def kafka_address(self) -> str:
        return self.kafka_bootstrap or f"127.0.0.1:{self.kafka_port}"

    @property
    def pg_address(self) -> str:
        return self.pg_dsn or f"postgresql://postgres@127.0.0.1:{self.pg_port}/{PG_DATABASE}"

    @property
    def redis_address(self) -> str:
        return self.redis_url or f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def resolved_artifact_dir(self) -> Path:
        return self.artifact_dir or self.state_dir / "artifacts"

    @property
    def resolved_kafka_libs(self) -> Path:
        return self.kafka_libs_dir or self.state_dir / "cache" / f"kafka-{KAFKA_VERSION}-libs"


def load_settings(**overrides: object) -> Settings:
    """Read the environment (plus explicit overrides, which win)."""
    return Settings(**overrides)  # type: ignore[arg-type]
