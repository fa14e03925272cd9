"""API tokens of ``agentledger serve``: made here, kept only as their SHA-256 in PostgreSQL
(``projectors/stores/api_tokens.py``), each scoped to fleets. A token is 32 random bytes, so a
plain hash is enough to keep it (no password stretching needed)."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from infra.settings import Settings
from projectors.stores import api_tokens as store
from projectors.stores import postgres_ops as ops
from schemas.errors import BadArgumentError

PREFIX = "alt_"
_DURATION = re.compile(r"^(\d+)([dhm]?)$")


@dataclass(frozen=True)
class Principal:
    """Who a request is: a valid token's id, its fleets and whether it is an admin's."""

    token_id: str
    fleets: tuple[str, ...]
    admin: bool


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse_expiry(text: str, now: datetime | None = None) -> datetime:
    """``--expires D``: ``30`` or ``30d`` days, ``12h`` hours, ``45m`` minutes from now."""
    found = _DURATION.match(text.strip())
    if found is None or int(found[1]) <= 0:
        raise BadArgumentError(f"--expires takes a duration such as 30d, 12h or 45m, not {text!r}")
    unit = {"": "days", "d": "days", "h": "hours", "m": "minutes"}[found[2]]
    return (now or datetime.now(UTC)) + timedelta(**{unit: int(found[1])})


def create_token(
    settings: Settings, fleets: Sequence[str], admin: bool = False, expires: datetime | None = None
) -> dict[str, Any]:
    """A new token for ``fleets``: the token itself (shown once, kept nowhere) and its id."""
    if not fleets:
        raise BadArgumentError("a token needs at least one fleet (--fleet)")
    token_id = secrets.token_hex(4)
    token = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    with ops.connect(settings.pg_address) as conn:
        store.insert_token(conn, token_id, token_hash(token), sorted(set(fleets)), admin, expires)
    return {
        "token": token,
        "token_id": token_id,
        "fleets": sorted(set(fleets)),
        "admin": admin,
        "expires_at": expires.isoformat() if expires else None,
    }


def list_tokens(settings: Settings) -> list[dict[str, Any]]:
    with ops.connect(settings.pg_address) as conn:
        return store.list_tokens(conn)


def revoke_token(settings: Settings, token_id: str) -> bool:
    with ops.connect(settings.pg_address) as conn:
        return store.revoke_token(conn, token_id)


def authenticate(settings: Settings, token: str | None) -> Principal | None:
    """The principal of a valid token (None: no token, unknown, revoked or expired)."""
    if not token or not token.startswith(PREFIX) or len(token) > 200:
        return None
    with ops.connect(settings.pg_address) as conn:
        row = store.token_by_hash(conn, token_hash(token))
    if row is None or not row["valid"]:
        return None
    return Principal(row["token_id"], tuple(row["fleets"]), row["admin"])
