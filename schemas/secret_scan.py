"""Secret detection with the gitleaks rule set, matched by RE2.

The rules are gitleaks' own default configuration (``data/gitleaks-v8.30.1.toml``, MIT, see
``data/gitleaks-LICENSE``): 220 provider rules, each with keywords that pre-filter the text, a
regex, an entropy floor and allowlists, maintained by people who study leaked credentials for a
living. They are applied with gitleaks' semantics (keyword pre-filter, secret group, entropy,
global and per-rule allowlists with their targets and conditions). Gitleaks is written in Go, so
its regexes are RE2 syntax; ``google-re2`` runs them unchanged and in linear time, so no input can
make the publisher backtrack for minutes. ``data/agentledger-rules.toml`` adds the few rules, in
the same format, for formats the default set misses (each says why).

Deliberate differences from the gitleaks CLI: the ``gitleaks:allow`` comment is not honoured (an
agent's tool output is not reviewed source, and the comment would be a bypass); rules bound to a
file path apply only when the caller names a path that matches.
"""

from __future__ import annotations

import bisect
import math
import re
import tomllib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import re2

DATA = Path(__file__).parent / "data"
GITLEAKS_RULES = DATA / "gitleaks-v8.30.1.toml"
EXTRA_RULES = DATA / "agentledger-rules.toml"
MARKER_PREFIX = "[REDACTED:"


_SURROGATE = re.compile("[\ud800-\udfff]")


def marker(rule: str) -> str:
    """What a redacted secret becomes: ``[REDACTED:<rule id>]``."""
    return f"{MARKER_PREFIX}{rule}]"


@dataclass(frozen=True)
class Allowlist:
    """A gitleaks allowlist: the finding is allowed when its target matches (OR, or AND)."""

    regex: Any | None  # one compiled RE2 alternation of the allowlist's regexes
    stopwords: tuple[str, ...]
    target: str  # "secret", "match" or "line"
    all_of: bool  # condition = "AND"
    has_paths: bool

    def allows(self, secret: str, match: str, line: _Line) -> bool:
        if self.regex is None:
            by_regex = False
        elif self.target == "line":
            by_regex = line.searched(self.regex)
        else:
            target = match if self.target == "match" else secret
            by_regex = self.regex.search(target) is not None
        lowered = secret.lower()
        by_word = any(word in lowered for word in self.stopwords)
        if not self.all_of:
            return by_regex or by_word
        checks = []
        if self.has_paths:
            checks.append(False)  # we scan text, never a file path
        if self.regex is not None:
            checks.append(by_regex)
        if self.stopwords:
            checks.append(by_word)
        return bool(checks) and all(checks)


@dataclass(frozen=True)
class Rule:
    """One detection rule: what to look for, and what makes a hit a secret."""

    id: str
    regex: Any
    keywords: tuple[str, ...]
    entropy: float
    secret_group: int
    allowlists: tuple[Allowlist, ...]
    path: Any | None = None


@dataclass(frozen=True)
class Finding:
    """A secret's span in the scanned text and the rule that found it. Never the value."""

    rule: str
    start: int
    end: int


@lru_cache(maxsize=1 << 16)  # the same tokens (ids, hashes) come back in entry after entry
def shannon_entropy(value: str) -> float:
    if not value:
        return 0.0
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


SHORT_TEXT = 256  # texts up to this long have their findings kept (SecretDetector._short)

# How far past a secret's end the next adjacent token is looked for (see SecretDetector._matches).
_NEXT_WINDOW = 4096

_OPTIONS = re2.Options()
_OPTIONS.max_mem = 64 << 20  # the big alternations (generic-api-key's allowlist) need room


def _compile(pattern: str) -> Any:
    return re2.compile(pattern, options=_OPTIONS)


def _alternation(patterns: Sequence[str]) -> Any | None:
    if not patterns:
        return None
    return _compile("|".join(f"(?:{p})" for p in patterns))


