"""Secret redaction before encoding: nothing secret reaches Kafka, PostgreSQL, Redis or logs.

Every string of an entry is scanned with the gitleaks rule set (:mod:`schemas.secret_scan`):

- free text and names (text, summaries, messages, tool names, paths, signatures, metadata
  values, JSON documents) have each secret replaced by ``[REDACTED:<rule>]``;
- identifiers (entry, run, tool-call, response ids, evidence refs) and metadata keys are never
  rewritten, since a changed id would join or split the wrong things: one that holds a secret
  is rejected with a :class:`LedgerValidationError` naming the field and the rule;
- enum symbols, timestamps and hex hashes are left alone: the contract (``schemas.models``)
  confines them to formats that cannot hold a secret.

**The value, not only the match**: once a secret is found anywhere in the entry, a second pass
redacts every other occurrence of that value, in every field (names, paths, metadata values,
JSON texts, each copy in a text), where a rule would not fire without the first one's context;
an identifier or metadata key holding it is refused.

Each replacement is recorded in the entry's ``redactions`` (coarse type, field, rule), never the
value, and no message here quotes one.
"""

from __future__ import annotations

import json
import re
from typing import Any

from schemas.errors import LedgerValidationError
from schemas.json_form import from_json, to_json
from schemas.models import LedgerEntry
from schemas.secret_scan import GENERIC, Finding, SecretDetector, default_detector, marker, merge

# Fields whose values are identifiers: checked, never rewritten.
IDENTIFIERS = frozenset(
    {
        "entry_id",
        "fleet_id",
        "session_id",
        "run_id",
        "attempt_id",
        "step_id",
        "parent_entry_id",
        "tool_call_id",
        "approval_id",
        "provider_response_id",
        "artifact_id",
        "source_entry_id",
        "evidence_refs",
        "commit_sha",
        "base_sha",
        "workspace_tree_hash",
    }
)
# Fields the contract confines to enum symbols, timestamps, numbers or hex.
_SAFE = frozenset(
    {
        "trace_id",
        "span_id",
        "sha256",
        "content_hash",
        "arguments_hash",
        "occurred_at",
        "started_at",
        "finished_at",
        "kind",
        "trust_level",
        "visibility",
        "run_status",
        "type",
        "status",
        "permission_class",
        "classification",
        "redaction_level",
        "item_kind",
    }
)
_JSON_TEXT = frozenset({"json_text", "raw_usage_json"})
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_CREDENTIAL_RULES = GENERIC | {"url-credentials", "env-secret-assignment"}
# A secret value this long or longer is redacted wherever else it occurs in the entry (a shorter
# match, e.g. a 4-character password, would take ordinary words with it).
MIN_COPY_CHARS = 6
_QUOTES = "\"'`"


class SecretInIdentifierError(LedgerValidationError):
    """An identifier or metadata key looks like a secret; ids are never rewritten, so the entry
    is refused. Use an opaque id (a UUID, a counter) and put nothing secret in it."""


