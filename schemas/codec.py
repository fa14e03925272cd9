"""Bytes <-> `LedgerEntry`: Avro single-object encoding, or the Confluent wire format.

Single-object: C3 01 + 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema + Avro
binary. Confluent: 00 + 4-byte big-endian schema id + Avro binary, with ids resolved to
fingerprints by a mapping or callable (the registry client lives elsewhere). Decoding detects the
format from the first byte, finds the writer schema in the catalog and resolves it to the reader
schema. Every decoding failure is a `LedgerDecodeError`; every encoding failure a
`LedgerValidationError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from io import BytesIO
from typing import Any, Literal

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from pydantic import ValidationError

from schemas.catalog import SchemaCatalog, SchemaVersion, default_catalog
from schemas.errors import (
    AgentLedgerError,
    CodecConfigError,
    LedgerDecodeError,
    LedgerValidationError,
    SchemaCatalogError,
)
from schemas.models import (
    LedgerEntry,
    avro_record,
    model_input,
    parse_entries,
    parse_entry,
    validation_error,
)

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
WireFormat = Literal["single_object", "confluent"]
Buffer = bytes | bytearray | memoryview
SchemaIdResolver = Mapping[int, bytes] | Callable[[int], bytes | None]

_POSITION_FIELDS = [{"name": "run_id", "type": "string"}, {"name": "sequence_no", "type": "long"}]
_FINGERPRINT_END = len(SINGLE_OBJECT_MAGIC) + 8
_SCHEMA_ID_END = len(CONFLUENT_MAGIC) + 4


class LedgerCodec:
    """Encodes entries with one writer schema and decodes any catalogued writer to one reader."""

    def __init__(
        self,
        catalog: SchemaCatalog | None = None,
        *,
        reader_version: int | None = None,
        writer_version: int | None = None,
        wire_format: WireFormat = "single_object",
        schema_ids: SchemaIdResolver | None = None,
        writer_schema_id: int | None = None,
        validate: bool = True,
        entry_type: type[LedgerEntry] = LedgerEntry,
    ) -> None:
        """`schema_ids` maps Confluent schema ids to fingerprints (for decoding, and for encoding
        when `writer_schema_id` is not given). `validate=False` skips re-validating entries on
        encode (for publishers that only encode freshly constructed entries). `entry_type` is
        the model decoded entries become: a subclass of LedgerEntry that mirrors a newer reader
        schema (a field the code does not know yet) during a schema change."""
        self.catalog = catalog or default_catalog()
        self.reader = _version(self.catalog, reader_version)
        self.writer = _version(self.catalog, writer_version)
        self._resolve_id = _id_resolver(schema_ids)
        self._header = _header(wire_format, self.writer, schema_ids, writer_schema_id)
        self._validate = validate
        self.entry_type = entry_type
        self._positions: dict[bytes, Any] = {}  # writer fingerprint -> parsed position reader

    def encode(self, entry: LedgerEntry) -> bytes:
        """Encode an entry; raises LedgerValidationError naming the offending field."""
        if not isinstance(entry, LedgerEntry):
            raise LedgerValidationError(
                "entry", f"expected LedgerEntry, got {type(entry).__name__}"
            )
        dumped = entry.model_dump(warnings=False)
        if self._validate:
            parse_entry(dumped)
        return self.encode_record(avro_record(dumped))

    def encode_record(self, record: Mapping[str, Any]) -> bytes:
        """Encode a raw fastavro record with the writer schema (parts in tuple notation)."""
        buffer = BytesIO()
        buffer.write(self._header)
        try:
            schemaless_writer(buffer, self.writer.parsed, record)
        except Exception as exc:  # fastavro raises ValueError, TypeError, OverflowError, ...
            raise LedgerValidationError(
                "entry", f"not encodable as v{self.writer.version}: {exc}"
            ) from None
        return buffer.getvalue()

    def decode(self, data: Buffer) -> LedgerEntry:
        """Decode one message; raises LedgerDecodeError and nothing else, whatever the bytes."""
        try:
            return _entry(self.decode_record(data), self.entry_type)
        except LedgerDecodeError:
            raise
        except AgentLedgerError:
            raise  # a schema registry's retriable error: the caller retries
        except Exception as exc:  # e.g. RecursionError or MemoryError from a hostile body
            raise LedgerDecodeError(f"undecodable entry: {_why(exc)}") from None

    def decode_record(self, data: Buffer) -> dict[str, Any]:
        """Decode to the reader schema's raw record (parts as (record name, record) tuples)."""
        writer, offset = self._writer_of(data)
        buffer = BytesIO(data)
        buffer.seek(offset)
        reader = None if writer is self.reader else self.reader.parsed
        try:
            record = schemaless_reader(
                buffer,
                writer.parsed,
                reader,
                return_record_name=True,
                return_record_name_override=True,
            )
        except Exception as exc:  # truncated, corrupt or unresolvable bodies surface many types
            raise LedgerDecodeError(
                f"bad Avro body for schema v{writer.version}: {_why(exc)}"
            ) from exc
        _check_consumed(buffer, len(data))
        return record  # type: ignore[return-value]

    def decode_position(self, data: Buffer) -> tuple[str, int]:
        """A message's (run_id, sequence_no) alone: the whole Avro body is read (a corrupt or
        truncated one raises LedgerDecodeError, as ``decode`` does) but only those two fields are
        built, and the entry is not validated as a model (about 4x cheaper than ``decode``)."""
        writer, offset = self._writer_of(data)
        reader = self._positions.get(writer.fingerprint)
        if reader is None:
            reader = self._positions[writer.fingerprint] = parse_schema(
                {"type": "record", "name": writer.parsed["name"], "fields": _POSITION_FIELDS}
            )
        buffer = BytesIO(data)
        buffer.seek(offset)
        try:
            record: dict[str, Any] = schemaless_reader(buffer, writer.parsed, reader)  # type: ignore[assignment]
        except Exception as exc:
            raise LedgerDecodeError(
                f"bad Avro body for schema v{writer.version}: {_why(exc)}"
            ) from None
        _check_consumed(buffer, len(data))
        return record["run_id"], record["sequence_no"]

    def decode_many(self, messages: Iterable[Buffer]) -> list[LedgerEntry]:
        """Decode a batch; raises LedgerDecodeError naming the index of the first bad message."""
        inputs = [_indexed(index, self.decode_record, data) for index, data in enumerate(messages)]
        try:
            return parse_entries([model_input(record) for record in inputs])
        except LedgerValidationError as exc:
            raise LedgerDecodeError(f"message {exc.field}: {exc.message}") from None

    def decode_each(self, messages: Iterable[Buffer]) -> list[LedgerEntry | LedgerDecodeError]:
        """Decode a batch, returning each message's entry or its error (for dead-lettering)."""
        return [self._try_decode(data) for data in messages]

    def writer_of(self, data: Buffer) -> SchemaVersion:
        """The writer schema version named by a message's header; raises LedgerDecodeError."""
        return self._writer_of(data)[0]

    def _try_decode(self, data: Buffer) -> LedgerEntry | LedgerDecodeError:
        try:
            return self.decode(data)
        except LedgerDecodeError as exc:
            return exc

    def _writer_of(self, data: Buffer) -> tuple[SchemaVersion, int]:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise LedgerDecodeError(f"expected bytes, got {type(data).__name__}")
        if data[:2] == SINGLE_OBJECT_MAGIC:
            return self._by_fingerprint(data)
        if data[:1] == CONFLUENT_MAGIC:
            return self._by_schema_id(data)
        raise LedgerDecodeError(
            f"bad magic {bytes(data[:2]).hex() or '(empty)'}: expected c301 (single-object) "
            "or 00 (Confluent)"
        )

    def _by_fingerprint(self, data: Buffer) -> tuple[SchemaVersion, int]:
        if len(data) < _FINGERPRINT_END:
            raise LedgerDecodeError(f"truncated single-object header: {len(data)} bytes")
        return self._lookup(bytes(data[2:_FINGERPRINT_END])), _FINGERPRINT_END

    def _by_schema_id(self, data: Buffer) -> tuple[SchemaVersion, int]:
        if self._resolve_id is None:
            raise LedgerDecodeError("Confluent wire format, but no schema-id mapping is configured")
        if len(data) < _SCHEMA_ID_END:
            raise LedgerDecodeError(f"truncated Confluent header: {len(data)} bytes")
        schema_id = int.from_bytes(data[1:_SCHEMA_ID_END], "big")
        return self._lookup(_lookup_id(self._resolve_id, schema_id)), _SCHEMA_ID_END

    def _lookup(self, digest: bytes) -> SchemaVersion:
        try:
            return self.catalog.by_fingerprint(digest)
        except SchemaCatalogError:
            raise LedgerDecodeError(
                f"unknown writer schema fingerprint {digest.hex()}: "
                "deploy its .avsc to readers before writers use it"
            ) from None


