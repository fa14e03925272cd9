"""Issue 27: recall on secrets the detector was not tuned on, and false positives on real logs.

Floors are the measured figures (``python -m streams.secret_eval``) less a small margin for the
tuning corpora, and exactly the measured figure for the held-out ones (a regression guard: each
was measured once, after the detector was frozen, and never tuned on; ``<source>.measured.json``
records it). Kingfisher's held-out third was looked at after its measurement, so its floor is the
latest re-measurement and no held-out figure any more; so are the first two veles slices (tuned on
in the sixth round, after their measurement); veles3 was tuned on in the seventh round, after its
measurement, and the plugin tests of Yelp/detect-secrets (``detectsecrets``, measured once at
e78a80a) had their misses recorded, so the eighth round tuned on them too. The eighth round's
sources: whispers' fixtures (``whispers``, X, tuning) and ripsecrets' test files (``ripsecrets``,
Y, held out: measured at the freeze commit 074c1c5 and once more at the end, never tuned on).
Each test can
fail: the last two show the same measurement failing for a detector without rules and for one that
flags every long word.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from schemas.secret_scan import Rule, SecretDetector, _compile
from streams.secret_eval import (
    CORPORA,
    PACKS,
    SHARED,
    Case,
    FalsePositives,
    Recall,
    false_positives,
    load,
    ours,
    recall,
)


@cache
def _recall(source: str) -> Recall:
    return recall(ours() if source == "ours" else load(source))


@cache
def _fp() -> FalsePositives:
    return false_positives()


def test_the_corpora_are_what_their_summaries_say() -> None:
    for source, kept in (("noseyparker", 299), ("kingfisher", 73)):
        cases = load(source)
        summary = json.loads((CORPORA / f"{source}.dropped.json").read_text())
        assert len(cases) == summary["kept"] == kept
        assert all(c.secret in c.example and len(c.secret) >= 8 for c in cases)
    assert sum(c.prefixed for c in load("noseyparker")) == 126


def test_the_third_source_is_what_its_summary_says() -> None:
    """secretlint's snapshot tests (tuning): 61 examples kept, 40 of them prefixed."""
    cases = load("secretlint")
    summary = json.loads((CORPORA / "secretlint.dropped.json").read_text())
    assert len(cases) == summary["kept"] == 61
    assert sum(c.prefixed for c in cases) == summary["prefixed"] == 40
    assert all(c.secret in c.example and len(c.secret) >= 8 for c in cases)
    assert len({c.rule for c in cases}) == 17  # rule packages


def test_tuning_source_secretlint_in_context_and_bare() -> None:
    r = _recall("secretlint")
    assert r.in_context == r.cases == 61, r.as_dict()  # 61/61 before tuning too
    assert r.prefixed_bare == 40, r.as_dict()  # measured 37/40 before tuning on it


def test_tuning_source_nosey_parker_in_context_and_bare() -> None:
    r = _recall("noseyparker")
    assert r.cases == 299
    assert r.in_context >= 286, r.as_dict()  # measured 288/299 (96.3 %); 284 before round 3
    assert r.prefixed_bare >= 125, r.as_dict()  # measured 126/126 (100 %); 121 before round 3
    # measured 159/299 (53.2 %), then 155/299 (51.8 %) after the rules stopped taking dotted
    # code names and CamelCase identifiers for tokens (the false positives on code, README),
    # 162/299 after round 3, 171/299 after round 5, 179/299 (59.9 %) after round 6
    assert r.bare >= 175, r.as_dict()


def test_our_corpus_in_context_and_bare() -> None:
    r = _recall("ours")
    assert r.in_context == r.cases == 120, r.as_dict()
    assert r.bare >= 81, r.as_dict()  # measured 83/120


def test_looked_at_kingfisher_stays_at_its_latest_measurement() -> None:
    measured = json.loads((CORPORA / "kingfisher.measured.json").read_text())
    latest = measured["remeasured"][-1]
    r = _recall("kingfisher")
    counts = (r.in_context, r.bare, r.prefixed_bare)
    assert r.cases == measured["cases"] == 73
    # measured once at 53/73, 24/73, 14/20; looked at since: 64/73, 31/73, 17/20 at 218aa6d;
    # 73/73, 33/73, 19/20 after the fourteenth round (Cloudflare origin CA keys bare)
    assert r.in_context >= latest["in_context"] == 73, counts
    assert r.bare >= latest["bare"] == 33, counts
    assert r.prefixed_bare >= latest["prefixed_bare"] == 19, counts