class _Walk:
    """One entry's redaction pass: the new values and what was found where."""

    def __init__(self, detector: SecretDetector) -> None:
        self.detector = detector
        self.found: list[tuple[str, str]] = []  # (field path, rule)
        self.values: dict[str, str] = {}  # each secret value found -> its rule (never logged)

    def value(self, value: Any, path: str, key: str, file_path: str | None = None) -> Any:
        if isinstance(value, dict):
            return self.mapping(value, path)
        if isinstance(value, list):
            if key in IDENTIFIERS:
                for i, item in enumerate(value):
                    self.identifier(item, f"{path}[{i}]")
                return value
            return [self.value(item, f"{path}[{i}]", key) for i, item in enumerate(value)]
        if not isinstance(value, str) or key in _SAFE:
            return value
        if key in IDENTIFIERS:
            self.identifier(value, path)
            return value
        if key in _JSON_TEXT:
            return self.json_text(value, path)
        return self.text(value, path, file_path)

    def mapping(self, doc: dict[str, Any], path: str) -> dict[str, Any]:
        file_path = doc.get("path") if isinstance(doc.get("path"), str) else None
        out: dict[str, Any] = {}
        for key, item in doc.items():
            sub = f"{path}.{key}" if path else key
            if key == "metadata" and isinstance(item, dict):
                out[key] = self.metadata(item, sub)
            else:
                out[key] = self.value(item, sub, key, file_path)
        return out

    def identifier(self, value: Any, path: str) -> None:
        if isinstance(value, str):
            self._refuse_secret(value, path, "identifiers")

    def _refuse_secret(self, value: str, path: str, what: str) -> None:
        findings = self.detector.find(value)
        if findings:
            raise SecretInIdentifierError(
                path,
                f"looks like a secret (rule {findings[0].rule}); {what} are never rewritten, "
                "so the entry is refused: use an opaque id",
            )

    def text(self, value: str, path: str, file_path: str | None = None) -> str:
        return self._replace(value, self.detector.find(value, file_path), path)

    def _replace(self, value: str, findings: list[Finding], path: str) -> str:
        if not findings:
            return value
        pieces, at = [], 0
        for f in findings:
            pieces += [value[at : f.start], marker(f.rule)]
            at = f.end
            self.found.append((path, f.rule))
            # A rule's match may take the quotes around the value (``"…"``): the copies
            # elsewhere are the value itself (a JSON string holds it without its quotes).
            secret = value[f.start : f.end].strip(_QUOTES)
            if len(secret) >= MIN_COPY_CHARS:
                self.values.setdefault(secret, f.rule)
        return "".join([*pieces, value[at:]])

    def metadata(self, doc: dict[str, str], path: str) -> dict[str, str]:
        out = {}
        for key, value in doc.items():
            self._refuse_secret(key, f"{path}.<key>", "metadata keys")
            out[key] = self.keyed(key, value, f"{path}.{key}")
        return out

    def keyed(self, key: str, value: str, path: str) -> str:
        """A value scanned with its key in front (``DB_PASSWORD = "..."``), as it would appear
        in a config file, so key-based rules see their context; only the value is rewritten."""
        head = f'{key} = "'
        line = f'{head}{value}"'
        spans = [
            Finding(f.rule, max(f.start - len(head), 0), min(f.end - len(head), len(value)))
            for f in self.detector.find(line)
            if f.end > len(head)
        ]
        return self._replace(value, merge([*self.detector.find(value), *spans]), path)

    def json_text(self, text: str, path: str) -> str:
        """JSON text scanned as the strings it holds (escapes such as ``\\n`` or ``\\u0067``
        resolved, so they hide nothing; each value with its key in front); kept byte for byte
        when nothing is found, else written again compactly."""
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            return self.text(text, path)  # the contract rejects it later, with its reason
        before = len(self.found)
        new = self._json_value(parsed, path, None)
        if len(self.found) == before:
            return text
        return json.dumps(new, ensure_ascii=False, separators=(",", ":"))

    def _json_value(self, value: Any, path: str, key: str | None) -> Any:
        if isinstance(value, str):
            return self.keyed(key, value, path) if key else self.text(value, path)
        if isinstance(value, list):
            return [self._json_value(v, path, key) for v in value]
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                new_key = self.text(k, path) if isinstance(k, str) else k
                out[new_key] = self._json_value(v, f"{path}.{_json_key(new_key)}", str(k))
            return out
        return value