def _allowlist(doc: dict[str, Any]) -> Allowlist:
    return Allowlist(
        regex=_alternation(doc.get("regexes", ())),
        stopwords=tuple(w.lower() for w in doc.get("stopwords", ())),
        target=doc.get("regexTarget", "secret"),
        all_of=doc.get("condition", "OR").upper() == "AND",
        has_paths=bool(doc.get("paths")),
    )


# any {{...}}: a misspelt name ({{Credential_name}}, {{credential name}}) is refused too, not
# left in the regex as literal braces that match nothing (neither file has {{ otherwise)
_NAME_USE = re.compile(r"\{\{([^{}]*)\}\}")


def _named(regex: str, names: Mapping[str, str], where: str) -> str:
    """``regex`` with each ``{{name}}`` replaced by that entry of the file's ``[names]`` (one
    pattern several rules share, written once); a name the file does not give is an error."""

    def one(use: re.Match[str]) -> str:
        if use.group(1) not in names:
            raise ValueError(f"{where}: no [names] entry {use.group(1)!r}")
        return names[use.group(1)]

    return _NAME_USE.sub(one, regex)


def _rules(path: Path) -> tuple[list[Rule], list[Allowlist]]:
    config = tomllib.loads(path.read_text(encoding="utf-8"))
    names: dict[str, str] = dict(config.get("names", {}))
    for doc in config.get("rules", ()):
        if "regex" in doc:
            doc["regex"] = _named(doc["regex"], names, f"{path.name}: rule {doc['id']}")
    # gitleaks' top-level [[allowlists]] with targetRules: one allowlist several rules share
    # (written once, not copied into each); without targetRules, one for every rule
    tops = config.get("allowlists", ())
    shared = [(set(a["targetRules"]), _allowlist(a)) for a in tops if "targetRules" in a]
    everywhere = [_allowlist(a) for a in tops if "targetRules" not in a]
    unknown = {r for ids, _ in shared for r in ids} - {d["id"] for d in config.get("rules", ())}
    if unknown:
        raise ValueError(f"{path.name}: allowlists name rules it does not have: {sorted(unknown)}")
    rules = [
        Rule(
            id=doc["id"],
            regex=_compile(doc["regex"]),
            keywords=tuple(k.lower() for k in doc.get("keywords", ())),
            entropy=float(doc.get("entropy", 0.0)),
            secret_group=int(doc.get("secretGroup", 0)),
            allowlists=(
                *(_allowlist(a) for a in doc.get("allowlists", ())),
                *(allowed for ids, allowed in shared if doc["id"] in ids),
            ),
            path=_compile(doc["path"]) if "path" in doc else None,
        )
        for doc in config.get("rules", ())
        if "regex" in doc  # path-only rules (a .p12 file exists) have nothing to match in text
    ]
    found = config.get("allowlist")
    return rules, [*([_allowlist(found)] if found else []), *everywhere]