@pytest.mark.parametrize(
    ("source", "cases", "prefixed", "in_context", "bare", "prefixed_bare"),
    [("veles", 72, 14, 70, 43, 13), ("veles2", 59, 52, 56, 52, 52)],
)
def test_looked_at_veles_slices_stay_at_their_latest_measurement(
    source: str, cases: int, prefixed: int, in_context: int, bare: int, prefixed_bare: int
) -> None:
    """veles 52/72 and veles2 44/59 when measured once; tuned on in the sixth round."""
    measured = json.loads((CORPORA / f"{source}.measured.json").read_text())
    latest = measured["remeasured"][-1]
    r = _recall(source)
    counts = (r.in_context, r.bare, r.prefixed_bare)
    assert r.cases == measured["cases"] == cases and r.prefixed == prefixed
    assert r.in_context >= latest["in_context"] == in_context, counts
    assert r.bare >= latest["bare"] == bare, counts
    assert r.prefixed_bare >= latest["prefixed_bare"] == prefixed_bare, counts


def test_held_out_veles3_stays_at_its_measured_floor() -> None:
    measured = json.loads((CORPORA / "veles3.measured.json").read_text())
    r = _recall("veles3")
    # counts only in the messages; before this work (399a503): 36/44, 28/44, 28/37
    counts = (r.in_context, r.bare, r.prefixed_bare)
    assert r.cases == measured["cases"] == 44
    assert r.prefixed == measured["prefixed"] == 37
    assert r.in_context >= measured["in_context"] == 37, counts  # measured once at 218aa6d
    assert r.bare >= measured["bare"] == 35, counts
    assert r.prefixed_bare >= measured["prefixed_bare"] == 28, counts


def test_looked_at_detectsecrets_stays_at_its_latest_measurement() -> None:
    """Measured once at e78a80a (148/193, 85/193, 25/33), its misses recorded, then tuned on in
    the eighth round (its recorded families: npmrc auth lines, unsigned JWTs, short AVNS_
    tokens, legacy Vault tokens)."""
    measured = json.loads((CORPORA / "detectsecrets.measured.json").read_text())
    summary = json.loads((CORPORA / "detectsecrets.dropped.json").read_text())
    latest = measured["remeasured"][-1]
    r = _recall("detectsecrets")
    counts = (r.in_context, r.bare, r.prefixed_bare)  # counts only: no value in a message
    assert r.cases == measured["cases"] == summary["kept"] == 193
    assert r.prefixed == measured["prefixed"] == summary["prefixed"] == 33
    assert measured["in_context"] == 148  # the held-out measurement, at e78a80a
    assert r.in_context >= latest["in_context"] == 172, counts  # 167 before the 15th round
    assert r.bare >= latest["bare"] == 93, counts
    assert r.prefixed_bare >= latest["prefixed_bare"] == 33, counts


def test_held_out_ripsecrets_stays_at_its_measured_floor() -> None:
    """Y of the eighth round: measured at the freeze (074c1c5: 28/31, 24/31, 14/15) and once at
    the end (bba2c2d); never tuned on. Counts only in the messages."""
    measured = json.loads((CORPORA / "ripsecrets.measured.json").read_text())
    final = measured["final"]
    r = _recall("ripsecrets")
    counts = (r.in_context, r.bare, r.prefixed_bare)
    assert r.cases == measured["cases"] == 31 and r.prefixed == measured["prefixed"] == 15
    assert (measured["in_context"], measured["bare"], measured["prefixed_bare"]) == (28, 24, 14)
    assert r.in_context >= final["in_context"] == 29, counts
    assert r.in_context >= measured["remeasured"][-1]["in_context"] == 30, counts  # tuned on
    assert r.bare >= final["bare"] == 25, counts
    assert r.prefixed_bare >= final["prefixed_bare"] == 15, counts


