"""``python -m tests.secrets.measure``: the detector's recall and false positives, as the README
reports them. Tuning corpora (the ones the extra rules were checked against): our secrets and
hard negatives, and the shared agent logs plus 400 standard-library files. Held out (never used
to tune): the rest of the standard library and the installed packages' code, in 4,000-character
chunks."""

from __future__ import annotations

import sysconfig
import time
from collections import Counter
from pathlib import Path

from schemas.secret_scan import default_detector
from tests.secrets.corpus import hard_negatives, secrets
from tests.secrets.real_text import real_texts, stdlib_texts


def held_out_texts() -> list[tuple[str, str]]:
    tuned = {label.split("#")[0] for label, _ in stdlib_texts()}
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    files = sorted({f for root in roots for f in root.rglob("*.py")})
    chunks = []
    for path in files:
        if any(str(path).endswith(t.removeprefix("stdlib")) for t in tuned):
            continue
        text = path.read_text(errors="replace")
        start = 0
        while start < len(text):
            end = text.find("\n", start + 4000)
            end = len(text) if end < 0 else end + 1
            chunks.append((str(path), text[start:end]))
            start = end
    return chunks


def _false_positives(name: str, texts: list[tuple[str, str]]) -> None:
    detector = default_detector()
    started = time.perf_counter()
    found: Counter[str] = Counter(f.rule for _, t in texts for f in detector.find(t))
    elapsed = time.perf_counter() - started
    total = sum(found.values())
    chars = sum(len(t) for _, t in texts)
    print(
        f"{name}: {len(texts)} items, {chars / 1e6:.1f} M chars, {total} findings "
        f"({total / len(texts) * 1e4:.1f} per 10,000 items), {elapsed:.1f} s; {dict(found)}"
    )


def main() -> None:
    detector = default_detector()
    corpus = secrets()
    missed = [s.family for s in corpus if s.value in detector.redact(s.text)[0]]
    families = len({s.family for s in corpus})
    print(f"recall: {len(corpus) - len(missed)}/{len(corpus)} secrets, {families} families")
    flagged = [label for label, text in hard_negatives() if detector.find(text)]
    print(f"hard negatives flagged: {len(flagged)}/{len(hard_negatives())} {flagged}")
    _false_positives("real agent logs + 400 stdlib files (tuning)", real_texts())
    _false_positives("rest of stdlib + installed packages (held out)", held_out_texts())


if __name__ == "__main__":
    main()
