"""``agentledger``: the product's single entry point."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from infra import local
from infra.errors import InfraError
from infra.services import ServiceStatus
from infra.settings import Settings, load_settings

app = typer.Typer(
    no_args_is_help=True, help="AgentLedger: the event-sourced ledger for agent fleets."
)
infra_app = typer.Typer(no_args_is_help=True, help="Local Kafka, PostgreSQL and Redis.")
app.add_typer(infra_app, name="infra")

console = Console(stderr=False)
err = Console(stderr=True)


def _settings() -> Settings:
    return load_settings()


def _print_status(rows: list[ServiceStatus], as_json: bool) -> None:
    if as_json:
        print(json.dumps({r.name: r.as_dict() for r in rows}, indent=2))
        return
    table = Table("service", "state", "address", "pid", "managed")
    for r in rows:
        state = "[green]running[/]" if r.running else "[red]stopped[/]"
        table.add_row(
            r.name, state, r.address, str(r.pid or "-"), "local" if r.managed else "external"
        )
    console.print(table)


@infra_app.command("up")
def infra_up() -> None:
    """Start local Kafka, PostgreSQL and Redis (idempotent; external ones are left alone)."""
    rows = local.up(_settings(), console)
    _print_status(rows, as_json=False)


@infra_app.command("down")
def infra_down(
    purge: Annotated[bool, typer.Option("--purge", help="also delete their data")] = False,
) -> None:
    """Stop the local services cleanly; data is kept unless --purge."""
    local.down(_settings(), console, purge=purge)


@infra_app.command("status")
def infra_status(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Say what runs where."""
    _print_status(local.status(_settings(), console), as_json)


@app.command("demo")
def demo() -> None:
    """Bring the stack up and run the demo pipeline end to end."""
    from consumers.demo import run_demo

    run_demo(_settings(), console)


def main() -> None:
    try:
        app()
    except InfraError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise SystemExit(1) from None
