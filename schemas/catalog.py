"""Every ledger schema version, parsed once at import and indexed by version and fingerprint.

Versions come from `avsc/ledger_entry.v<N>.avsc`; the highest N is the current reader schema and
the one the pydantic models mirror. Fingerprints are CRC-64-AVRO (Rabin) of the Parsing Canonical
Form, as 8 little-endian bytes, exactly as they appear in a single-object header.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas.errors import SchemaCatalogError

AVSC_DIR = Path(__file__).parent / "avsc"
RECORD_NAME = "agentledger.LedgerEntry"


@dataclass(frozen=True, slots=True, eq=False)
class SchemaVersion:
    """One version of the envelope schema. Treat `schema` and `parsed` as read-only."""

    version: int
    schema: dict[str, Any]
    parsed: dict[str, Any]
    canonical_form: str
    fingerprint: bytes
    path: Path | None = None

    @property
    def fingerprint_hex(self) -> str:
        """The fingerprint as 16 hex digits, in header byte order."""
        return self.fingerprint.hex()

    @property
    def schema_json(self) -> str:
        """The schema as a JSON document (what another Avro library should parse)."""
        return json.dumps(self.schema)


def load_version(
    schema: Mapping[str, Any],
    version: int,
    path: Path | None = None,
    record_name: str = RECORD_NAME,
) -> SchemaVersion:
    """Parse one schema version; raises SchemaCatalogError if it is not a valid envelope
    (its top level the record ``record_name``)."""
    where = str(path) if path else f"v{version}"
    document = copy.deepcopy(dict(schema))
    _check_envelope(document, where, record_name)
    try:
        parsed = cast("dict[str, Any]", parse_schema(document))
        canonical = to_parsing_canonical_form(parsed)
    except Exception as exc:  # fastavro raises several unrelated types for bad schemas
        raise SchemaCatalogError(f"{where}: invalid Avro schema: {exc}") from exc
    digest = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    return SchemaVersion(version, document, parsed, canonical, digest, path)


def _check_envelope(document: Mapping[str, Any], where: str, record_name: str) -> None:
    name = document.get("name", "")
    full = name if "." in name else f"{document.get('namespace', '')}.{name}"
    if document.get("type") != "record" or full != record_name:
        raise SchemaCatalogError(f"{where}: top level must be the record {record_name}")


def load_file(
    path: Path, stem: str = "ledger_entry", record_name: str = RECORD_NAME
) -> SchemaVersion:
    """Parse `<stem>.v<N>.avsc` (`ledger_entry.v<N>.avsc` by default); raises
    SchemaCatalogError."""
    match = re.match(rf"^{re.escape(stem)}\.v([1-9][0-9]*)\.avsc$", path.name)
    if match is None:
        raise SchemaCatalogError(f"{path}: file name must be {stem}.v<N>.avsc")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SchemaCatalogError(f"{path}: cannot read schema JSON: {exc}") from exc
    return load_version(document, int(match.group(1)), path, record_name)


class SchemaCatalog:
    """Immutable set of schema versions; lookups by version and by fingerprint."""

    def __init__(self, versions: Iterable[SchemaVersion], what: str = "ledger") -> None:
        self.what = what
        ordered = tuple(sorted(versions, key=lambda v: v.version))
        if not ordered:
            raise SchemaCatalogError("a schema catalog needs at least one version")
        self._versions = ordered
        self._by_version = _unique(ordered, lambda v: v.version, "version")
        self._by_fingerprint = _unique(ordered, lambda v: v.fingerprint, "fingerprint")

    @classmethod
    def from_directory(
        cls,
        directory: Path = AVSC_DIR,
        stem: str = "ledger_entry",
        record_name: str = RECORD_NAME,
        what: str = "ledger",
    ) -> SchemaCatalog:
        """Load every `<stem>.v<N>.avsc` in a directory."""
        paths = sorted(directory.glob(f"{stem}*.avsc"))
        return cls((load_file(path, stem, record_name) for path in paths), what)

    @property
    def versions(self) -> tuple[SchemaVersion, ...]:
        """All versions, oldest first."""
        return self._versions

    @property
    def current(self) -> SchemaVersion:
        """The newest version: the reader schema and the one the models mirror."""
        return self._versions[-1]

    def by_version(self, version: int) -> SchemaVersion:
        """The given version; raises SchemaCatalogError if absent."""
        try:
            return self._by_version[version]
        except KeyError:
            raise SchemaCatalogError(f"no {self.what} schema version {version}") from None

    def by_fingerprint(self, digest: bytes) -> SchemaVersion:
        """The version with this 8-byte fingerprint; raises SchemaCatalogError if absent."""
        try:
            return self._by_fingerprint[digest]
        except KeyError:
            raise SchemaCatalogError(
                f"no {self.what} schema with fingerprint {digest.hex()}"
            ) from None

    def with_version(self, schema: Mapping[str, Any], version: int) -> SchemaCatalog:
        """A new catalog with one more version (e.g. a test's in-memory v2); self is unchanged."""
        record = f"{self.current.schema.get('namespace', '')}.{self.current.schema['name']}"
        if "." in self.current.schema["name"]:
            record = self.current.schema["name"]
        return SchemaCatalog(
            (*self._versions, load_version(schema, version, None, record)), self.what
        )


def _unique(
    versions: tuple[SchemaVersion, ...], key: Callable[[SchemaVersion], Hashable], what: str
) -> dict[Hashable, SchemaVersion]:
    index: dict[Hashable, SchemaVersion] = {}
    for version in versions:
        clash = index.setdefault(key(version), version)
        if clash is not version:
            raise SchemaCatalogError(f"v{clash.version} and v{version.version} share a {what}")
    return index


CATALOG = SchemaCatalog.from_directory()


def default_catalog() -> SchemaCatalog:
    """The catalog of `schemas/avsc`, loaded once at import."""
    return CATALOG