class SecretDetector:
    """Finds secrets in text. Build once (compiling ~270 regexes takes a moment); thread-safe."""

    def __init__(self, rules: Sequence[Rule], allowlists: Sequence[Allowlist] = ()) -> None:
        self.rules = tuple(rules)
        self.allowlists = tuple(allowlists)
        # gitleaks finds the keywords present with Aho-Corasick; an RE2 set does the same here:
        # one pass says which keywords occur anywhere (overlaps included), hence which rules.
        keywords = sorted({k for r in self.rules for k in r.keywords})
        options = re2.Options()
        options.case_sensitive = False
        self._keyword_set = re2.Set.SearchSet(options)
        for keyword in keywords:
            self._keyword_set.Add(re2.escape(keyword))
        self._keyword_set.Compile()
        index = {k: i for i, k in enumerate(keywords)}
        self._rules_of: list[list[int]] = [[] for _ in keywords]
        for at, rule in enumerate(self.rules):
            for k in rule.keywords:
                self._rules_of[index[k]].append(at)
        self._always = [at for at, r in enumerate(self.rules) if not r.keywords]
        # The keyword-less rules would each scan every text; one RE2 set of their regexes says
        # in a single pass which of them match anywhere, so only those run (a rule that matches
        # nowhere finds nothing: the answer is the same). The set's first pattern is empty and
        # matches every text: should RE2's DFA give up on a text (out of memory, reported as no
        # match at all), its absence says so and every keyword-less rule runs, as before.
        self._always_set = re2.Set.SearchSet(_OPTIONS)
        self._always_set.Add("")
        for at in self._always:
            self._always_set.Add(self.rules[at].regex.pattern)
        self._always_set.Compile()
        # Short texts (ids, names, paths, short fields) come back in entry after entry (a run's
        # id in each of its entries): their findings, a pure function of the text, are kept.
        self._short = lru_cache(maxsize=1 << 14)(self._find_kept)

    @classmethod
    def from_files(cls, *paths: Path) -> SecretDetector:
        rules: list[Rule] = []
        allowlists: list[Allowlist] = []
        for path in paths:
            more, allowed = _rules(path)
            rules.extend(more)
            allowlists.extend(allowed)
        return cls(rules, allowlists)

    def candidates(self, text: str) -> list[Rule]:
        """The rules whose keywords occur in ``text`` (in rule order), plus keyword-less ones."""
        chosen = set(self._always_matching(text))
        for keyword in self._keyword_set.Match(text) or ():  # None when nothing matched
            chosen.update(self._rules_of[keyword])
        return [self.rules[at] for at in sorted(chosen)]

    def _always_matching(self, text: str) -> list[int]:
        """The keyword-less rules whose regex matches somewhere in ``text`` (all of them when
        the set's matcher gave up)."""
        hits = self._always_set.Match(text)
        if not hits or 0 not in hits:
            return self._always
        return [self._always[i - 1] for i in hits if i]

    def find(self, text: str, path: str | None = None) -> list[Finding]:
        """Every secret in ``text``, as non-overlapping spans in text order."""
        if len(text) < 8:
            return []
        if path is None and len(text) <= SHORT_TEXT:
            return list(self._short(text))
        return self._find_any(text, path)

    def _find_kept(self, text: str) -> tuple[Finding, ...]:
        return tuple(self._find_any(text, None))

    def _find_any(self, text: str, path: str | None) -> list[Finding]:
        try:
            return self._find(text, path)
        except UnicodeEncodeError:  # lone surrogates: RE2 takes UTF-8; one U+FFFD each keeps
            return self._find(_SURROGATE.sub("\ufffd", text), path)  # the offsets

    def _find(self, text: str, path: str | None) -> list[Finding]:
        found: list[Finding] = []
        lines = _Lines(text)
        for rule in self.candidates(text):
            if rule.path is not None and (path is None or not rule.path.search(path)):
                continue
            found.extend(self._matches(rule, text, lines))
        return merge(found)

    def _matches(self, rule: Rule, text: str, lines: _Lines) -> list[Finding]:
        out: list[Finding] = []
        taken: set[int] = set()  # where a match of this rule was taken: its chain is known
        for m in rule.regex.finditer(text):
            if m.start(0) in taken:
                continue  # (a link of a chain walked below: each match is taken once)
            taken.add(m.start(0))
            end = self._take(rule, m, text, lines, out)
            # A rule's trailing boundary character (the newline after a token) is the leading
            # boundary of the next token, which finditer has consumed: two keys on adjacent
            # lines would hide the second. Match again where the secret ends, on a slice (a
            # search with a position re-encodes the whole text for RE2 on every call). A chain
            # reaching a start already taken stops: from there on it was walked, and walking it
            # again from every finditer match made a text of k chained tokens cost k² (100,000
            # characters of `-u user -p pw` took 187 s; found by a review).
            offset = 0
            while m.end(0) + offset > end and end not in taken:
                offset = end
                m = rule.regex.search(text[end : end + _NEXT_WINDOW])
                if m is None or m.start(0) != 0:
                    break
                taken.add(end)
                end = self._take(rule, m, text, lines, out, offset)
                if end <= offset:  # no progress (an empty secret): stop
                    break
        return out

    def _take(
        self, rule: Rule, m: Any, text: str, lines: _Lines, out: list[Finding], offset: int = 0
    ) -> int:
        """Record ``m``'s secret in ``out`` unless entropy or an allowlist says no; the secret's
        end either way (``m`` matched ``text`` from ``offset`` on)."""
        whole = str(m.group(0))
        start, end = m.span(0)
        group = rule.secret_group or next(
            (i for i in range(1, rule.regex.groups + 1) if m.group(i)), 0
        )
        if group and m.group(group):
            start, end = m.span(group)
        start, end = int(start) + offset, int(end) + offset
        secret = text[start:end].strip("\n")
        if not secret or secret.startswith(MARKER_PREFIX):
            return end
        if rule.entropy and shannon_entropy(secret) <= rule.entropy:
            return end
        line = lines.of(m.start(0) + offset, m.end(0) + offset)
        if any(a.allows(secret, whole, line) for a in self.allowlists):
            return end
        if any(a.allows(secret, whole, line) for a in rule.allowlists):
            return end
        out.append(Finding(rule.id, start, end))
        return end

    def redact(self, text: str, path: str | None = None) -> tuple[str, list[str]]:
        """``text`` with every secret replaced by its marker, and the rule ids, in order."""
        findings = self.find(text, path)
        if not findings:
            return text, []
        pieces = []
        at = 0
        for f in findings:
            pieces.append(text[at : f.start])
            pieces.append(marker(f.rule))
            at = f.end
        pieces.append(text[at:])
        return "".join(pieces), [f.rule for f in findings]


