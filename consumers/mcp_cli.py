"""``agentledger mcp`` (the MCP server over stdio) and ``agentledger mcp-audit`` (who read
which run through it); the composition root ``infra.main`` adds them to the command line."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer

from infra.cli_support import Table, err, print_table
from infra.cli_support import settings as _settings

commands = typer.Typer()


@commands.command("mcp")
def mcp() -> None:
    """Serve the ledger to an agent over MCP on stdin/stdout (read-only tools, resources and
    prompts), as the API token in AGENTLEDGER_TOKEN: only its fleets' runs."""
    import anyio

    from consumers.mcp_server import check_token, serve_stdio

    settings = _settings()
    token = os.environ.get("AGENTLEDGER_TOKEN")
    err.print(f"agentledger mcp: {check_token(settings, token)}; serving on stdio")
    anyio.run(serve_stdio, settings, token)


@commands.command("mcp-audit")
def mcp_audit(
    token_id: Annotated[str | None, typer.Option("--token", help="one token's id")] = None,
    run_id: Annotated[
        str | None, typer.Option("--run", help="the runs whose id is or starts with this")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Reads through `agentledger mcp`, counted per token, tool (or resource) and run: how many,
    how many refused, the applied sequence number of the last and the highest answer."""
    from consumers.mcp_ledger import audit

    rows = audit(_settings(), token_id, run_id)
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    table = Table("token id", "tool", "run", "reads", "refused", "last seq", "max seq", "last")
    for r in rows:
        table.add_row(
            r["token_id"],
            r["tool"],
            r["run_id"] or "-",
            str(r["reads"]),
            str(r["refused"]),
            "-" if r["last_seq"] is None else str(r["last_seq"]),
            "-" if r["max_seq"] is None else str(r["max_seq"]),
            str(r["last_at"]),
        )
    print_table(table)