def test_held_out_kics_as_measured_then_tuned_on() -> None:
    """The tenth round's held-out source, the positive tests of kics' Passwords And Secrets query:
    measured once with the detector frozen at 1b2fc17 (26/35 in the line, 28/35 in the whole
    file, 12/35 bare, 7/7 prefixed bare); its misses were then looked at (five hold no
    credential) and the four credentials tuned on. Counts only in the messages."""
    measured = json.loads((CORPORA / "kics.measured.json").read_text())
    summary = json.loads((CORPORA / "kics.dropped.json").read_text())
    latest = measured["remeasured"][-1]
    r = _recall("kics")
    counts = (r.in_context, r.bare, r.prefixed_bare)
    assert r.cases == measured["cases"] == summary["kept"] == 35
    assert r.prefixed == measured["prefixed"] == summary["prefixed"] == 7
    held_out = (measured["in_context"], measured["in_whole_file"], measured["bare"])
    assert held_out == (26, 28, 12) and measured["prefixed_bare"] == 7
    assert r.in_context >= latest["in_context"] == 30, counts
    assert r.bare >= latest["bare"] == 13, counts
    assert r.prefixed_bare >= latest["prefixed_bare"] == 7, counts
    assert all(c.secret in c.example and len(c.secret) >= 8 for c in load("kics"))


@pytest.mark.parametrize(
    ("source", "cases", "prefixed", "held_out", "floor"),
    [
        ("trivy", 15, 5, (13, 10, 5), (15, 10, 5)),
        ("veles4", 82, 82, (60, 45, 45), (82, 82, 82)),
        ("kingfisher5", 61, 19, (59, 26, 16), (61, 29, 19)),
        ("veles5", 16, 6, (14, 11, 6), (16, 12, 6)),
        ("kingfisher6", 125, 62, (108, 57, 54), (113, 62, 57)),
        ("kingfisher7", 61, 7, (54, 24, 5), (61, 26, 7)),
        ("kingfisher8", 45, 29, (44, 25, 21), (45, 30, 26)),
        ("kingfisher9", 76, 27, (69, 38, 24), (75, 42, 27)),
        ("kingfisher10", 77, 34, (73, 33, 28), (73, 33, 28)),
        ("kingfisher11", 90, 42, (82, 52, 36), (86, 56, 40)),
        ("kingfisher12", 83, 42, (75, 54, 34), (83, 58, 38)),
        ("kingfisher13", 49, 16, (46, 21, 14), (49, 23, 16)),
        ("leaktk", 182, 46, (163, 60, 44), (181, 63, 46)),
        ("leakyrepo", 104, 15, (98, 28, 13), (101, 30, 15)),
        ("sarifpm", 106, 18, (82, 18, 18), (95, 19, 18)),
        ("checkov", 39, 1, (17, 6, 1), (30, 6, 1)),
        ("horusec", 20, 10, (20, 11, 8), (20, 12, 9)),
        ("gosec", 15, 2, (13, 4, 2), (15, 4, 2)),
    ],
)
def test_held_out_as_measured_then_tuned_on(
    source: str,
    cases: int,
    prefixed: int,
    held_out: tuple[int, int, int],
    floor: tuple[int, int, int],
) -> None:
    """The ninth to eleventh rounds' held-out sources, measured once each with the detector
    frozen (trivy at e84bd23; veles4 at d9b19ef, kingfisher5 at abc33b3, veles5 and kingfisher6
    at 42606fb, kingfisher7 at e2f166b, kingfisher8 at f86a433, kingfisher9 at 748178c,
    kingfisher10 at 70c1d15, kingfisher11 at 3f56206, kingfisher12 at bbe799c, kingfisher13 at
    2f739c0; leaktk at 0cc2d90, the fourteenth round's; leakyrepo at 4dceb01, the sixteenth's;
    sarifpm at 40f2513, the seventeenth's; checkov at fe25a34, the eighteenth's; horusec and
    gosec at 1636f51, the nineteenth's; in context, bare, prefixed bare), then
    looked at and tuned on (kingfisher10:
    nothing to tune, its misses hold ids); they stay at least at the figures after that, and
    each value is in its example. Counts only in the messages."""
    measured = json.loads((CORPORA / f"{source}.measured.json").read_text())
    summary = json.loads((CORPORA / f"{source}.dropped.json").read_text())
    latest = measured["remeasured"][-1]
    r = _recall(source)
    counts = (r.in_context, r.bare, r.prefixed_bare)
    assert r.cases == measured["cases"] == summary["kept"] == cases
    assert r.prefixed == measured["prefixed"] == prefixed
    assert (measured["in_context"], measured["bare"], measured["prefixed_bare"]) == held_out
    assert summary.get("prefixed", prefixed) == prefixed  # (rule-file sources do not count it)
    assert (latest["in_context"], latest["bare"], latest["prefixed_bare"]) == floor
    assert all(a >= b for a, b in zip(counts, floor, strict=True)), counts
    assert all(c.secret in c.example and len(c.secret) >= 8 for c in load(source))


