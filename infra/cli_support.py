"""What every part of the ``agentledger`` command line shares: its consoles, the settings and
the checks of common options (no layer's logic: the commands live in ``streams.cli``,
``consumers.cli`` and the composition root ``infra.main``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import rich.table
import typer
from rich.console import Console
from rich.segment import Segment, Segments
from rich.style import Style

from infra.settings import Settings, load_settings
from schemas.models import FLEET_ID_PATTERN, FLEET_ID_RULE
from schemas.shown import BIDI_CODES, shown_char

# Characters of untrusted text a terminal would obey instead of showing: C0 controls but tab
# and newline (ESC begins colour, cursor, clear-screen and OSC 8 link sequences; CR and BS
# overwrite what was shown), DEL, C1 controls, and Unicode's bidirectional controls (the pages'
# set, schemas.shown.BIDI_CODES). Each is shown as its visible marker.
_UNSAFE = [
    *(c for c in range(0x20) if c not in (0x09, 0x0A)),
    *range(0x7F, 0xA0),
    *BIDI_CODES,
]
_SAFE = {c: shown_char(c) for c in _UNSAFE}


def terminal_safe(text: str) -> str:
    """``text`` with what a terminal would obey (:data:`_UNSAFE`) shown as escapes instead."""
    return text.translate(_SAFE)


class SafeConsole(Console):
    """A console whose text a terminal shows and never obeys: every text segment (a table
    cell, a line, a section of untrusted text) passes :func:`terminal_safe` before its style
    is applied, so the console's own colours stay (found trying the product: `memory` and
    `context --render` printed a tool output's colour codes, clear-screen, OSC 8 links, bells
    and right-to-left overrides to the terminal).

    Nor is untrusted text coloured by guesswork: rich's repr highlighter (numbers, strings,
    calls, URLs in whatever is printed) is off unless asked for. Its regexes backtrack on long
    words (``[\\w.]*?\\(`` from every letter of a word with no parenthesis): `memory` printing a
    task goal of one 20,000-character word (a base64 blob) took 3.1 s, and printing one word of
    50,000 characters 30 s. The console's own markup styles stay."""

    def __init__(self, *args: Any, **options: Any) -> None:
        options.setdefault("highlight", False)
        super().__init__(*args, **options)

    def print(self, *objects: Any, **options: Any) -> None:
        """Text made terminal-safe before rich reads it (rich drops BEL, BS, CR and the like
        unsaid; they are shown as escapes as every other control is)."""
        super().print(*(terminal_safe(o) if isinstance(o, str) else o for o in objects), **options)

    def _render_buffer(self, buffer: Any) -> str:
        return super()._render_buffer(
            Segment(text, style, control)
            if control
            else Segment(terminal_safe(text), _shown_style(style), control)
            for text, style, control in buffer
        )


_VISIBLE = Style(conceal=False)


def _shown_style(style: Style | None) -> Style | None:
    """``style`` without what would hide text or where it leads: the command line makes no
    hyperlinks and conceals nothing, so a link or concealment came from markup in untrusted
    text (a table cell holding ``[link=https://...]here[/link]`` became a terminal hyperlink)."""
    if style is None or (style.link is None and not style.conceal):
        return style
    return style.update_link(None) + _VISIBLE


console = SafeConsole(stderr=False)
err = SafeConsole(stderr=True, soft_wrap=True)  # one line per message, however long


# Tables are laid out this wide at least, whatever the terminal's width (see print_table).
WIDE_TABLE = 400


class Table(rich.table.Table):
    """Every table of the command line. A cell too wide for its column folds onto the next line
    instead of being cut with an ellipsis (only a table wider than ``WIDE_TABLE``: print_table
    lays the others out whole)."""

    def add_column(self, header: Any = "", footer: Any = "", **options: Any) -> None:
        options.setdefault("overflow", "fold")
        super().add_column(header, footer, **options)

    def add_row(self, *renderables: Any, **options: Any) -> None:
        """A row, its text cells made terminal-safe before the table is laid out (the console
        does it again as it writes, after layout: escapes made then widen a row past its
        column)."""
        super().add_row(
            *(terminal_safe(r) if isinstance(r, str) else r for r in renderables), **options
        )


def print_table(table: rich.table.Table, out: Console | None = None) -> None:
    """A table at its own width (up to ``WIDE_TABLE``), not the terminal's: rich fits a table
    to the console, cutting cells with an ellipsis and cropping the columns past its edge, and
    piped output is laid out at 80 columns. Measured on the demo's costs table at 80 columns:
    ``374.…`` for 374,206 tokens in, and no cost column at all. A narrow terminal now wraps the
    long lines; a file or a pipe gets them whole."""
    out = out or console
    options = out.options.update(width=max(out.width, WIDE_TABLE))
    for line in out.render_lines(table, options, pad=False):
        out.print(Segments([*line, Segment.line()]), soft_wrap=True, end="")


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


def bounded(value: Any, fmt: Callable[[Any], str], lower_bound: bool = False) -> str:
    """A figure as every output shows it (the one text rule of "unknown is never zero"):
    "unknown" when None, never 0; ``>= `` before a sum that leaves out what some of its calls
    did not report (a lower bound)."""
    if value is None:
        return "unknown"
    return (">= " if lower_bound else "") + fmt(value)


def check_fleets(
    asked: list[str],
    with_runs: Callable[[list[str]], set[str]],
    existing: Callable[[], list[str]],
    strict: bool = True,
) -> None:
    """The one rule of a command's ``--fleet``: each must exist, i.e. the live builds hold a run
    of it (``with_runs``, asked first) or it has a ledger topic (``existing``, Kafka's answer);
    an unknown one is an error naming the fleets there are (exit 1; found trying the product:
    `runs --fleet nosuchfleet` printed an empty table and exited 0, as for a fleet without
    runs). When Kafka cannot say, stderr says the check was not made and the command goes on.
    Not ``strict`` (a command that may name a fleet before its first run: a token, a
    subscription): a note on stderr instead of the error."""
    if not asked:
        return
    try:
        known = with_runs(asked)
    except Exception:  # (the command's own read says what is wrong with PostgreSQL)
        known = set()
    if all(f in known for f in asked):
        return
    try:
        there = existing()
    except Exception as exc:
        err.print(
            f"[yellow]note:[/] Kafka did not answer ({type(exc).__name__}): whether "
            f"{', '.join(asked)} exists was not checked"
        )
        return
    missing = [f for f in asked if f not in known and f not in there]
    if missing and not strict:
        err.print(
            f"[yellow]note:[/] no fleet {', '.join(missing)} yet (the fleets: "
            f"{', '.join(there) or 'none'})"
        )
    elif missing:
        err.print(
            f"[red]error:[/] no fleet {', '.join(missing)} "
            f"(the fleets: {', '.join(there) or 'none'})"
        )
        raise typer.Exit(code=1)
