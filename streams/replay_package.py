"""Replay packages (seed 003 §11): everything needed to replay one run offline.

A package is a folder:

- ``entries.jsonl``: the run's entries in the JSON form (``schemas/JSON_FORM.md``), in sequence
  order, each exactly as decoded from the topic;
- ``package.json``: the run, fleet and topic; every entry's partition, offset, sequence number,
  entry id and writer schema (version and fingerprint); the projection versions and the data
  versions they used (price table, taxonomy, context budget); every artifact ref;
- ``schemas/ledger_entry.v<N>.avsc``: the writer schemas the entries were written with;
- ``artifacts/<sha256>``: the content of every artifact the entries refer to that the artifact
  store holds (each listed in ``package.json`` with ``included``: an artifact ref whose content
  was never stored here, e.g. a simulated run's, is listed and not included).

``load`` checks the included artifacts against their sha256, then folds the entries back into
every projection in memory: the same pure folds the engine runs, so the views equal the live ones
for the same code and data versions.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.settings import Settings
from infra.topics import partition_for
from projectors.base import Projection, fold_all, projection_inputs
from projectors.stores import postgres_ops as ops
from schemas.codec import LedgerCodec
from schemas.errors import AgentLedgerError
from schemas.json_form import from_json_text, to_json_text
from schemas.models import ArtifactRef, ArtifactRefPart, LedgerEntry, Part
from schemas.topics import ledger_topic
from streams.artifacts import SHA256, ArtifactError, ArtifactStore
from streams.source import topic_partitions

FORMAT = "agentledger-replay-package/1"


class ReplayPackageError(AgentLedgerError):
    """The run is not found, or a folder is not a readable replay package."""


@dataclass
class Located:
    entry: LedgerEntry
    partition: int
    offset: int
    schema_version: int
    fingerprint: str


def run_fleet(settings: Settings, run_id: str) -> str:
    """The fleet of a run, from any live build that has seen it."""
    with ops.connect(settings.pg_address) as conn:
        fleet = ops.live_fleet_of(conn, run_id)
    if fleet is None:
        raise ReplayPackageError(f"run {run_id} is in no live projection")
    return fleet


async def locate(
    settings: Settings, run_id: str, codec: LedgerCodec | None = None
) -> list[Located]:
    """The run's entries from its fleet's topic: only the partition its key maps to is read."""
    codec = codec or LedgerCodec()
    topic = ledger_topic(settings.topic_prefix, run_fleet(settings, run_id))
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_address, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = await topic_partitions(consumer, [topic])
        if not partitions:
            raise ReplayPackageError(f"topic {topic} does not exist")
        tp = TopicPartition(topic, partition_for(run_id.encode(), len(partitions)))
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        found: dict[int, Located] = {}
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=5000, max_records=5000)
            for record in batch.get(tp, []):
                if record.key != run_id.encode() or record.value is None:
                    continue
                entry = codec.decode(record.value)
                writer = codec.writer_of(record.value)
                found.setdefault(  # a redelivered duplicate keeps the first, as projections do
                    entry.sequence_no,
                    Located(
                        entry, tp.partition, record.offset, writer.version, writer.fingerprint_hex
                    ),
                )
        return [found[seq] for seq in sorted(found)]
    finally:
        await consumer.stop()


def located_run(settings: Settings, run_id: str) -> tuple[list[Located], str]:
    """The run's entries as :func:`locate` finds them, and their topic (ReplayPackageError:
    none on its fleet's topic). ``agentledger replay-package`` and the HTTP API read a run's
    package through this."""
    import asyncio

    located = asyncio.run(locate(settings, run_id))
    if not located:
        raise ReplayPackageError(f"no entries of run {run_id} on its fleet's topic")
    return located, ledger_topic(settings.topic_prefix, located[0].entry.fleet_id)


def write_package(
    out: Path,
    located: list[Located],
    projections: list[Projection[Any]],
    topic: str,
    codec: LedgerCodec | None = None,
    store: ArtifactStore | None = None,
) -> Path:
    codec = codec or LedgerCodec()
    if not located:
        raise ReplayPackageError("no entries to package")
    out.mkdir(parents=True, exist_ok=True)
    (out / "schemas").mkdir(exist_ok=True)
    with (out / "entries.jsonl").open("w", encoding="utf-8") as f:
        for item in located:
            f.write(to_json_text(item.entry) + "\n")
    for version, schema in _schemas(located, codec).items():
        (out / "schemas" / f"ledger_entry.v{version}.avsc").write_text(schema)
    artifacts = _copy_artifacts(_artifacts([i.entry for i in located]), store, out)
    manifest = _manifest(located, projections, topic, artifacts)
    (out / "package.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return out


def package_doc(
    located: list[Located],
    projections: list[Projection[Any]],
    topic: str,
    codec: LedgerCodec | None = None,
    store: ArtifactStore | None = None,
) -> dict[str, Any]:
    """The package :func:`write_package` writes, as one JSON document (the HTTP API's):
    ``package`` (its ``package.json``), ``entries`` (``entries.jsonl``, each entry's JSON form)
    and ``schemas`` (version -> the writer schema's text); the artifacts' contents are not in
    it (``package.artifacts`` says which the store holds: ``included``)."""
    codec = codec or LedgerCodec()
    if not located:
        raise ReplayPackageError("no entries to package")
    artifacts = _copy_artifacts(_artifacts([i.entry for i in located]), store, None)
    return {
        "package": json.loads(
            json.dumps(_manifest(located, projections, topic, artifacts), default=str)
        ),
        "entries": [json.loads(to_json_text(i.entry)) for i in located],
        "schemas": {str(v): text for v, text in _schemas(located, codec).items()},
    }


def _schemas(located: list[Located], codec: LedgerCodec) -> dict[int, str]:
    return {
        version: codec.catalog.by_version(version).schema_json
        for version in sorted({i.schema_version for i in located})
    }


def _manifest(
    located: list[Located],
    projections: list[Projection[Any]],
    topic: str,
    artifacts: list[dict[str, Any]],
) -> dict[str, Any]:
    first = located[0].entry
    return {
        "format": FORMAT,
        "created_at": datetime.now(UTC).isoformat(),
        "run_id": first.run_id,
        "fleet_id": first.fleet_id,
        "topic": topic,
        "entries": [
            {
                "sequence_no": i.entry.sequence_no,
                "entry_id": i.entry.entry_id,
                "kind": i.entry.kind.value,
                "partition": i.partition,
                "offset": i.offset,
                "schema_version": i.schema_version,
                "schema_fingerprint": i.fingerprint,
            }
            for i in located
        ],
        "schemas": {str(i.schema_version): i.fingerprint for i in located},
        "projections": {p.name: projection_inputs(p) for p in projections},
        "artifacts": artifacts,
    }


def _artifacts(entries: list[LedgerEntry]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for e in entries:
        for ref in _refs(e.parts):
            seen.setdefault(ref.artifact_id, ref.model_dump(mode="json") | {"entry_id": e.entry_id})
    return list(seen.values())


def _copy_artifacts(
    refs: list[dict[str, Any]], store: ArtifactStore | None, out: Path | None
) -> list[dict[str, Any]]:
    """Each ref with ``included``: whether its content (read from ``store``, sha256 checked)
    was written to ``out/artifacts/<sha256>`` (``out`` None: whether it would be)."""
    listed = []
    for ref in refs:
        data = None
        if store is not None and store.exists(ref["sha256"]):
            try:
                data = store.get(ref["sha256"])
            except ArtifactError:
                data = None  # a damaged copy is left out, and said to be
        if data is not None and out is not None:
            (out / "artifacts").mkdir(exist_ok=True)
            (out / "artifacts" / ref["sha256"]).write_bytes(data)
        listed.append(ref | {"included": data is not None})
    return listed


def package_artifact(folder: Path, sha256: str) -> bytes:
    """An artifact a package includes, its sha256 checked."""
    if not SHA256.match(sha256):  # a name from package.json, never a path out of the folder
        raise ReplayPackageError(f"{folder}: an artifact's sha256 is not 64 hex digits")
    try:
        data = (folder / "artifacts" / sha256).read_bytes()
    except OSError as exc:
        raise ReplayPackageError(f"{folder}: artifact {sha256} unreadable: {exc}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ReplayPackageError(f"{folder}: artifact {sha256} does not match its sha256")
    return data


def _refs(parts: tuple[Part, ...]) -> list[ArtifactRef]:
    refs: list[ArtifactRef] = []
    for part in parts:
        if isinstance(part, ArtifactRefPart):
            refs.append(part.to_ref())
        for name in ("diagnostics_ref", "diff_artifact"):
            value = getattr(part, name, None)
            if isinstance(value, ArtifactRef):
                refs.append(value)
        refs.extend(getattr(part, "artifact_refs", ()))
    return refs


def read_package(folder: Path) -> tuple[dict[str, Any], list[LedgerEntry]]:
    try:
        manifest = json.loads((folder / "package.json").read_text())
        lines = (folder / "entries.jsonl").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as exc:
        raise ReplayPackageError(f"{folder} is not a replay package: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise ReplayPackageError(f"{folder}: unknown package format {manifest.get('format')!r}")
    entries = [from_json_text(line) for line in lines if line.strip()]
    return manifest, entries


def load_package(
    folder: Path, projections: list[Projection[Any]]
) -> tuple[dict[str, Any], dict[str, dict[str, Any] | None]]:
    """Fold a package's entries into every projection offline; returns the manifest and docs."""
    manifest, entries = read_package(folder)
    for ref in manifest.get("artifacts", []):
        if ref.get("included"):
            package_artifact(folder, str(ref.get("sha256")))
    docs: dict[str, dict[str, Any] | None] = {}
    for p in projections:
        state = fold_all(p, entries)
        docs[p.name] = None if state is None else json.loads(p.to_json(state))
    return manifest, docs
