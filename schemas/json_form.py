"""The JSON form of a ledger entry: lossless both ways, specified in `JSON_FORM.md`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from schemas.errors import LedgerValidationError
from schemas.models import LedgerEntry, parse_entry_json


def to_json(entry: LedgerEntry) -> dict[str, Any]:
    """The JSON form as a dict of JSON types (str, int, float, bool, None, list, dict)."""
    return entry.model_dump(mode="json")


def from_json(data: Mapping[str, Any]) -> LedgerEntry:
    """Parse the JSON form strictly; raises LedgerValidationError naming the field."""
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise LedgerValidationError("entry", f"not a JSON document: {exc}") from None
    except RecursionError:
        raise LedgerValidationError("entry", "not a JSON document: nested too deeply") from None
    return parse_entry_json(text)


def to_json_text(entry: LedgerEntry) -> str:
    """The JSON form serialized as compact UTF-8 text."""
    return json.dumps(to_json(entry), ensure_ascii=False, separators=(",", ":"))


def from_json_text(text: str | bytes) -> LedgerEntry:
    """Parse JSON-form text; raises LedgerValidationError."""
    return parse_entry_json(text)
