"""Secret redaction before encoding: nothing secret reaches Kafka, PostgreSQL, Redis or logs.

Pure functions. Each finding names the secret's *type* and the *field* it was found in, never the
value. A redacted value becomes ``[REDACTED:<type>]``.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from schemas.json_form import from_json, to_json
from schemas.models import LedgerEntry

_SECRET_KEY = (
    r"(?:pass(?:word|wd|phrase)?|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
    r"private[_-]?key|credentials?|auth(?!or)(?:orization)?|session[_-]?key|signing[_-]?key|dsn)"
)
SECRET_KEY_RE = re.compile(rf"(?i){_SECRET_KEY}")
# Under these keys any value is a secret; under the other secret-looking keys only a
# high-entropy one is (``max_tokens: 4096`` and ``auth_method: oidc`` are not secrets).
STRONG_KEY_RE = re.compile(r"(?i)pass(?:word|wd|phrase)?|pwd|secret|private[_-]?key|credential")


@dataclass(frozen=True)
class Finding:
    """One redaction: what kind of secret, in which field. Never the value."""

    type: str
    field: str


# (type, regex, group to replace: 0 = the whole match). Order matters: whole blocks and
# structured tokens first, the generic KEY=VALUE rules last.
_RULES: list[tuple[str, str, int]] = [
    (
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----",
        0,
    ),
    ("aws_access_key_id", r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b", 0),
    ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{60,})", 0),
    ("gitlab_token", r"\bgl(?:pat|dt|ptt|rt|cbt|ft|imt|oas|soat)-[A-Za-z0-9_\-]{20,}", 0),
    ("slack_token", r"\bxox[abposre]-[A-Za-z0-9\-]{10,}", 0),
    ("slack_webhook", r"https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9_/\-]{20,}", 0),
    ("jwt", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", 0),
    ("llm_api_key", r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{20,}", 0),
    ("stripe_key", r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}", 0),
    ("google_api_key", r"\bAIza[0-9A-Za-z_\-]{35}", 0),
    ("url_password", r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@]+:([^\s@/]+)@", 1),
    ("bearer_token", r"(?i)\b(?:bearer|token)\s+([A-Za-z0-9\-._~+/]{16,}=*)", 1),
    (
        "aws_secret_access_key",
        r"(?i)aws_?secret_?access_?key[\"']?\s*[=:]\s*[\"']?([A-Za-z0-9/+]{40})",
        1,
    ),
    (
        "env_secret",
        rf"(?im)^[ \t]*(?:export[ \t]+)?[A-Z0-9_]{{0,64}}{_SECRET_KEY}[A-Z0-9_]{{0,64}}[ \t]*="
        r"[ \t]*[\"']?([^\s\"']{4,})",
        1,
    ),
    (
        "keyed_secret",
        rf"(?i)(?<![A-Za-z0-9_\-])[A-Za-z0-9_\-]{{0,64}}{_SECRET_KEY}[A-Za-z0-9_\-]{{0,64}}"
        r"[\"']?\s*[=:]\s*"
        r"[\"']([^\"'\s]{8,})[\"']",
        1,
    ),
]
_PATTERNS = [(kind, re.compile(rx), group) for kind, rx, group in _RULES]


def marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


def shannon_entropy(value: str) -> float:
    if not value:
        return 0.0
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def looks_high_entropy(value: str) -> bool:
    """A credential-shaped value: long enough, no spaces, and far from natural language."""
    return len(value) >= 16 and " " not in value and shannon_entropy(value) >= 3.5


def redact_text(text: str, field: str) -> tuple[str, list[Finding]]:
    """Replace every secret found in ``text``; return the new text and what was found."""
    findings: list[Finding] = []
    for kind, pattern, group in _PATTERNS:
        text, n = _sub(pattern, group, kind, text)
        findings.extend(Finding(kind, field) for _ in range(n))
    return text, findings


def _sub(pattern: re.Pattern[str], group: int, kind: str, text: str) -> tuple[str, int]:
    count = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal count
        value = match.group(group)
        if value.startswith("[REDACTED:"):
            return match.group(0)
        count += 1
        whole = match.group(0)
        if group == 0:
            return marker(kind)
        start, end = match.start(group) - match.start(0), match.end(group) - match.start(0)
        return whole[:start] + marker(kind) + whole[end:]

    return pattern.sub(replace, text), count


def redact_value(value: Any, field: str) -> tuple[Any, list[Finding]]:
    """Walk a JSON value; strings under secret-looking keys go when high-entropy."""
    if isinstance(value, str):
        return redact_text(value, field)
    if isinstance(value, list):
        out: list[Any] = []
        findings: list[Finding] = []
        for i, item in enumerate(value):
            new, found = redact_value(item, f"{field}[{i}]")
            out.append(new)
            findings.extend(found)
        return out, findings
    if isinstance(value, dict):
        return _redact_mapping(value, field)
    return value, []


def _redact_mapping(value: dict[str, Any], field: str) -> tuple[dict[str, Any], list[Finding]]:
    out: dict[str, Any] = {}
    findings: list[Finding] = []
    for key, item in value.items():
        path = f"{field}.{key}" if field else key
        if isinstance(item, str) and _secret_under_key(key, item):
            kind = "keyed_secret" if STRONG_KEY_RE.search(key) else "high_entropy"
            out[key] = marker(kind)
            findings.append(Finding(kind, path))
            continue
        out[key], found = redact_value(item, path)
        findings.extend(found)
    return out, findings


def _secret_under_key(key: str, value: str) -> bool:
    if value.startswith("[REDACTED:") or not SECRET_KEY_RE.search(key):
        return False
    if STRONG_KEY_RE.search(key):
        return len(value) >= 4
    return looks_high_entropy(value)


def redact_json_string(text: str, field: str) -> tuple[str, list[Finding]]:
    """Redact a field that holds JSON text: by key when it parses, as plain text otherwise."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return redact_text(text, field)
    new, findings = redact_value(parsed, field)
    if not findings:
        return text, []
    return json.dumps(new, separators=(",", ":"), ensure_ascii=False), findings


