"""The publisher's detector on our own corpora: every secret of tests/secrets/corpus.py gone from
the encoded bytes whatever field carries it (recall 100 %), identifiers holding one refused
without echoing it, and no redaction of the hard negatives or of real agent logs and code."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from infra.settings import Settings, load_settings
from schemas.codec import LedgerCodec
from schemas.errors import LedgerValidationError
from schemas.factory import json_part, model_usage, sample_entry
from schemas.models import (
    ID_PATTERN,
    METADATA_KEY_PATTERN,
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
)
from schemas.secret_scan import default_detector
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


@pytest.mark.parametrize(
    "field", ["run_id", "session_id", "entry_id", "attempt_id", "step_id", "metadata key"]
)
def test_an_identifier_holding_a_secret_is_refused_without_echo(
    field: str, settings: Settings
) -> None:
    fits = re.compile(ID_PATTERN if field != "metadata key" else METADATA_KEY_PATTERN)
    bare = [s for s in SECRETS if s.text == s.value and fits.match(s.value)][:25]
    assert len(bare) >= 20
    for secret in bare:
        value = secret.value
        if field == "metadata key":
            entry = sample_entry(metadata={value: "x"})
        else:
            entry = sample_entry(EntryKind.USER_TASK, **{field: value})
        with pytest.raises(LedgerValidationError) as exc:
            prepare(entry, SequenceBook(), CODEC, settings)
        assert "secret" in exc.value.message, secret.family
        assert value[:12] not in str(exc.value), "the value is never echoed"


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