def test_the_eighth_round_sources_are_what_their_summaries_say() -> None:
    """whispers (X, tuning) and ripsecrets (Y, held out): kept and prefixed counts as built, each
    value in its example, and the two copied from different repositories' files."""
    for source, kept, prefixed in (("whispers", 121, 9), ("ripsecrets", 31, 15)):
        cases = load(source)
        summary = json.loads((CORPORA / f"{source}.dropped.json").read_text())
        assert len(cases) == summary["kept"] == kept
        assert sum(c.prefixed for c in cases) == summary["prefixed"] == prefixed
        assert all(c.secret in c.example and len(c.secret) >= 8 for c in cases)


def test_tuning_source_whispers_in_context_and_bare() -> None:
    """Measured once at the freeze (59/121 in context, 10/121 bare, 9/9 prefixed bare), then
    tuned on: 115/121 after the eighth round."""
    measured = json.loads((CORPORA / "whispers.measured.json").read_text())
    r = _recall("whispers")
    assert r.cases == measured["cases"] == 121 and r.prefixed == 9, r.as_dict()
    assert measured["in_context"] == 59  # at the freeze, before the round's rules
    assert r.in_context >= 113, r.as_dict()  # measured 115/121
    assert r.prefixed_bare == 9, r.as_dict()


def test_tuning_source_kingfisher_other_files_in_context_and_bare() -> None:
    r = _recall("kingfisher-tuning")
    assert r.cases == 85 and r.prefixed == 29, r.as_dict()
    # measured 84/85 after the fifth and sixth rounds; 76/85 with the rules before the fourth
    assert r.in_context >= 83, r.as_dict()
    assert r.prefixed_bare >= 25, r.as_dict()  # measured 26/29; 17/29 before the fourth round
    assert r.bare >= 43, r.as_dict()  # measured 45/85 after the sixth round; 27/85 before


def test_slices_of_one_repository_share_no_file() -> None:
    def files(source: str) -> set[str]:
        lines = (CORPORA / f"{source}.jsonl").read_text(encoding="utf-8").splitlines()
        return {json.loads(line)["file"] for line in lines}

    kingfisher = ["kingfisher", "kingfisher-tuning", *(f"kingfisher{n}" for n in range(5, 14))]
    veles = ["veles", "veles2", "veles3", "veles4", "veles5"]
    for slices in (kingfisher, veles):  # no file in two slices of one repository
        for i, a in enumerate(slices):
            assert files(a), a
            for b in slices[i + 1 :]:
                assert files(a).isdisjoint(files(b)), (a, b)
    assert len(files("kingfisher-tuning")) >= 30
    assert all(f.startswith("pkg/fanal/secret/testdata/") for f in files("trivy"))
    assert all("/passwords_and_secrets/test/positive" in f for f in files("kics"))
    assert all(f.startswith("tests/plugins/") for f in files("detectsecrets"))
    assert all(f.startswith("tests/fixtures/") for f in files("whispers"))
    assert all(f.startswith("test/one_per_") for f in files("ripsecrets"))
    assert not any(f.startswith(("tests/", "test/", "pkg/")) for f in files("leakyrepo"))


def test_false_positives_on_both_packs_real_logs_at_most_1_per_10000_entries() -> None:
    for pack in PACKS:
        assert (SHARED / pack).is_dir(), f"sample pack missing: {SHARED / pack}"
    fp = _fp()
    assert fp.entries >= 5000 and fp.files >= 30, (fp.entries, fp.files)
    assert fp.per_10k <= 1.0, fp.hits


