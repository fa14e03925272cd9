"""What the tests of hostile-time inputs share: how much a regex may backtrack, counted from its
pattern rather than timed.

Python's ``re`` is a backtracking engine: a search tries every start, and from each start an
unbounded repeat (``*``, ``+``, ``{n,}``) followed by more pattern is retried at every length
when what follows fails. ``^.*(?:…|expected .* got).*$`` on a long line of "expected " scans the
rest of the line again for each one: quadratic. A pattern with no such repeat scans a bounded
stretch from each start, so a search costs at most the text's length times the pattern's size.
"""

from __future__ import annotations

import importlib
import re
import types
from collections.abc import Callable
from typing import Any

# re's own parser (Python 3.11+; typeshed has no stubs for it)
sre_parse: Any = importlib.import_module("re._parser")
sre_constants: Any = importlib.import_module("re._constants")

_REPEATS = {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT}


def backtracking_repeats(pattern: re.Pattern[str] | re.Pattern[bytes]) -> int:
    """The unbounded repeats of ``pattern`` that a failure after them retries: those with more
    pattern after them (in their group or an enclosing one) or inside another unbounded repeat.
    A lone trailing repeat (``\\s*`` alone) backtracks nowhere and is not counted."""
    parsed = sre_parse.parse(pattern.pattern, pattern.flags)
    return _count(list(parsed), followed=False, repeated=False)


def _count(items: list[Any], followed: bool, repeated: bool) -> int:
    total = 0
    for i, (op, av) in enumerate(items):
        after = followed or i < len(items) - 1
        if op in _REPEATS:
            _low, high, sub = av
            unbounded = high == sre_constants.MAXREPEAT
            if unbounded and (after or repeated):
                total += 1
            total += _count(list(sub), after, repeated or unbounded)
        elif op is sre_constants.SUBPATTERN:
            total += _count(list(av[-1]), after, repeated)
        elif op is sre_constants.BRANCH:
            total += sum(_count(list(branch), after, repeated) for branch in av[1])
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            total += _count(list(av[1]), after, repeated)
    return total


def patterns_used(function: Callable[..., Any]) -> dict[str, re.Pattern[Any]]:
    """The compiled regexes ``function`` names, and those named by the functions of its own
    module that it names, transitively (module globals, by name)."""
    module = function.__globals__
    seen: set[str] = set()
    found: dict[str, re.Pattern[Any]] = {}
    todo = [function]
    while todo:
        code = todo.pop().__code__
        names = list(code.co_names)
        names += [n for c in code.co_consts if isinstance(c, types.CodeType) for n in c.co_names]
        for name in names:
            if name in seen or name not in module:
                continue
            seen.add(name)
            value = module[name]
            if isinstance(value, re.Pattern):
                found[name] = value
            elif isinstance(value, types.FunctionType) and value.__module__ == function.__module__:
                todo.append(value)
    return found


class CountingSearch:
    """A compiled regex whose ``search`` counts the characters it went through: from the start
    position to the end of the match (or of the text when there is none)."""

    def __init__(self, regex: re.Pattern[str]) -> None:
        self.regex = regex
        self.pattern = regex.pattern
        self.flags = regex.flags
        self.scanned = 0

    def search(self, text: str, pos: int = 0, endpos: int | None = None) -> Any:
        end = len(text) if endpos is None else endpos
        m = self.regex.search(text, pos, end)
        self.scanned += (m.end() if m is not None else end) - pos
        return m
