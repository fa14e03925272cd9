"""The artifact store: content-addressed files, secret-scanned before they are written; and the
publisher moving an entry's large texts into it when the entry is over the size limit."""

from __future__ import annotations

import hashlib
import json
import random
import string
from datetime import UTC, datetime
from pathlib import Path

import pytest

from infra.settings import Settings, load_settings
from schemas.codec import LedgerCodec
from schemas.errors import LedgerValidationError
from schemas.factory import json_part, sample_entry
from schemas.models import (
    ArtifactRefPart,
    EntryKind,
    RedactionLevel,
    TextPart,
    ToolResultPart,
    ToolResultStatus,
)
from streams.artifacts import (
    ArtifactCorruptError,
    ArtifactNotFoundError,
    FileArtifactStore,
    artifact_id,
    scrub,
    sha256_of,
)
from streams.publisher import SequenceBook, prepare

CODEC = LedgerCodec()
_rng = random.Random(2026)


def _aws_key_id() -> str:
    return "AKIA" + "".join(_rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") for _ in range(16))


def _output(size: int) -> str:
    """A tool output of about ``size`` characters, lines of words a test run prints."""
    words = ["PASSED", "tests/test_orders.py::test_page", "ok", "collected", "0.12s"]
    lines: list[str] = []
    length = 0
    while length < size:
        lines.append(" ".join(_rng.choice(words) for _ in range(8)))
        length += len(lines[-1]) + 1
    return "\n".join(lines)


@pytest.fixture
def store(tmp_path: Path) -> FileArtifactStore:
    return FileArtifactStore(tmp_path / "artifacts")


def test_round_trip_is_addressed_by_sha256(store: FileArtifactStore) -> None:
    data = b"line one\nline two\n"
    ref = store.put(data, "text/plain")
    sha = hashlib.sha256(data).hexdigest()
    assert (ref.sha256, ref.size_bytes, ref.artifact_id) == (sha, len(data), f"sha256:{sha}")
    assert ref.redaction_level is RedactionLevel.REVIEW, "scanned, nothing found"
    assert store.path_of(sha) == store.root / sha[:2] / sha
    assert store.exists(sha) and store.get(sha) == data


def test_put_is_idempotent(store: FileArtifactStore) -> None:
    first = store.put(b"same bytes", "text/plain")
    path = store.path_of(first.sha256)
    written = path.stat().st_mtime_ns
    assert store.put(b"same bytes", "text/plain") == first
    assert path.stat().st_mtime_ns == written, "not written again"
    assert [p.name for p in store.root.rglob("*") if p.is_file()] == [first.sha256]


def test_no_temporary_file_is_left(store: FileArtifactStore) -> None:
    for n in range(5):
        store.put(f"content {n}".encode(), "text/plain")
    assert not [p for p in store.root.rglob(".tmp-*")]


def test_a_changed_file_is_detected(store: FileArtifactStore) -> None:
    ref = store.put(b"the original content", "text/plain")
    store.path_of(ref.sha256).write_bytes(b"the original content, changed")
    with pytest.raises(ArtifactCorruptError, match=ref.sha256):
        store.get(ref.sha256)


def test_a_missing_artifact_is_not_found(store: FileArtifactStore) -> None:
    sha = hashlib.sha256(b"never stored").hexdigest()
    assert not store.exists(sha)
    with pytest.raises(ArtifactNotFoundError, match=sha):
        store.get(sha)
    with pytest.raises(ArtifactNotFoundError):
        store.get("../../etc/passwd")  # an address is 64 hex digits, never a path


def test_a_secret_is_redacted_before_the_write(store: FileArtifactStore) -> None:
    key = _aws_key_id()
    data = f"$ env\nHOME=/root\nAWS_ACCESS_KEY_ID={key}\nPATH=/usr/bin\n".encode()
    ref = store.put(data, "text/plain")
    stored = store.get(ref.sha256)
    assert key.encode() not in stored
    assert b"AWS_ACCESS_KEY_ID=[REDACTED:aws-access-token]" in stored
    assert b"HOME=/root" in stored and b"PATH=/usr/bin" in stored, "the rest kept"
    assert ref.redaction_level is RedactionLevel.RESTRICTED
    assert ref.sha256 == hashlib.sha256(stored).hexdigest(), "addressed by what was written"
    on_disk = b"".join(p.read_bytes() for p in store.root.rglob("*") if p.is_file())
    assert key.encode() not in on_disk


def test_binary_content_is_kept_byte_for_byte_and_scanned(store: FileArtifactStore) -> None:
    blob = bytes(range(256)) * 4
    assert store.get(store.put(blob, "application/octet-stream").sha256) == blob
    key = _aws_key_id()
    clean, rules = scrub(b"\xff\xfe" + f" key={key} ".encode() + b"\x80\x81")
    assert rules and key.encode() not in clean
    assert clean.startswith(b"\xff\xfe") and clean.endswith(b"\x80\x81")


def test_find_by_prefix_and_id(store: FileArtifactStore) -> None:
    ref = store.put(b"some content", "text/plain")
    assert store.find(ref.sha256[:12]) == ref.sha256
    assert store.find(artifact_id(ref.sha256)) == ref.sha256
    assert sha256_of(ref.sha256.upper()) == ref.sha256
    with pytest.raises(ValueError):
        sha256_of("not-a-sha")
    with pytest.raises(ArtifactNotFoundError):
        store.find("000000000000")


def test_content_ids_pass_the_identifier_check() -> None:
    """An artifact id is an identifier, refused when it looks like a secret: a content hash
    never does."""
    from streams.redaction import redact_entry

    for n in range(300):
        sha = hashlib.sha256(f"{n}".encode()).hexdigest()
        ref = ArtifactRefPart(
            artifact_id=artifact_id(sha),
            sha256=sha,
            size_bytes=1,
            content_type="text/plain",
            redaction_level=RedactionLevel.REVIEW,
        )
        redact_entry(sample_entry(EntryKind.ARTIFACT_STORED, parts=(ref,)))


# --- the publisher ------------------------------------------------------------------------------


@pytest.fixture
def settings() -> Settings:
    return load_settings(kafka_bootstrap="127.0.0.1:1", max_entry_bytes=16 * 1024)


def _tool_result(summary: str) -> ToolResultPart:
    return ToolResultPart(
        tool_call_id="call-1",
        status=ToolResultStatus.SUCCEEDED,
        exit_code=0,
        timed_out=False,
        summary=summary,
    )


def test_an_entry_over_the_limit_sends_a_ref(settings: Settings, store: FileArtifactStore) -> None:
    output = _output(64 * 1024)
    entry = sample_entry(EntryKind.TOOL_CALL_RESULT, parts=(_tool_result(output),))
    p = prepare(entry, SequenceBook(), CODEC, settings, artifacts=store)
    assert len(p.value) <= settings.max_entry_bytes
    [part] = p.entry.parts
    assert isinstance(part, ToolResultPart)
    [ref] = part.artifact_refs
    assert part.summary.startswith(output[:1000]) and ref.artifact_id in part.summary
    assert store.get(ref.sha256).decode() == output
    assert ref.redaction_level is RedactionLevel.REVIEW
    assert CODEC.decode(p.value) == p.entry


def test_largest_texts_move_first_and_small_ones_stay(
    settings: Settings, store: FileArtifactStore
) -> None:
    small, big, doc = "a short note", _output(40 * 1024), {"rows": [_output(30 * 1024)]}
    entry = sample_entry(
        EntryKind.RUN_SUMMARY,
        parts=(TextPart(text=small), TextPart(text=big), json_part(doc)),
    )
    p = prepare(entry, SequenceBook(), CODEC, settings, artifacts=store)
    first, second, third, *appended = p.entry.parts
    assert first == TextPart(text=small)
    assert isinstance(second, TextPart) and len(second.text) < 3000
    assert isinstance(third, ArtifactRefPart), "a JSON document moves whole, in its place"
    assert json.loads(store.get(third.sha256)) == doc
    assert [a.sha256 for a in appended if isinstance(a, ArtifactRefPart)] == [
        hashlib.sha256(big.encode()).hexdigest()
    ]


def test_a_secret_in_moved_content_never_reaches_the_store(
    settings: Settings, store: FileArtifactStore
) -> None:
    key = _aws_key_id()
    output = _output(30 * 1024) + f"\nAWS_ACCESS_KEY_ID={key}\n" + _output(30 * 1024)
    entry = sample_entry(EntryKind.TOOL_CALL_RESULT, parts=(_tool_result(output),))
    p = prepare(entry, SequenceBook(), CODEC, settings, artifacts=store)
    [part] = p.entry.parts
    assert isinstance(part, ToolResultPart)
    [ref] = part.artifact_refs
    assert ref.redaction_level is RedactionLevel.RESTRICTED, "content that held a secret"
    assert key.encode() not in store.get(ref.sha256)
    assert key.encode() not in p.value
    assert p.entry.redactions and p.entry.redactions[0].field == "parts[0].summary"
    on_disk = b"".join(f.read_bytes() for f in store.root.rglob("*") if f.is_file())
    assert key.encode() not in on_disk


def test_still_over_the_limit_names_the_entry_never_the_content(
    settings: Settings, store: FileArtifactStore
) -> None:
    many = tuple(TextPart(text=f"line {n} " + string.ascii_letters * 3) for n in range(400))
    entry = sample_entry(EntryKind.RUN_SUMMARY, parts=many)
    with pytest.raises(LedgerValidationError) as caught:
        prepare(entry, SequenceBook(), CODEC, settings, artifacts=store)
    message = str(caught.value)
    assert entry.entry_id in message and entry.run_id in message
    assert string.ascii_letters not in message
    assert "no text large enough" in message


def test_without_a_store_an_entry_over_the_limit_is_refused(settings: Settings) -> None:
    entry = sample_entry(EntryKind.TOOL_CALL_RESULT, parts=(_tool_result(_output(64 * 1024)),))
    with pytest.raises(LedgerValidationError, match="no artifact store"):
        prepare(entry, SequenceBook(), CODEC, settings)


def test_an_entry_under_the_limit_is_untouched(
    settings: Settings, store: FileArtifactStore
) -> None:
    entry = sample_entry(EntryKind.TOOL_CALL_RESULT, parts=(_tool_result(_output(8 * 1024)),))
    p = prepare(entry, SequenceBook(), CODEC, settings, artifacts=store)
    assert p.entry.parts == entry.parts
    assert not store.root.exists(), "nothing written"


# --- replay packages ----------------------------------------------------------------------------


def _package(folder: Path, sha: str) -> Path:
    from streams.replay_package import FORMAT

    folder.mkdir()
    (folder / "entries.jsonl").write_text("")
    manifest = {
        "format": FORMAT,
        "run_id": "run-1",
        "artifacts": [{"sha256": sha, "included": True}],
    }
    (folder / "package.json").write_text(json.dumps(manifest))
    return folder


def test_a_package_artifact_is_checked_on_load(tmp_path: Path) -> None:
    from streams.replay_package import ReplayPackageError, load_package

    data = b"an artifact's content"
    sha = hashlib.sha256(data).hexdigest()
    package = _package(tmp_path / "pkg", sha)
    (package / "artifacts").mkdir()
    (package / "artifacts" / sha).write_bytes(data)
    assert load_package(package, [])[0]["run_id"] == "run-1"
    (package / "artifacts" / sha).write_bytes(b"changed")
    with pytest.raises(ReplayPackageError, match="does not match its sha256"):
        load_package(package, [])
    with pytest.raises(ReplayPackageError, match="not 64 hex digits"):
        load_package(_package(tmp_path / "bad", "../../etc/passwd"), [])


def test_a_store_that_cannot_be_written_is_one_error(tmp_path: Path) -> None:
    from streams.artifacts import ArtifactError

    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ArtifactError, match="cannot write to the artifact store"):
        FileArtifactStore(tmp_path / "file" / "artifacts").put(b"content", "text/plain")