def test_the_recall_measure_fails_for_a_detector_that_finds_nothing() -> None:
    cases = load("noseyparker")[:40]
    weak = recall(cases, SecretDetector([]))
    assert weak.in_context == 0 and weak.bare == 0
    strong = recall(cases)
    assert strong.in_context > weak.in_context


def test_the_false_positive_measure_fails_for_a_detector_that_flags_long_words() -> None:
    greedy = Rule(
        id="any-long-word",
        regex=_compile(r"\b([A-Za-z]{12,})\b"),
        keywords=(),
        entropy=0.0,
        secret_group=1,
        allowlists=(),
    )
    fp = false_positives(detector=SecretDetector([greedy]))
    assert fp.per_10k > 1.0


@pytest.mark.parametrize(
    "source", sorted(p.name.removesuffix(".dropped.json") for p in CORPORA.glob("*.dropped.json"))
)
def test_cases_are_plain_data(source: str) -> None:
    case = load(source)[0]
    assert isinstance(case, Case) and case.source == source


def test_the_held_out_table_is_each_sources_single_measurement_beside_now() -> None:
    from streams.secret_eval import held_out, held_out_table

    nothing = SecretDetector([])  # finds nothing: "now" must come from measuring, not a file
    rows = held_out(nothing)
    names = {r.source for r in rows}
    assert "whispers" not in names  # a tuning source, measured the same way
    assert {"checkov", "gosec", "horusec", "semgrep", "veles3", "kingfisher"} <= names
    for r in rows:
        doc = json.loads((CORPORA / f"{r.source}.measured.json").read_text())
        frozen = (r.frozen.cases, r.frozen.in_context, r.frozen.bare, r.frozen.prefixed_bare)
        assert frozen == (doc["cases"], doc["in_context"], doc["bare"], doc["prefixed_bare"])
        if r.stored:
            assert r.now.cases == r.frozen.cases and r.now.in_context == 0
        else:  # cases kept out of the repository: the last measurement recorded
            assert r.now.in_context == doc["remeasured"][-1]["in_context"]
    table = held_out_table(rows)
    assert f"| all {len(rows)} (" in table and table.count("\n| ") == len(rows) + 1
    assert "| gosec | `1636f51` | 13/15 (86.7 %) |" in table  # not met: not bold
    assert "| horusec | `1636f51` | **20/20 (100.0 %)** |" in table  # met: bold


def test_the_measuring_command_names_its_corpora_and_refuses_an_unknown_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m streams.secret_eval --help`` lists the stored corpora; a name with no corpus
    is one line of usage error (exit 2), not a traceback (both were a FileNotFoundError)."""
    from streams.secret_eval import main

    monkeypatch.setattr("sys.argv", ["secret_eval", "--help"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0
    assert "noseyparker" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["secret_eval", "no-such-corpus"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "no corpus named no-such-corpus" in err and "Traceback" not in err


def test_which_sources_are_held_out_is_a_field_each_measurement_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every stored measurement says ``held_out`` true or false (37 held out, whispers a tuning
    source); the table takes that field, not words at the start of the note (it sniffed the
    note's first 40 characters for "held-out"), and a measurement without it is refused."""
    import streams.secret_eval as se

    docs = {p.name: json.loads(p.read_text()) for p in CORPORA.glob("*.measured.json")}
    assert all(isinstance(d.get("held_out"), bool) for d in docs.values())
    assert not docs["whispers.measured.json"]["held_out"]
    assert sum(d["held_out"] for d in docs.values()) == len(docs) - 1
    copy = tmp_path / "corpora"
    copy.mkdir()
    doc = dict(docs["gosec.measured.json"], note="A note that no longer begins with the words")
    (copy / "gosec.measured.json").write_text(json.dumps(doc))
    (copy / "gosec.jsonl").write_text((CORPORA / "gosec.jsonl").read_text())
    monkeypatch.setattr(se, "CORPORA", copy)
    assert [r.source for r in se.held_out(SecretDetector([]))] == ["gosec"]
    del doc["held_out"]
    (copy / "gosec.measured.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r'gosec\.measured\.json: no "held_out"'):
        se.held_out(SecretDetector([]))
