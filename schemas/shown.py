"""Characters of the ledger's text that no output may let act: how every output (the web pages,
live.js, the command line) shows them instead.

Unicode's bidirectional controls (the Arabic letter mark, the left-to-right and right-to-left
marks, embeddings, overrides and isolates: U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069)
make what follows display reversed or moved in any output (`exe.txt` shown as `txt.exe`); a
terminal also obeys control characters (``infra.cli_support.terminal_safe``). Each is shown as a
visible marker. live.js repeats the bidi set.
"""

from __future__ import annotations

import re

BIDI_CODES = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))


def shown_char(code: int) -> str:
    """The visible marker of such a character: ``[U+202E]``, or ``\\x1b`` for one of the first
    256."""
    return f"[U+{code:04X}]" if code > 0xFF else f"\\x{code:02x}"


_NEUTRAL = {code: shown_char(code) for code in BIDI_CODES}


def neutral_bidi(text: str) -> str:
    """``text`` with each bidi control (:data:`BIDI_CODES`) shown as its marker."""
    return text.translate(_NEUTRAL)


# The control characters no text argument may hold (C0 and DEL: PostgreSQL refuses a NUL, a
# newline forges a line), as a regex character class's contents: one rule for every check.
CONTROL_CLASS = r"\x00-\x1f\x7f"
CONTROL_RE = re.compile(f"[{CONTROL_CLASS}]")

# C0, DEL, C1 (NEL among them) and the Unicode line and paragraph separators: each breaks a line
_CONTROLS = {code: shown_char(code) for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)}


def asked(text: str, limit: int = 80) -> str:
    """What someone asked for, fit to be said back in one line of an error: each control
    character and bidi control shown as its marker (a NUL cannot go into PostgreSQL text, a
    line break would forge a log line, a bidi control reorder what is shown), cut to ``limit``
    characters with the length it had."""
    shown = neutral_bidi(text).translate(_CONTROLS)
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(text):,} characters)"
