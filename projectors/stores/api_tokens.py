"""PostgreSQL side of the API tokens (``consumers/access.py``): the ``al_api_tokens`` rows,
each holding a token's hash (never the token), its fleets, whether it is an admin's, its expiry
and revocation. Each function takes an open connection; connecting is the caller's."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import Connection

_COLUMNS = "token_id, fleets, admin, created_at, expires_at, revoked_at"


def insert_token(
    conn: Connection[Any],
    token_id: str,
    token_hash: bytes,
    fleets: Sequence[str],
    admin: bool,
    expires_at: datetime | None,
) -> None:
    conn.execute(
        "INSERT INTO al_api_tokens (token_id, token_hash, fleets, admin, expires_at) "
        "VALUES (%s, %s, %s, %s, %s)",
        (token_id, token_hash, list(fleets), admin, expires_at),
    )


def token_by_hash(conn: Connection[Any], token_hash: bytes) -> dict[str, Any] | None:
    """The token whose hash is ``token_hash``, with ``valid``: not revoked, not expired (by the
    database's clock)."""
    row = conn.execute(
        f"SELECT {_COLUMNS}, revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now()) "
        "FROM al_api_tokens WHERE token_hash = %s",
        (token_hash,),
    ).fetchone()
    if row is None:
        return None
    return {**_row(row[:-1]), "valid": bool(row[-1])}


def list_tokens(conn: Connection[Any]) -> list[dict[str, Any]]:
    rows = conn.execute(f"SELECT {_COLUMNS} FROM al_api_tokens ORDER BY created_at").fetchall()
    return [_row(r) for r in rows]


def revoke_token(conn: Connection[Any], token_id: str) -> bool:
    """Revoke a token; False when there is no such token or it was revoked already."""
    cur = conn.execute(
        "UPDATE al_api_tokens SET revoked_at = now() WHERE token_id = %s AND revoked_at IS NULL",
        (token_id,),
    )
    return cur.rowcount == 1


def _row(row: Sequence[Any]) -> dict[str, Any]:
    token_id, fleets, admin, created, expires, revoked = row
    return {
        "token_id": str(token_id),
        "fleets": list(fleets),
        "admin": bool(admin),
        "created_at": created,
        "expires_at": expires,
        "revoked_at": revoked,
    }
