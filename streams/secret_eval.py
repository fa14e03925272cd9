"""How well redaction hides secrets it was not tuned on, and what it takes from real logs
(issue 27).

Three figures, each through the real publishing path (:func:`streams.redaction.redact_entry`):

- **in context**: each corpus example, as its scanner's authors wrote it (an ``.env`` line, a
  curl command, a config block), published once as a user message (a ``TextPart``) and once as
  a tool's output (a ``ToolResultPart``). A hit is an example whose secret value survives in
  *neither* entry (every string of the redacted entry is searched for it).
- **bare**: the value alone in an ordinary sentence (``The value is <secret> for now.``), with no
  key name or format around it. Reported for every case and for the **prefixed** ones: a secret
  whose rule's capture starts with a literal of 3 or more characters (``ghp_``, ``xoxb-``,
  ``dp.ct.``, ``AIza``), which is what a format that can be caught bare looks like.
- **false positives** on real agent logs: every file of both sample packs imported with the
  project's importers, each entry published through the same path; an entry counts when the
  redaction changed anything in it (or refused it: an id that looked like a secret).

The corpora are made by ``tests/data/secrets/fetch.py`` (see NOTICE.md there): tuning sources
(Nosey Parker's rule examples, secretlint's snapshots, a third of Kingfisher's rule files) and
held-out ones, each measured once after the detector was frozen (``<source>.measured.json``):
another third of Kingfisher's files (looked at since), and three slices of google/osv-scalibr's
veles detector tests (all three tuned on after their measurement), and the plugin tests of
Yelp/detect-secrets (``detectsecrets``: measured once at e78a80a, its misses recorded, tuned on in
the eighth round). The eighth round's: Skyscanner/whispers' fixtures (``whispers``, tuning) and
sirwart/ripsecrets' test files (``ripsecrets``, held out: measured at the freeze commit 074c1c5
and once at the end of the round; tuned on its Maven miss in the ninth). The ninth round's:
aquasecurity/trivy's secret-scanner test data (``trivy``, held out: measured once with the detector
frozen at e84bd23, then tuned on). The tenth round's: the positive tests of Checkmarx/kics'
Passwords And Secrets query (``kics``, held out: measured once with the detector frozen at
1b2fc17, then tuned on) and a fourth slice of the veles tests (``veles4``, held out: measured
once at d9b19ef, then tuned on) 30 more Kingfisher rule files (``kingfisher5``, held out:
measured once at abc33b3, then tuned on), and the last veles packages and 30 more Kingfisher
files (``veles5``, ``kingfisher6``, held out: each measured once at 42606fb, then tuned on),
the next 30 (``kingfisher7``, held out: measured once at e2f166b, then tuned on), the next
30 (``kingfisher8``, at f86a433), the next 30 (``kingfisher9``, at 748178c) and the next 30
(``kingfisher10``, at 70c1d15), each measured once, then looked at. The eleventh round's: the
next 30 (``kingfisher11``, held out: measured once at 3f56206, then tuned on) and the 30 after
them (``kingfisher12``, at bbe799c, then tuned on), and the last 23 (``kingfisher13``, at 2f739c0,
then tuned on); and from another scanner, the pattern tests of trufflehog's first 25 detectors
(``trufflehog``, at 28a1f3d, then tuned on) and the next 25 (``trufflehog2``, at 4332f70, then
tuned on): AGPL-3.0, so only their figures are stored.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from schemas.factory import sample_entry
from schemas.json_form import to_json
from schemas.models import EntryKind, LedgerEntry, TextPart, ToolResultPart, ToolResultStatus
from schemas.secret_scan import SecretDetector
from streams.importers import FORMATS
from streams.redaction import SecretInIdentifierError, redact_entry

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT / "tests" / "data" / "secrets"


def shared_packs() -> Path:
    """Where the shared sample packs are (the tests' answer too, ``tests/packs.py``):
    ``AGENTLEDGER_SHARED`` if set, else the ``shared`` folder beside the repository or beside any
    folder above it (a clone kept deeper, e.g. in a temporary folder), else ``/work/shared``."""
    if os.environ.get("AGENTLEDGER_SHARED"):
        return Path(os.environ["AGENTLEDGER_SHARED"])
    for folder in ROOT.parents:
        if (folder / "shared" / "samples").is_dir():
            return folder / "shared"
    return Path("/work/shared")


SHARED = shared_packs()
# The importers that read each folder of the two sample packs (as the integration tests import
# them; pack 2's swebench-eval reports and truth files are no agent logs).
PACKS: dict[str, dict[str, tuple[str, ...]]] = {
    "samples": {
        "aider": ("aider",),
        "claude-code": ("claude-code",),
        "codex": ("codex",),
        "mini-swe-agent": ("mini-swe-agent",),
        "openhands": ("openhands",),
        "otel": ("otel-genai",),
        "swe-agent": ("swe-agent",),
    },
    "samples2": {
        "aider": ("aider",),
        "claude-code": ("claude-code",),
        "codex": ("codex",),
        "mini-swe-agent": ("mini-swe-agent",),
        "openhands": ("openhands", "openhands-llm-logs/sdk-claude-sonnet-4-run"),
        "swe-agent": ("swe-agent",),
    },
}


@dataclass(frozen=True)
class Case:
    """One corpus example: the text as its source gives it and the secret value in it."""

    source: str
    rule: str
    example: str
    secret: str
    prefixed: bool


def load(source: str) -> list[Case]:
    """The stored corpus ``tests/data/secrets/<source>.jsonl`` (no network)."""
    patterns = _patterns(source)
    cases = []
    for line in (CORPORA / f"{source}.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        # secretlint's rows carry the literal their format starts with (no patterns stored)
        prefix = row.get("prefix") or literal_prefix(patterns.get(row["rule"], ""))
        prefixed = len(prefix) >= 3 and row["secret"].lower().startswith(prefix.lower())
        cases.append(Case(source, row["rule"], row["example"], row["secret"], prefixed))
    return cases


def _patterns(source: str) -> dict[str, str]:
    """Rule id -> pattern, read from the stored trimmed rule file without a YAML library: the
    JSONL does not repeat patterns, so ``fetch.py build`` writes them beside it."""
    path = CORPORA / f"{source}.patterns.json"
    return dict(json.loads(path.read_text(encoding="utf-8"))) if path.exists() else {}


_VERBOSE_JUNK = re.compile(r"\(\?#[^)]*\)|\s+")
_GROUP_OPEN = re.compile(r"\((?!\?)|\(\?P?<[A-Za-z_]\w*>")
_META = set("[](){}|*+?.^$\\")


def literal_prefix(pattern: str) -> str:
    """The literal characters a rule's secret starts with: what follows the first capturing group's
    opening parenthesis (``(ghp_`` gives ``ghp_``, ``(dp\\.ct\\.`` gives ``dp.ct.``); escaped
    punctuation counts as literal, a class, group or quantifier ends it. Empty when the secret
    starts with a class or an alternation (``(?:AKIA|ASIA)``)."""
    text = _VERBOSE_JUNK.sub("", pattern) if "(?x" in pattern else pattern
    m = _GROUP_OPEN.search(text)
    if m is None:  # no capture group: the whole match is the secret
        text = re.sub(r"^(?:\(\?[a-zA-Z]+\))+", "", text).removeprefix("\\b")
        at = 0
    else:
        at = m.end()
    out = []
    while at < len(text):
        ch = text[at]
        if ch == "\\" and at + 1 < len(text) and not text[at + 1].isalnum():
            out.append(text[at + 1])
            at += 2
            continue
        if ch in _META:
            break
        out.append(ch)
        at += 1
    if out and at < len(text) and text[at] in "?*{":  # the last character is optional/repeated
        out.pop()
    return "".join(out)


def strings(doc: Any) -> Iterator[str]:
    """Every string of a JSON document, keys included."""
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for key, value in doc.items():
            yield str(key)
            yield from strings(value)
    elif isinstance(doc, list | tuple):
        for value in doc:
            yield from strings(value)


def survives(secret: str, entry: LedgerEntry, detector: SecretDetector | None = None) -> bool:
    """Whether ``secret`` is still somewhere in the entry once redacted for publishing."""
    redacted = redact_entry(entry, detector)
    return any(secret in s for s in strings(to_json(redacted)))


def as_text(text: str) -> LedgerEntry:
    return sample_entry(EntryKind.USER_TASK, parts=(TextPart(text=text),))


def as_tool_output(text: str) -> LedgerEntry:
    part = ToolResultPart(
        tool_call_id="call-1",
        status=ToolResultStatus.SUCCEEDED,
        exit_code=0,
        timed_out=False,
        summary=text,
    )
    return sample_entry(EntryKind.TOOL_CALL_RESULT, parts=(part,))


def bare_sentence(secret: str) -> str:
    return f"The value is {secret} for now."


@dataclass
class Recall:
    """Hits over cases for one source, in context and bare, with the rules that missed."""

    source: str
    cases: int = 0
    in_context: int = 0
    bare: int = 0
    prefixed: int = 0
    prefixed_bare: int = 0
    missed_in_context: Counter[str] = field(default_factory=Counter)
    missed_bare_prefixed: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        def pct(a: int, b: int) -> float:
            return round(100 * a / b, 1) if b else 0.0

        return {
            "source": self.source,
            "cases": self.cases,
            "in_context": f"{self.in_context}/{self.cases}",
            "in_context_pct": pct(self.in_context, self.cases),
            "bare": f"{self.bare}/{self.cases}",
            "bare_pct": pct(self.bare, self.cases),
            "prefixed_bare": f"{self.prefixed_bare}/{self.prefixed}",
            "prefixed_bare_pct": pct(self.prefixed_bare, self.prefixed),
            "missed_in_context": dict(self.missed_in_context.most_common()),
            "missed_bare_prefixed": dict(self.missed_bare_prefixed.most_common()),
        }


def recall(cases: list[Case], detector: SecretDetector | None = None) -> Recall:
    """Hits in context and bare (``detector``: the shipped one unless given)."""
    out = Recall(cases[0].source if cases else "")
    for case in cases:
        out.cases += 1
        hidden = not survives(case.secret, as_text(case.example), detector) and not survives(
            case.secret, as_tool_output(case.example), detector
        )
        out.in_context += hidden
        if not hidden:
            out.missed_in_context[case.rule] += 1
        bare = not survives(case.secret, as_text(bare_sentence(case.secret)), detector)
        out.bare += bare
        if case.prefixed:
            out.prefixed += 1
            out.prefixed_bare += bare
            if not bare:
                out.missed_bare_prefixed[case.rule] += 1
    return out


@dataclass
class FalsePositives:
    """Entries of the real logs that redaction changed (none holds a live secret)."""

    entries: int = 0
    changed: int = 0
    files: int = 0
    hits: list[tuple[str, int, tuple[str, ...]]] = field(default_factory=list)

    @property
    def per_10k(self) -> float:
        return 10_000 * self.changed / self.entries if self.entries else 0.0


def real_entries(shared: Path = SHARED) -> Iterator[tuple[str, LedgerEntry]]:
    """Every entry of every agent log of both sample packs, as the importers map them."""
    for pack, formats in PACKS.items():
        for fmt, folders in formats.items():
            importer = FORMATS[fmt]
            for path in importer.discover([shared / pack / f for f in folders]):
                runs, _ = importer.import_file(path, "fp-scan")
                label = path.relative_to(shared).as_posix()
                for run in runs:
                    for entry in run.entries:
                        yield label, entry


def false_positives(
    shared: Path = SHARED, detector: SecretDetector | None = None
) -> FalsePositives:
    out = FalsePositives()
    seen: set[str] = set()
    for label, entry in real_entries(shared):
        seen.add(label)
        out.entries += 1
        try:
            redacted = redact_entry(entry, detector)
        except SecretInIdentifierError:  # refused at the publisher: worse than a redaction
            out.changed += 1
            out.hits.append((label, entry.sequence_no, ("refused",)))
            continue
        if redacted is not entry:
            out.changed += 1
            rules = tuple(r.rule or "?" for r in redacted.redactions[len(entry.redactions) :])
            out.hits.append((label, entry.sequence_no, rules))
    out.files = len(seen)
    return out


@dataclass(frozen=True)
class HeldOut:
    """One held-out source: as measured once with the detector frozen, and as it stands now."""

    source: str
    frozen_at: str  # the commit whose detector measured it
    frozen: Recall
    now: Recall  # measured now; as last recorded when the cases are not stored (their licence)
    stored: bool = True


def held_out(detector: SecretDetector | None = None) -> list[HeldOut]:
    """Every held-out source (a ``<source>.measured.json`` with ``"held_out": true``; the tuning
    sources measured the same way say false), by name. A file that does not say is an error:
    which sources are held out is decided when each is measured, not read from its note."""
    out = []
    for path in sorted(CORPORA.glob("*.measured.json")):
        doc = json.loads(path.read_text())
        if not isinstance(doc.get("held_out"), bool):
            raise ValueError(f'{path.name}: no "held_out": true or false')
        if not doc["held_out"]:
            continue  # (a tuning source, measured the same way)
        source = path.name.removesuffix(".measured.json")
        frozen = Recall(
            source,
            cases=doc["cases"],
            in_context=doc["in_context"],
            bare=doc["bare"],
            prefixed=doc["prefixed"],
            prefixed_bare=doc["prefixed_bare"],
        )
        if (CORPORA / f"{source}.jsonl").exists():
            now = recall(load(source), detector)
            out.append(HeldOut(source, doc["detector_commit"], frozen, now))
            continue
        last = (doc.get("remeasured") or [doc])[-1]  # measured on local copies, not stored
        now = replace(frozen, **{k: last[k] for k in ("in_context", "bare", "prefixed_bare")})
        out.append(HeldOut(source, doc["detector_commit"], frozen, now, stored=False))
    return out


def held_out_table(rows: list[HeldOut]) -> str:
    """The held-out sources as a Markdown table: each measured once, frozen, and now; the goal
    (95 % in context, 99 % prefixed bare) marked where a frozen figure meets it; totals."""

    def share(hit: int, of: int, goal: float | None = None) -> str:
        if not of:
            return "none"
        text = f"{hit:,}/{of:,} ({100 * hit / of:.1f} %)"
        return f"**{text}**" if goal is not None and hit / of >= goal else text

    lines = [
        "| held-out source | frozen at | in context, frozen | prefixed bare, frozen "
        "| bare, frozen | in context, now | prefixed bare, now |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f, n = r.frozen, r.now
        lines.append(
            f"| {r.source} | `{r.frozen_at}` | {share(f.in_context, f.cases, IN_CONTEXT_GOAL)} "
            f"| {share(f.prefixed_bare, f.prefixed, PREFIXED_BARE_GOAL)} "
            f"| {share(f.bare, f.cases)} "
            f"| {share(n.in_context, n.cases)}{'' if r.stored else ' †'} "
            f"| {share(n.prefixed_bare, n.prefixed)}{'' if r.stored else ' †'} |"
        )
    total = [sum(getattr(r.frozen, k) for r in rows) for k in FIGURES]
    now = [sum(getattr(r.now, k) for r in rows) for k in FIGURES]
    met = sum(r.frozen.in_context >= IN_CONTEXT_GOAL * r.frozen.cases for r in rows)
    lines.append(
        f"| all {len(rows)} ({met} meet 95 % in context, frozen) | | "
        f"{share(total[1], total[0])} | {share(total[4], total[3])} | {share(total[2], total[0])} "
        f"| {share(now[1], now[0])} | {share(now[4], now[3])} |"
    )
    if not all(r.stored for r in rows):
        lines.append(
            "\n† as last measured on local copies of cases whose licence keeps them out of "
            "the repository (their `.measured.json` records each measurement)"
        )
    return "\n".join(lines)


FIGURES = ("cases", "in_context", "bare", "prefixed", "prefixed_bare")
IN_CONTEXT_GOAL = 0.95  # issue 27: in context, on a held-out source
PREFIXED_BARE_GOAL = 0.99  # issue 27: prefixed formats caught bare


def main() -> None:
    """``python -m streams.secret_eval [source ...]``: recall per source and the FP figure;
    ``--held-out``: the held-out sources' table (frozen and now), as the README gives it."""
    import argparse
    import time

    sources = sorted(
        p.name.removesuffix(".jsonl")
        for p in CORPORA.glob("*.jsonl")
        if not p.name.endswith("-tests.jsonl")  # (raw copies a corpus was made from)
    )
    parser = argparse.ArgumentParser(
        prog="python -m streams.secret_eval",
        description="The detector's recall per corpus of real-format secrets, then its false "
        "positives on real agent logs and code.",
    )
    parser.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help=f"corpora to measure (default: noseyparker ours); one of: {', '.join(sources)}, ours",
    )
    parser.add_argument(
        "--held-out",
        action="store_true",
        help="print the held-out sources' table (frozen and now), as the README gives it",
    )
    args = parser.parse_args()
    if args.held_out:
        if args.sources:
            parser.error("--held-out takes no SOURCE")
        print(held_out_table(held_out()))
        return
    unknown = [s for s in args.sources if s != "ours" and s not in sources]
    if unknown:
        parser.error(f"no corpus named {', '.join(unknown)} in {CORPORA}")
    started = time.perf_counter()
    for source in args.sources or ["noseyparker", "ours"]:
        cases = ours() if source == "ours" else load(source)
        print(json.dumps(recall(cases).as_dict()))
    fp = false_positives()
    print(
        json.dumps(
            {
                "real_entries": fp.entries,
                "files": fp.files,
                "changed": fp.changed,
                "per_10k": round(fp.per_10k, 2),
                "hits": fp.hits,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
    )


OURS_SEED = 20261130  # tests/unit/secret_corpus.py's seed


def ours() -> list[Case]:
    """Our own corpus (``tests/unit/secret_corpus.py``), its text as the context; prefixed when
    the value starts with a known literal of its family (none is claimed: reported as is)."""
    import tests.unit.secret_corpus as ours_corpus

    # The corpus draws from one module-level generator, so each call gives other values: start
    # it again from its seed so the figure is the same whatever ran before.
    ours_corpus._rng.seed(OURS_SEED)
    return [Case("ours", name, text, secret, False) for name, secret, text in ours_corpus.corpus()]


if __name__ == "__main__":
    main()
