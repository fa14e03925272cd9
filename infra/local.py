"""``infra up|down|status``: the local stack as one unit."""

from __future__ import annotations

from rich.console import Console

from infra.services import ServiceStatus, all_services, purge_state
from infra.settings import Settings


def up(settings: Settings, console: Console) -> list[ServiceStatus]:
    """Start what is not running (idempotent) and say what runs."""
    services = all_services(settings, console)
    for service in services:
        console.print(service.up())
    return [s.status() for s in services]


def down(settings: Settings, console: Console, purge: bool = False) -> None:
    """Stop our services (SIGTERM, SIGKILL after a timeout); keep data unless ``purge``."""
    services = all_services(settings, console)
    for service in reversed(services):
        console.print(service.down())
    if purge:
        purge_state(settings, services)
        console.print(f"purged service data under {settings.state_dir}")


def status(settings: Settings, console: Console) -> list[ServiceStatus]:
    return [s.status() for s in all_services(settings, console)]
