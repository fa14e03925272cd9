"""Allowlists that look at the whole line: each line made and searched once, whatever the
number of matches it holds (a hostile tool output of one long line must cost linear time)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import re2

from schemas.secret_scan import (
    EXTRA_RULES,
    GITLEAKS_RULES,
    Allowlist,
    Rule,
    SecretDetector,
)
from tests.unit.secret_support import work_doubling


class CountingRegex:
    """A compiled regex that counts the characters it was asked to search."""

    def __init__(self, regex: Any, counter: list[int]) -> None:
        self.regex = regex
        self.counter = counter
        self.pattern = regex.pattern
        self.groups = regex.groups

    def search(self, text: str, *args: Any) -> Any:
        self.counter[0] += len(text)
        return self.regex.search(text, *args)


def counting_detector() -> tuple[SecretDetector, list[int]]:
    """The shipped rules, every allowlist's regex counting what it searches."""
    counter = [0]
    shipped = SecretDetector.from_files(GITLEAKS_RULES, EXTRA_RULES)

    def counted(a: Allowlist) -> Allowlist:
        return a if a.regex is None else replace(a, regex=CountingRegex(a.regex, counter))

    rules = [replace(r, allowlists=tuple(map(counted, r.allowlists))) for r in shipped.rules]
    return SecretDetector(rules, [counted(a) for a in shipped.allowlists]), counter


def test_a_long_line_of_matches_is_searched_linearly() -> None:
    detector, searched = counting_detector()
    unit = "name: DB_PASSWORD value: Qm7vX9pL2rT8wZ4k "
    _copies, counts = work_doubling(detector, unit, 50_000, lambda: searched[0])
    # The allowlists search each copy a fixed number of times, and the line once per line
    # allowlist; searched again for every match (before), doubling the line quadrupled it.
    assert counts[1] <= 2 * counts[0] + 1_000, counts


def _line_allowlist(pattern: str) -> Allowlist:
    """An allowlist that allows a match whose line ``pattern`` finds something in."""
    return Allowlist(
        regex=re2.compile(pattern), stopwords=(), target="line", all_of=False, has_paths=False
    )


def _rule(allowlist: Allowlist) -> Rule:
    return Rule(
        id="test-key",
        regex=re2.compile(r"key=([A-Za-z0-9]{12,})"),
        keywords=("key=",),
        entropy=0.0,
        secret_group=1,
        allowlists=(allowlist,),
    )


def test_a_line_allowlist_still_sees_the_whole_line_of_each_match() -> None:
    allow = _line_allowlist(r"EXAMPLE ONLY")
    detector = SecretDetector([_rule(allow)])
    text = (
        "key=AAAAbbbbCCCC1 key=AAAAbbbbCCCC2 EXAMPLE ONLY\n"  # allowed: the line says so
        "key=DDDDeeeeFFFF3 key=DDDDeeeeFFFF4\n"  # found: nothing on this line allows it
        "EXAMPLE ONLY key=GGGGhhhhIIII5"  # allowed: the last line, no newline after it
    )
    found = [text[f.start : f.end] for f in detector.find(text)]
    assert found == ["DDDDeeeeFFFF3", "DDDDeeeeFFFF4"]


def test_a_match_across_lines_is_judged_by_every_line_it_spans() -> None:
    allow = _line_allowlist(r"^first")
    rule = replace(_rule(allow), regex=re2.compile(r"key=\n([A-Za-z0-9]{12,})"))
    detector = SecretDetector([rule])
    text = "first key=\nAAAAbbbbCCCC1\nsecond key=\nDDDDeeeeFFFF2\n"
    found = [text[f.start : f.end] for f in detector.find(text)]
    # the first match's lines begin with "first"; the second's with "second"
    assert found == ["DDDDeeeeFFFF2"]