class _Copies:
    """The second pass: every other occurrence of a secret value the first pass found, in any
    field (names, paths, JSON texts, every copy), replaced by its rule's marker; an identifier
    or metadata key holding one is refused, as in the first pass."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.found: list[tuple[str, str]] = []
        # longest first, so a value inside a longer one does not split it
        self._pattern = re.compile("|".join(re.escape(v) for v in sorted(values, key=len)[::-1]))

    def value(self, value: Any, path: str, key: str) -> Any:
        if isinstance(value, dict):
            return self.mapping(value, path)
        if isinstance(value, list):
            return [self.value(item, f"{path}[{i}]", key) for i, item in enumerate(value)]
        if not isinstance(value, str) or key in _SAFE:
            return value
        if key in _JSON_TEXT:  # (searched as the strings it holds: escapes hide a raw match)
            return self.json_text(value, path)
        if not self._pattern.search(value):
            return value
        if key in IDENTIFIERS:
            raise SecretInIdentifierError(
                path,
                f"holds a secret found elsewhere in the entry (rule {self._rule_in(value)}); "
                "identifiers are never rewritten, so the entry is refused: use an opaque id",
            )
        return self.text(value, path)

    def mapping(self, doc: dict[str, Any], path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, item in doc.items():
            sub = f"{path}.{key}" if path else key
            if key == "metadata" and isinstance(item, dict):
                for name in item:
                    if self._pattern.search(name):
                        raise SecretInIdentifierError(
                            f"{sub}.<key>",
                            f"holds a secret found elsewhere in the entry (rule "
                            f"{self._rule_in(name)}); metadata keys are never rewritten, so the "
                            "entry is refused",
                        )
                out[key] = {k: self.value(v, f"{sub}.{k}", k) for k, v in item.items()}
            else:
                out[key] = self.value(item, sub, key)
        return out

    def _rule_in(self, text: str) -> str:
        m = self._pattern.search(text)
        return self.values[m.group(0)] if m else "?"

    def text(self, value: str, path: str) -> str:
        def swap(m: re.Match[str]) -> str:
            rule = self.values[m.group(0)]
            self.found.append((path, rule))
            return marker(rule)

        return self._pattern.sub(swap, value)

    def json_text(self, text: str, path: str) -> str:
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            return self.text(text, path)
        before = len(self.found)
        new = self._json_value(parsed, path)
        if len(self.found) == before:  # only escaped forms matched: redact the raw text too
            raw = self.text(text, path)
            try:
                json.loads(raw)
            except (ValueError, RecursionError):
                # the copy spanned JSON syntax (a quote, a brace): keep a valid document, the
                # redacted text as one JSON string, rather than have the entry refused
                return json.dumps(raw, ensure_ascii=False)
            return raw
        return json.dumps(new, ensure_ascii=False, separators=(",", ":"))

    def _json_value(self, value: Any, path: str) -> Any:
        if isinstance(value, str):
            return self.text(value, path)
        if isinstance(value, list):
            return [self._json_value(v, path) for v in value]
        if isinstance(value, dict):
            return {
                (self.text(k, path) if isinstance(k, str) else k): self._json_value(
                    v, f"{path}.{_json_key(k)}"
                )
                for k, v in value.items()
            }
        return value


def _json_key(key: str) -> str:
    """A JSON key as a field path step: kept when it is a plain name, else ``<key>``."""
    return key if _PLAIN_KEY.match(key) else "<key>"


def redact_document(
    doc: dict[str, Any], detector: SecretDetector | None = None
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Redact the JSON form of an entry; return it and the (field, rule) of each redaction.
    Raises :class:`SecretInIdentifierError` when an identifier or metadata key holds a secret."""
    walk = _Walk(detector or default_detector())
    redacted = walk.mapping(doc, "")
    if not walk.values:
        return redacted, walk.found
    copies = _Copies(walk.values)  # the value, not only the match: every copy of it
    return copies.mapping(redacted, ""), walk.found + copies.found


def redaction_records(found: list[tuple[str, str]]) -> list[dict[str, str]]:
    """The entry's ``redactions``: coarse type, field path and rule, never the value."""
    return [
        {
            "type": "CREDENTIAL" if rule in _CREDENTIAL_RULES else "SECRET_PATTERN",
            "field": field,
            "rule": rule,
        }
        for field, rule in found
    ]


def redact_entry(entry: LedgerEntry, detector: SecretDetector | None = None) -> LedgerEntry:
    """The entry with every secret replaced and each replacement recorded in ``redactions``."""
    doc, found = redact_document(to_json(entry), detector)
    if not found:
        return entry
    doc["redactions"] = [*doc.get("redactions", []), *redaction_records(found)]
    return from_json(doc)
