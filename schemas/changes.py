"""Change records: what the change streams ``<prefix>.changes.<projection>`` carry (issue 18).

A change is encoded like a ledger entry: Avro single-object encoding (C3 01, the writer schema's
8-byte CRC-64-AVRO fingerprint, Avro binary), schemas in ``avsc/projection_change.v<N>.avsc``
under the same FULL_TRANSITIVE rule. A reader resolves any writer it knows to its own reader
schema; a writer it does not know (a newer one) it asks ``resolve`` for, which the subscriber
answers from the schema topic the relay registers every writer schema in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from io import BytesIO
from typing import Any, Literal

import orjson
from fastavro import schemaless_reader, schemaless_writer

from schemas.catalog import AVSC_DIR, SchemaCatalog, SchemaVersion, load_version
from schemas.codec import SINGLE_OBJECT_MAGIC
from schemas.errors import LedgerDecodeError, SchemaCatalogError

CHANGE_RECORD = "agentledger.ProjectionChange"
CHANGE_CATALOG = SchemaCatalog.from_directory(
    AVSC_DIR, "projection_change", CHANGE_RECORD, "projection change"
)
ChangeKind = Literal["STATE", "REMOVED", "BUILD_CHANGED", "UNKNOWN"]
_HEADER_END = len(SINGLE_OBJECT_MAGIC) + 8


@dataclass(frozen=True)
class ProjectionChange:
    """One committed change of a projection's live build.

    ``state`` is the projection's document after the change (None for REMOVED and markers);
    ``partition``/``offset`` say where the record sits in its change topic (set by readers).
    """

    change_id: int
    kind: ChangeKind
    projection: str
    build: str
    projection_version: int
    committed_at: datetime
    fleet_id: str | None = None
    run_id: str | None = None
    applied_seq: int = 0
    held: int = 0
    state: dict[str, Any] | None = None
    previous_build: str | None = None
    inputs: dict[str, Any] | None = None
    traceparent: str | None = None
    partition: int | None = None
    offset: int | None = None
    extra: dict[str, Any] | None = None  # fields of a newer writer this reader does not know
    # ``state`` as JSON text, when the writer has it so (the relay: the outbox keeps the head's
    # text); encoded as it is instead of ``state``. Readers get ``state``.
    state_json: str | None = None

    def at(self, partition: int, offset: int) -> ProjectionChange:
        return replace(self, partition=partition, offset=offset)


def change_key(change: ProjectionChange, partition: int) -> bytes:
    """The Kafka key: compaction keeps the latest record of each, so the latest state of every
    run and the latest build marker of every partition."""
    if change.kind == "BUILD_CHANGED":
        return orjson.dumps(["build", partition])
    return orjson.dumps(["state", change.run_id])


def _state_json(change: ProjectionChange) -> str | None:
    if change.state_json is not None:
        return change.state_json
    return None if change.state is None else orjson.dumps(change.state).decode()


def _record(change: ProjectionChange) -> dict[str, Any]:
    return {
        "change_id": change.change_id,
        "kind": change.kind,
        "projection": change.projection,
        "build": change.build,
        "projection_version": change.projection_version,
        "fleet_id": change.fleet_id,
        "run_id": change.run_id,
        "applied_seq": change.applied_seq,
        "held": change.held,
        "state_json": _state_json(change),
        "previous_build": change.previous_build,
        "inputs_json": None if change.inputs is None else orjson.dumps(change.inputs).decode(),
        "committed_at": change.committed_at,
        "traceparent": change.traceparent,
        **(change.extra or {}),
    }


_KNOWN = set(_record(ProjectionChange(0, "STATE", "", "", 0, datetime.now(UTC))))


class ChangeCodec:
    """Encodes changes with one writer schema; decodes any writer to one reader schema."""

    def __init__(
        self,
        catalog: SchemaCatalog = CHANGE_CATALOG,
        *,
        writer_version: int | None = None,
        reader_version: int | None = None,
        resolve: Callable[[bytes], str | None] | None = None,
    ) -> None:
        self.catalog = catalog
        self.writer = (
            catalog.current if writer_version is None else catalog.by_version(writer_version)
        )
        self.reader = (
            catalog.current if reader_version is None else catalog.by_version(reader_version)
        )
        self.resolve = resolve  # fingerprint -> writer schema JSON, for writers not catalogued
        self._fetched: dict[bytes, SchemaVersion] = {}

    def encode(self, change: ProjectionChange) -> bytes:
        out = BytesIO()
        out.write(SINGLE_OBJECT_MAGIC + self.writer.fingerprint)
        schemaless_writer(out, self.writer.parsed, _record(change))
        return out.getvalue()

    def writer_of(self, data: bytes) -> SchemaVersion:
        if len(data) < _HEADER_END or data[:2] != SINGLE_OBJECT_MAGIC:
            raise LedgerDecodeError("not an Avro single-object change record")
        digest = bytes(data[2:_HEADER_END])
        try:
            return self.catalog.by_fingerprint(digest)
        except SchemaCatalogError:
            pass
        known = self._fetched.get(digest)
        if known is None and self.resolve is not None:
            text = self.resolve(digest)
            if text is not None:
                known = load_version(orjson.loads(text), 0, None, CHANGE_RECORD)
                if known.fingerprint == digest:
                    self._fetched[digest] = known
                else:
                    known = None
        if known is None:
            raise LedgerDecodeError(
                f"change record written with a schema this reader does not know ({digest.hex()})"
            )
        return known

    def decode(self, data: bytes) -> ProjectionChange:
        writer = self.writer_of(data)
        try:
            record = schemaless_reader(
                BytesIO(data[_HEADER_END:]), writer.parsed, self.reader.parsed
            )
        except Exception as exc:  # fastavro raises many types for bad bytes
            raise LedgerDecodeError(f"undecodable change record: {type(exc).__name__}") from exc
        assert isinstance(record, dict)
        return from_record(record)


def from_record(record: dict[str, Any]) -> ProjectionChange:
    """A decoded Avro record (fastavro or Apache ``avro``) as a change."""
    state = record.get("state_json")
    inputs = record.get("inputs_json")
    at = record["committed_at"]
    if isinstance(at, int):  # a reader that does not apply logical types
        at = datetime.fromtimestamp(at / 1e6, UTC)
    kind = record.get("kind", "UNKNOWN")
    return ProjectionChange(
        change_id=record["change_id"],
        kind=kind if kind in ("STATE", "REMOVED", "BUILD_CHANGED") else "UNKNOWN",
        projection=record["projection"],
        build=record["build"],
        projection_version=record["projection_version"],
        committed_at=at,
        fleet_id=record.get("fleet_id"),
        run_id=record.get("run_id"),
        applied_seq=record.get("applied_seq", 0),
        held=record.get("held", 0),
        state=None if state is None else orjson.loads(state),
        previous_build=record.get("previous_build"),
        inputs=None if inputs is None else orjson.loads(inputs),
        traceparent=record.get("traceparent"),
        extra={k: v for k, v in record.items() if k not in _KNOWN} or None,
    )
