"""The publisher's detector on our own corpora: every secret of tests/secrets/corpus.py gone from
the encoded bytes whatever field carries it (recall 100 %), identifiers holding one refused
without echoing it, and no redaction of the hard negatives or of real agent logs and code."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from pydantic import ValidationError

from infra.settings import Settings, load_settings
from schemas.codec import LedgerCodec
from schemas.errors import LedgerValidationError
from schemas.factory import json_part, model_usage, sample_entry
from schemas.models import (
    ID_PATTERN,
    Actor,
    ActorType,
    DiffFile,
    DiffPart,
    EntryKind,
    ErrorPart,
    FileChangeStatus,
    FileClassification,
    FileSnippetPart,
    LedgerEntry,
    TextPart,
    ToolResultPart,
    ToolResultStatus,
    VerificationPart,
    VerificationStatus,
    validation_error,
)
from schemas.secret_scan import SecretDetector, default_detector
from streams.publisher import SequenceBook, prepare
from tests.secrets.corpus import Secret, hard_negatives, secrets
from tests.secrets.real_text import real_texts

CODEC = LedgerCodec()
SECRETS = secrets()
DIGEST = "sha256:" + "0" * 64


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings(kafka_bootstrap="127.0.0.1:1")


def _carriers(text: str) -> list[LedgerEntry]:
    """The text in every free-text and name field an entry has (one entry per field)."""
    usage = model_usage().model_copy(
        update={"raw_usage_json": json.dumps({"input_tokens": 1, "debug": text})}
    )
    name = text.replace("\n", " ").replace("\r", " ").replace("\t", " ")[:4000]
    result = ToolResultPart(
        tool_call_id="c1", status=ToolResultStatus.FAILED, timed_out=False, summary=text
    )
    diff = DiffFile(
        path=name,
        status=FileChangeStatus.MODIFIED,
        lines_added=1,
        lines_deleted=0,
        classification=FileClassification.SOURCE,
    )
    check = VerificationPart(
        verifier="pytest", profile=name, status=VerificationStatus.FAILED, check_id=name
    )
    snippet = FileSnippetPart(
        path="config/.env", line_start=1, line_end=2, content_hash=DIGEST, text=text
    )
    return [
        sample_entry(EntryKind.USER_TASK, parts=(TextPart(text=text),)),
        sample_entry(EntryKind.TOOL_CALL_RESULT, parts=(result,)),
        sample_entry(EntryKind.ERROR_EVENT, parts=(ErrorPart(category="tool", message=text),)),
        sample_entry(EntryKind.ERROR_EVENT, parts=(ErrorPart(category=name, message="x"),)),
        sample_entry(EntryKind.RUN_SUMMARY, metadata={"note": text}),
        sample_entry(EntryKind.RUN_SUMMARY, parts=(json_part({"log": text}),)),
        sample_entry(EntryKind.MODEL_CALL, parts=(usage,)),
        sample_entry(EntryKind.DIFF_SNAPSHOT, parts=(DiffPart(files=(diff,)),)),
        sample_entry(EntryKind.VERIFIER_RESULT, parts=(check,)),
        sample_entry(EntryKind.FILE_OBSERVATION, parts=(snippet,)),
        sample_entry(EntryKind.USER_TASK, actor=Actor(type=ActorType.USER, id=name)),
    ]


@pytest.mark.parametrize("secret", SECRETS, ids=lambda s: s.family)
def test_every_corpus_secret_is_gone_from_the_encoded_bytes(
    secret: Secret, settings: Settings
) -> None:
    for entry in _carriers(secret.text):
        prepared = prepare(entry, SequenceBook(), CODEC, settings)
        assert secret.value.encode() not in prepared.value, secret.family
        assert prepared.entry.redactions, "each redaction is recorded"
        recorded = json.dumps([r.model_dump(mode="json") for r in prepared.entry.redactions])
        assert secret.value not in recorded


def test_corpus_breadth() -> None:
    assert len(SECRETS) >= 300
    assert len({s.family for s in SECRETS}) >= 100


@pytest.mark.parametrize("field", ["run_id", "session_id", "entry_id"])
def test_an_identifier_holding_a_secret_is_refused_without_echo(
    field: str, settings: Settings
) -> None:
    fits = re.compile(ID_PATTERN)
    bare = [s for s in SECRETS if s.text == s.value and fits.match(s.value)][:25]
    assert len(bare) >= 20
    for secret in bare:
        value = secret.value
        entry = sample_entry(EntryKind.USER_TASK, **{field: value})
        with pytest.raises(LedgerValidationError) as exc:
            prepare(entry, SequenceBook(), CODEC, settings)
        assert "secret" in exc.value.message, secret.family
        assert value[:12] not in str(exc.value), "the value is never echoed"


# The charset step ids, attempt ids and metadata keys had before their format was constrained.
_OLD_CHARSET = re.compile(r"^[A-Za-z0-9_.:@/+=#~-]{1,128}$")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


@pytest.mark.parametrize("field", ["attempt_id", "step_id", "metadata key"])
def test_step_ids_and_metadata_keys_leave_no_room_for_a_secret(
    field: str, settings: Settings
) -> None:
    """Every secret value of the corpus that the old charset let into a step or attempt id or a
    metadata key is refused by the format (no run of 9+ mixed letters and digits that is no word,
    no token charset) or by the detector, and never echoed; what fits and is not found is a bare
    UUID (some providers' keys are UUIDs, as are real ids) or a password (no format at all)."""
    bare = [s for s in SECRETS if _OLD_CHARSET.match(s.value)]
    assert len(bare) >= 200
    by_format = by_detector = let_through = 0
    for secret in bare:
        value = secret.value
        fields = {"metadata": {value: "x"}} if field == "metadata key" else {field: value}
        try:
            entry = sample_entry(EntryKind.USER_TASK, **fields)
        except ValidationError as invalid:
            error = validation_error(invalid)
            assert "never an opaque token" in error.message or "at most" in error.message
            assert value[:12] not in str(error), "the value is never echoed"
            by_format += 1
            continue
        try:
            prepare(entry, SequenceBook(), CODEC, settings)
        except LedgerValidationError as refused:
            assert "secret" in refused.message, secret.family
            assert value[:12] not in str(refused), "the value is never echoed"
            by_detector += 1
        else:  # what fits and is not found: a bare UUID, or a password (which has no format)
            assert _UUID.fullmatch(value) or secret.family.endswith("password"), secret.family
            let_through += 1
    assert by_format >= 0.95 * len(bare), (by_format, by_detector, let_through)
    assert let_through <= 0.03 * len(bare), (by_format, by_detector, let_through)


@pytest.mark.parametrize(
    "value",
    ["step-3", "run-1-step12", "turn-2/tool-1", "codex-019a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8"],
)
def test_real_step_ids_fit(value: str) -> None:
    assert sample_entry(EntryKind.USER_TASK, step_id=value, attempt_id=value).step_id == value


@pytest.mark.parametrize(("label", "text"), hard_negatives(), ids=lambda v: str(v)[:30])
def test_hard_negatives_are_left_alone(label: str, text: str) -> None:
    assert default_detector().find(text) == [], label


def test_real_agent_logs_and_code_are_left_alone() -> None:
    """False positives on real text (tests/secrets/real_text.py: every entry-sized piece of the
    shared agent logs, and 400 standard-library files): goal at most 1 per 10,000 items."""
    texts = real_texts()
    found = Counter(f.rule for _label, text in texts for f in default_detector().find(text))
    assert len(texts) >= 8000
    assert sum(found.values()) <= len(texts) / 10_000, found


def test_the_keyword_less_rules_prefilter_changes_no_finding() -> None:
    """The RE2 set that picks which keyword-less rules run gives, on every corpus secret in its
    context, every hard negative and the real logs and code, the findings of running them all."""
    detector = default_detector()
    every = SecretDetector(detector.rules, detector.allowlists)
    every._always_matching = lambda text: every._always  # type: ignore[method-assign]
    texts = [s.text for s in SECRETS] + [t for _l, t in hard_negatives()]
    texts += [t for _l, t in real_texts()]
    assert len(texts) > 8000
    differ = [t[:60] for t in texts if detector.find(t) != every.find(t)]
    assert differ == []
    assert sum(bool(every.find(s.text)) for s in SECRETS) >= len(SECRETS) * 0.9


def test_when_the_prefilter_gives_up_every_keyword_less_rule_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RE2's set reports a DFA out of memory as no match at all: its always-matching first
    pattern is then missing, and the detector runs every keyword-less rule instead of none."""
    detector = SecretDetector(default_detector().rules, default_detector().allowlists)
    always = {detector.rules[at].id for at in detector._always}
    only_always = [s.text for s in SECRETS if {f.rule for f in detector.find(s.text)} <= always]
    text = next(t for t in only_always if detector.find(t))  # a keyword-less rule's find

    class GaveUp:
        def Match(self, text: str) -> None:  # RE2's name
            return None

    gave_up = SecretDetector(detector.rules, detector.allowlists)  # (nothing found kept yet)
    monkeypatch.setattr(gave_up, "_always_set", GaveUp())
    assert gave_up._always_matching(text) == gave_up._always
    assert gave_up.find(text) == detector.find(text) != []


def test_a_short_texts_kept_findings_are_its_own() -> None:
    """Short texts' findings are kept by text: asking again, or for a text that differs by one
    character, gives what a detector that never saw them finds; a caller may change the list."""
    detector = SecretDetector(default_detector().rules, default_detector().allowlists)
    fresh = SecretDetector(default_detector().rules, default_detector().allowlists)
    short = [s.text for s in SECRETS if len(s.text) <= 256][:50]
    assert len(short) == 50
    for text in short:
        first = detector.find(text)
        first.clear()
        assert detector.find(text) == fresh._find_any(text, None) != []
        other = text[:-1] + ("x" if text[-1] != "x" else "y")
        assert detector.find(other) == fresh._find_any(other, None)