def _entry(record: dict[str, Any], entry_type: type[LedgerEntry] = LedgerEntry) -> LedgerEntry:
    try:
        if entry_type is LedgerEntry:
            return parse_entry(model_input(record))
        return entry_type.model_validate(model_input(record))
    except LedgerValidationError as exc:
        raise LedgerDecodeError(f"entry breaks the contract at {exc}") from None
    except ValidationError as exc:
        raise LedgerDecodeError(f"entry breaks the contract at {validation_error(exc)}") from None


def _indexed(
    index: int, decode: Callable[[Buffer], dict[str, Any]], data: Buffer
) -> dict[str, Any]:
    try:
        return decode(data)
    except LedgerDecodeError as exc:
        raise LedgerDecodeError(f"message {index}: {exc}") from None


def _check_consumed(buffer: BytesIO, size: int) -> None:
    if buffer.tell() != size:
        raise LedgerDecodeError(f"{size - buffer.tell()} unread bytes after the entry")


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _version(catalog: SchemaCatalog, version: int | None) -> SchemaVersion:
    if version is None:
        return catalog.current
    try:
        return catalog.by_version(version)
    except SchemaCatalogError as exc:
        raise CodecConfigError(str(exc)) from None


def _id_resolver(schema_ids: SchemaIdResolver | None) -> Callable[[int], bytes | None] | None:
    if schema_ids is None or callable(schema_ids):
        return schema_ids
    return dict(schema_ids).get


