"""What the command line prints of untrusted text is shown, never obeyed by the terminal."""

from __future__ import annotations

import io
import re

from consumers.render import print_memory
from infra.cli_support import SafeConsole, Table, print_table, terminal_safe

HOSTILE = (
    "red \x1b[31mtext\x1b[0m, clear \x1b[2J\x1b[H, link \x1b]8;;https://evil.example\x07here"
    "\x1b]8;;\x07, bell \x07, over\rwrite, back\x08space, \u202eReversed\u202c, \u2066iso\u2069"
    ", C1 \x9b2J, markup [link=https://evil.example]click[/link] [bold red]loud[/]"
    " [conceal]hidden[/]"
)
OBEYED = ("\x1b", "\x07", "\r", "\x08", "\x9b", "\u202e", "\u202c", "\u2066", "\u2069")


def test_terminal_safe_shows_every_control_as_an_escape_and_keeps_the_rest() -> None:
    shown = terminal_safe(HOSTILE + "\ttab\nline é 日本 🙂")
    assert not any(c in shown for c in OBEYED)
    assert "\\x1b[31m" in shown and "[U+202E]Reversed" in shown and "over\\x0dwrite" in shown
    assert shown.endswith("\ttab\nline é 日本 🙂")


def _console(out: io.StringIO) -> SafeConsole:
    return SafeConsole(file=out, force_terminal=True, color_system="standard", width=200)


def test_memory_and_tables_print_hostile_text_as_escapes_keeping_their_own_colours() -> None:
    view = {
        "applied_seq": 3,
        "state": {
            "run_id": "run-1",
            "fleet_id": "f",
            "snapshot_version": 1,
            "task_goal": HOSTILE,
            "open_problems": [{"problem": HOSTILE, "evidence": "e-1"}],
        },
    }
    out = io.StringIO()
    console = _console(out)
    print_memory(console, view)
    table = Table("task")
    table.add_row(HOSTILE)
    print_table(table, console)
    text = out.getvalue()
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)  # the console's own colours
    assert not any(c in plain for c in OBEYED), repr(plain)
    assert plain.count("\\x1b[2J") == 3 and plain.count("[U+202E]") == 3
    # markup in the run's text is shown as written where the CLI escapes it (memory), and
    # never makes a hyperlink or hides text anywhere (a table cell takes markup)
    assert plain.count("[link=https://evil.example]click[/link]") == 2, plain
    assert "\x1b]8" not in text and "\x1b[8m" not in text
    assert "\x1b[1m" in text  # the console's own styles stay


def test_a_table_row_with_controls_keeps_its_columns_aligned() -> None:
    """The escapes are made before the table is laid out (made only as the console writes, a
    row with a control character came out wider than its column)."""
    out = io.StringIO()
    table = Table("a", "b")
    table.add_row("x\x1b[2J\u202ey", "z")
    table.add_row("plain", "w")
    print_table(table, SafeConsole(file=out, width=80))
    widths = {len(line) for line in out.getvalue().splitlines()}
    assert len(widths) == 1, out.getvalue()


def test_a_printed_line_shows_bell_backspace_and_carriage_return_as_escapes() -> None:
    """rich itself drops these (unsaid); the CLI shows them as it shows every control."""
    out = io.StringIO()
    SafeConsole(file=out, width=200).print("a\x07b\x08c\rd")
    assert out.getvalue() == "a\\x07b\\x08c\\x0dd\n"