NOW = datetime(2026, 12, 2, tzinfo=UTC)


def test_an_imported_tool_output_over_the_inline_limit_is_kept_whole_as_an_artifact(
    tmp_path: Path,
) -> None:
    """Issue 26: importers never cut a long tool output; the publishing step moves it into the
    store (secrets scrubbed) and leaves its start and the handle inline."""
    from streams.importers.base import MAX_SUMMARY_CHARS, ImportedRun
    from streams.importers.publish import keep_outputs

    secret = "AKIA" + "Q7XZ4RT2MB6KLP3W"  # (base32, as AWS key ids are)
    output = "line\n" * 3000 + f"aws_access_key_id={secret}\n" + "tail\n" * 10
    run = ImportedRun("r-1", "fleet-a", "s-1", "test")
    run.add(EntryKind.RUN_STARTED, NOW, "start", [TextPart(text="start")])
    short = ToolResultPart(
        tool_call_id="c1", status=ToolResultStatus.SUCCEEDED, timed_out=False, summary="ok"
    )
    long = short.model_copy(update={"tool_call_id": "c2", "summary": output})
    run.add(EntryKind.TOOL_CALL_RESULT, NOW, "r1", [short], tool_call_id="c1")
    run.add(EntryKind.TOOL_CALL_RESULT, NOW, "r2", [long], tool_call_id="c2")
    store = FileArtifactStore(tmp_path / "store")
    kept = [keep_outputs(e, store) for e in run.entries]
    assert kept[:2] == run.entries[:2]  # nothing long: unchanged
    [part] = kept[2].parts
    assert isinstance(part, ToolResultPart)
    assert len(part.summary) < MAX_SUMMARY_CHARS and secret not in part.summary
    [ref] = part.artifact_refs
    whole = store.get(ref.sha256).decode()
    assert whole.startswith("line\n" * 3000) and whole.endswith("tail\n" * 10)  # nothing cut
    assert secret not in whole and "[REDACTED" in whole
    assert [keep_outputs(e, store) for e in run.entries] == kept  # the same entries again