def _lookup_id(resolve: Callable[[int], bytes | None], schema_id: int) -> bytes:
    try:
        digest = resolve(schema_id)
    except AgentLedgerError:
        raise  # e.g. a registry client's retriable error: the caller decides
    except Exception as exc:
        raise LedgerDecodeError(f"schema id {schema_id}: lookup failed: {_why(exc)}") from exc
    if digest is None:
        raise LedgerDecodeError(f"unknown Confluent schema id {schema_id}")
    if not isinstance(digest, bytes) or len(digest) != 8:
        raise LedgerDecodeError(f"schema id {schema_id}: resolver gave {digest!r}, not 8 bytes")
    return digest


def _header(
    wire_format: WireFormat,
    writer: SchemaVersion,
    schema_ids: SchemaIdResolver | None,
    writer_schema_id: int | None,
) -> bytes:
    if wire_format == "single_object":
        return SINGLE_OBJECT_MAGIC + writer.fingerprint
    if wire_format != "confluent":
        raise CodecConfigError(f"unknown wire format {wire_format!r}")
    schema_id = writer_schema_id if writer_schema_id is not None else _id_of(writer, schema_ids)
    if not 0 <= schema_id < 2**32:
        raise CodecConfigError(f"schema id {schema_id} does not fit 4 bytes")
    return CONFLUENT_MAGIC + schema_id.to_bytes(4, "big")


def _id_of(writer: SchemaVersion, schema_ids: SchemaIdResolver | None) -> int:
    if isinstance(schema_ids, Mapping):
        for schema_id, digest in schema_ids.items():
            if digest == writer.fingerprint:
                return schema_id
    raise CodecConfigError(
        f"Confluent encoding needs writer_schema_id or a schema_ids mapping holding "
        f"fingerprint {writer.fingerprint_hex} (v{writer.version})"
    )


_DEFAULT_CODEC = LedgerCodec()


def default_codec() -> LedgerCodec:
    """Single-object codec over the import-time catalog (newest reader and writer)."""
    return _DEFAULT_CODEC


def encode(entry: LedgerEntry) -> bytes:
    """Encode with the default codec; raises LedgerValidationError."""
    return _DEFAULT_CODEC.encode(entry)


def decode(data: Buffer) -> LedgerEntry:
    """Decode with the default codec; raises LedgerDecodeError."""
    return _DEFAULT_CODEC.decode(data)


def decode_many(messages: Iterable[Buffer]) -> list[LedgerEntry]:
    """Decode a batch with the default codec; raises LedgerDecodeError."""
    return _DEFAULT_CODEC.decode_many(messages)
