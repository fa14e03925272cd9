"""``agentledger tokens create|list|revoke``: the API tokens of ``agentledger serve`` (the
composition root ``infra.main`` adds them, and ``serve``, to the command line)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from infra.cli_support import Table, console, err, fleet_option, print_table
from infra.cli_support import settings as _settings

commands = typer.Typer()
tokens_app = typer.Typer(no_args_is_help=True, help="API tokens of `agentledger serve`.")
commands.add_typer(tokens_app, name="tokens")


@tokens_app.command("create")
def tokens_create(
    fleet: Annotated[
        list[str],
        typer.Option(
            "--fleet", help="a fleet the token may read (repeatable)", callback=fleet_option
        ),
    ],
    admin: Annotated[bool, typer.Option("--admin", help="an administrator's token")] = False,
    expires: Annotated[
        str | None, typer.Option("--expires", help="expires after: 30d, 12h or 45m (none: never)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Make a token for the fleets; it is printed once and kept only as its hash."""
    from consumers.access import create_token, parse_expiry
    from consumers.cli import fleets_exist

    expiry = parse_expiry(expires) if expires else None  # (arguments before any connection)
    fleets_exist(_settings(), fleet, strict=False)  # (a token may come before its fleet's run)
    made = create_token(_settings(), fleet, admin, expiry)
    if as_json:
        print(json.dumps(made))
        return
    console.print(made["token"], soft_wrap=True)
    err.print(
        f"token {made['token_id']} for {', '.join(made['fleets'])}"
        + (" (admin)" if admin else "")
        + (f", expires {made['expires_at']}" if made["expires_at"] else "")
        + "; shown once: only its hash is kept"
    )


@tokens_app.command("list")
def tokens_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every token: id, fleets, admin or not, created, expires, revoked (never the token)."""
    from consumers.access import list_tokens

    rows = list_tokens(_settings())
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    table = Table("token id", "fleets", "admin", "created", "expires", "revoked")
    for r in rows:
        table.add_row(
            r["token_id"],
            ", ".join(r["fleets"]),
            "yes" if r["admin"] else "no",
            str(r["created_at"]),
            str(r["expires_at"] or "never"),
            str(r["revoked_at"] or "-"),
        )
    print_table(table)


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="the id `tokens list` shows")],
) -> None:
    """Revoke a token: from now on it opens nothing."""
    from consumers.access import revoke_token

    if not revoke_token(_settings(), token_id):
        err.print(f"[red]error:[/] no token {token_id} that is not revoked already")
        raise typer.Exit(code=1)
    err.print(f"token {token_id} revoked")
