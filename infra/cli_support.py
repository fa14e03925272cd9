"""What every part of the ``agentledger`` command line shares: its consoles, the settings and
the checks of common options (no layer's logic: the commands live in ``streams.cli``,
``consumers.cli`` and the composition root ``infra.main``)."""

from __future__ import annotations

import re

import typer
from rich.console import Console

from infra.settings import Settings, load_settings
from schemas.models import FLEET_ID_PATTERN, FLEET_ID_RULE

console = Console(stderr=False)
err = Console(stderr=True, soft_wrap=True)  # one line per message, however long


def settings() -> Settings:
    return load_settings()


def fleet_option(values: list[str] | None) -> list[str] | None:
    """--fleet values, each checked against the fleet id rules before anything connects."""
    for value in values or []:
        if not re.fullmatch(FLEET_ID_PATTERN, value):
            raise typer.BadParameter(
                f"{value!r} is not valid: {FLEET_ID_RULE}", param_hint="--fleet"
            )
    return values


def merge(app: typer.Typer, part: typer.Typer) -> None:
    """Add ``part``'s commands and command groups to ``app`` at its top level."""
    app.registered_commands += part.registered_commands
    app.registered_groups += part.registered_groups