# Envelope fields that are identifiers, hashes or enum symbols, never free text.
_STRUCTURAL = frozenset(
    {
        "entry_id",
        "fleet_id",
        "session_id",
        "run_id",
        "attempt_id",
        "step_id",
        "trace_id",
        "span_id",
        "occurred_at",
        "kind",
        "trust_level",
        "visibility",
        "run_status",
        "sequence_no",
        "type",
        "sha256",
        "content_hash",
        "arguments_hash",
        "tool_call_id",
        "parent_entry_id",
        "redactions",
    }
)
_JSON_TEXT_FIELDS = frozenset({"json_text", "raw_usage_json"})

_COARSE: dict[str, str] = {
    "url_password": "CREDENTIAL",
    "env_secret": "CREDENTIAL",
    "keyed_secret": "CREDENTIAL",
    "aws_secret_access_key": "CREDENTIAL",
    "high_entropy": "HIGH_ENTROPY",
}


def redact_document(doc: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    """Redact the JSON form of an entry: free text by pattern, JSON text and metadata by key too."""
    return _walk_doc(doc, "")


def _walk_doc(value: Any, path: str) -> tuple[Any, list[Finding]]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        findings: list[Finding] = []
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if key in _STRUCTURAL:
                out[key] = item
                continue
            if key in _JSON_TEXT_FIELDS and isinstance(item, str):
                out[key], found = redact_json_string(item, sub)
            elif key == "metadata" and isinstance(item, dict):
                out[key], found = _redact_mapping(item, sub)
            else:
                out[key], found = _walk_doc(item, sub)
            findings.extend(found)
        return out, findings
    if isinstance(value, list):
        items = [_walk_doc(item, f"{path}[{i}]") for i, item in enumerate(value)]
        return [v for v, _ in items], [f for _, fs in items for f in fs]
    if isinstance(value, str):
        return redact_text(value, path)
    return value, []


def redaction_records(findings: list[Finding]) -> list[dict[str, str]]:
    """The entry's ``redactions``: coarse type, field path and rule, never the value."""
    return [
        {"type": _COARSE.get(f.type, "SECRET_PATTERN"), "field": f.field, "rule": f.type}
        for f in findings
    ]


def redact_entry(entry: LedgerEntry) -> LedgerEntry:
    """The entry with every secret replaced and each replacement recorded in ``redactions``."""
    doc, findings = redact_document(to_json(entry))
    if not findings:
        return entry
    doc["redactions"] = [*doc.get("redactions", []), *redaction_records(findings)]
    return from_json(doc)
