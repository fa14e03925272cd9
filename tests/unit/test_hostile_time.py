"""Untrusted text that made a pure function take time faster than its length grows: each case
fixed at its cause, and held here by counted work (regex backtracking points, characters
scanned, calls), never by timing, with the old behaviour kept as the reference result."""

from __future__ import annotations

import random
import re

import pytest

from projectors import context_manifests
from projectors.context_manifests import _key_lines
from streams.importers import swe_agent
from streams.importers.swe_agent import _text_action
from tests.unit.regex_work import CountingSearch, backtracking_repeats, patterns_used

# --- the tool output's key lines (context_manifests) ---------------------------------------

# The regex _key_lines used before (its results are the reference).
_OLD_KEY_LINE = re.compile(
    r"^.*(?:Error|Exception|Traceback|FAILED|FAIL\b|Failed|failed|assert|panic|fatal|"
    r"error\b|expected .* got).*$",
    re.MULTILINE,
)


def _old_key_lines(text: str, keep: int = 3) -> tuple[str, ...]:
    found = [m.group(0).strip()[:300] for m in _OLD_KEY_LINE.finditer(text[-200_000:])]
    return tuple(dict.fromkeys(line for line in found if line))[-keep:]


def test_key_lines_run_no_backtracking_regex() -> None:
    # ^.*(…|expected .* got).*$ scanned the rest of a line again for each "expected " on it:
    # 200,000 characters of "expected expected …" took 3 s of a worker's fold, per entry.
    used = patterns_used(_key_lines)
    assert used, "no regex found: the test no longer sees what _key_lines runs"
    assert {name: backtracking_repeats(p) for name, p in used.items()} == dict.fromkeys(used, 0)


@pytest.mark.parametrize(
    "unit", ["expected ", "expected x got y Error ", "Error\n", "\n", "x FAIL", "expected\n"]
)
def test_key_lines_scan_each_character_a_bounded_number_of_times(
    unit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = CountingSearch(context_manifests._KEY_WORD)
    monkeypatch.setattr(context_manifests, "_KEY_WORD", counted)
    text = unit * (20_000 // len(unit))
    assert _key_lines(text) == _old_key_lines(text)
    assert counted.scanned <= len(text) + 1


def test_key_lines_give_what_the_old_regex_gave() -> None:
    rnd = random.Random(7)
    pieces = [
        *("Error", "error", "errors", "error_", "FAIL", "FAILED", "FAILé", "Traceback"),
        *("expected ", " got", "got", "assert", "panic", "\n", "\r", "\t", " ", "x", "é"),
    ]
    for _ in range(20_000):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 16)))
        for keep in (1, 3, 10):
            assert _key_lines(text, keep) == _old_key_lines(text, keep), repr(text)
    long = ("x" * 400 + " Error\n") * 600 + "expected 10 got 9\n"
    assert _key_lines(long) == _old_key_lines(long)


# --- mini-swe-agent 1.x's bash block (importer) ---------------------------------------------

_OLD_BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)


class _Run:
    def __init__(self) -> None:
        self.commands: list[str] = []

    def request(self, *args: object) -> None:
        arguments = args[-1]
        assert isinstance(arguments, dict)
        self.commands.append(arguments["command"])


def _command(text: str) -> str | None:
    run = _Run()
    call_id = _text_action(run, text, None, 1)  # type: ignore[arg-type]
    return run.commands[0] if call_id is not None else None


def test_bash_block_runs_no_backtracking_regex() -> None:
    # r"```bash\s*\n(.*?)\n```" retried its lazy body from every unclosed fence, and from every
    # newline after one: 100,000 characters of "```bash\nx " took 11 s to import, a fence
    # then 50,000 newlines 13 s.
    used = patterns_used(_text_action)
    assert {name: backtracking_repeats(p) for name, p in used.items()} == dict.fromkeys(used, 0)
    assert "_BASH_BLOCK" not in vars(swe_agent)


def test_bash_block_gives_what_the_old_regex_gave() -> None:
    rnd = random.Random(11)
    pieces = ["```bash", "```", "\n", " ", "\t", "x", "bash", "`", "\n```", "\u2028", "\x0b"]
    for _ in range(50_000):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 12)))
        old = _OLD_BASH_BLOCK.search(text)
        assert _command(text) == (old[1] if old else None), repr(text)
    assert _command("think\n```bash\nls -la\n```\n") == "ls -la"
    assert _command("```bash\n\n```") == ""  # the whitespace's last newline opens the close
    assert _command("```bash\nx " * 1000) is None