class _Lines:
    """The lines of one scanned text, as allowlists of target ``line`` see them: the line(s) a
    match spans, each made and searched by each allowlist once however many matches it holds.
    Made and searched again for every match, a long line of k matches cost k times its length
    (200,000 characters of `name: DB_PASSWORD value: …` took 3.3 s, twice that 11 s)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._breaks: list[int] | None = None  # the newlines' offsets, found once when needed
        self._made: dict[tuple[int, int], _Line] = {}

    def of(self, start: int, end: int) -> _Line:
        """From the start of the line holding ``start`` to the end of the one holding ``end``."""
        if self._breaks is None:
            self._breaks = [m.start() for m in _NEWLINE.finditer(self.text)]
        breaks = self._breaks
        before = bisect.bisect_left(breaks, start) - 1  # the last newline before start
        after = bisect.bisect_left(breaks, end)  # the first at or after end
        span = (
            breaks[before] + 1 if before >= 0 else 0,
            breaks[after] if after < len(breaks) else len(self.text),
        )
        line = self._made.get(span)
        if line is None:
            line = self._made[span] = _Line(self.text, *span)
        return line


class _Line:
    """One line of :class:`_Lines`: its text made on first use, each regex's verdict kept."""

    __slots__ = ("_found", "_span", "_text")

    def __init__(self, text: str, start: int, end: int) -> None:
        self._text: str | None = None
        self._span = (text, start, end)
        self._found: dict[Any, bool] = {}  # by the regex itself (RE2 patterns hash)

    @property
    def text(self) -> str:
        if self._text is None:
            whole, start, end = self._span
            self._text = whole[start:end]
        return self._text

    def searched(self, regex: Any) -> bool:
        """Whether ``regex`` finds anything in the line (asked once per regex)."""
        found = self._found.get(regex)
        if found is None:
            found = self._found[regex] = regex.search(self.text) is not None
        return found


_NEWLINE = re.compile("\n")


GENERIC = frozenset({"generic-api-key"})


def merge(findings: list[Finding]) -> list[Finding]:
    """Overlapping spans become one, named by the first specific rule among them; in order."""
    out: list[Finding] = []
    for f in sorted(findings, key=lambda f: (f.start, -f.end)):
        if out and f.start < out[-1].end:
            last = out[-1]
            name = f.rule if last.rule in GENERIC and f.rule not in GENERIC else last.rule
            out[-1] = Finding(name, last.start, max(last.end, f.end))
        else:
            out.append(f)
    return out


@cache
def default_detector() -> SecretDetector:
    """The shipped rule set: gitleaks' defaults plus ours, compiled once per process."""
    return SecretDetector.from_files(GITLEAKS_RULES, EXTRA_RULES)
