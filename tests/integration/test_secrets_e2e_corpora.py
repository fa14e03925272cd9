"""Secrets end to end, issue 27: the Nosey Parker examples the detector catches in context, and
their values repeated in names, on the real stack.

Every example of ``tests/data/secrets/noseyparker.jsonl`` that :mod:`streams.secret_eval` finds
redacted in context (the whole tuning corpus, not a sample: 288 of 299) is written, as its
authors wrote it, into the free text of eight entries (user task, tool call request and result,
diff, verifier result, error, approval request, memory proposal), and its value alone into the
names of the same entries: ``actor.id``, ``tool_name``, a diff's file path, ``check_id``,
``error.category`` and ``signature``, a metadata value and the strings of a JSON text. Each run
also has a tool output over the entry limit holding all of its examples, which the publisher
moves to the artifact store. The files are published with ``agentledger publish``, a worker
folds them into every projection (its relay sends the change outbox), and then not one value is
found in: the ledger and change topics (every record's raw key, value and headers), ``pg_dump``
of the private database, Redis (every key and value of its prefix), the artifact store's files,
the publisher's output, the worker's log, and the read commands (``runs``, ``timeline``,
``memory``, ``context``, ``context --render``, ``costs``, ``failures``, ``replay-package``).
Secrets in ids are refused by design (``test_secrets_e2e``), so none is put in an id here.

Also searched, on disk: **PostgreSQL's data files** (after a ``CHECKPOINT``: every file of the
deployment's database directory, heap, indexes and TOAST relations, and the WAL segments written
during the test), with every text, jsonb and bytea column of its tables set to ``STORAGE
EXTERNAL`` before anything is written, so a stored value is its own bytes rather than pglz/lz4
output (the test checks that no stored value is compressed), and each TOAST relation read back
chunk by chunk and joined, so a value cut at a chunk's edge is found too; **Kafka's log
segments** (every file of the deployment's topic-partition directories but the offset and time
indexes, raw, and every record batch in them decompressed: the topics are zstd, so raw bytes
alone would prove nothing); and the **services' own logs** (Kafka's, PostgreSQL's, Redis's),
from where they stood when the test began. Redis keeps nothing on disk here (no RDB, no
AOF): its keys are read instead.

Three examples are written only in free text, not in names: their Nosey Parker capture is part
of what the detector matched (the hex after Mailgun's ``key-``, a WireGuard key without its
``=``, a JWT's first segment), and the copy pass redacts the value it found, so the part alone in
another field is not recognised. The test checks that exactly these are the ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cramjam
import psycopg
import pytest
import redis
from psycopg import sql

from infra.settings import Settings
from projectors.registry import GROUPS, NAMES
from schemas.factory import digest, sample_entry
from schemas.json_form import to_json
from schemas.models import (
    Actor,
    ActorType,
    DiffFile,
    DiffPart,
    EntryKind,
    ErrorPart,
    FileChangeStatus,
    FileClassification,
    JsonPart,
    MemoryProposalPart,
    PermissionClass,
    ProposedFact,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    ToolResultStatus,
    VerificationPart,
    VerificationStatus,
)
from schemas.topics import change_schema_topic, change_topic, dead_letter_topic, ledger_topic
from streams.redaction import redact_entry
from streams.secret_eval import Case, as_text, as_tool_output, load, strings, survives
from streams.source import read_all
from tests.integration.test_secrets_e2e import (
    MARKER,
    OUTCOMES,
    Corpus,
    Deployment,
    Searcher,
    _finish,
    _name,
    _output,
    _pg_dump,
    _redis_dump,
    _Run,
    _search_cli,
    _search_dump,
    _search_topics,
    _start,
    _wait_applied,
    _wait_redis,
)
from tests.secrets.corpus import Secret

pytestmark = pytest.mark.integration

FLEETS = ["fleet-01", "fleet-02"]
RUNS = 3
LIMIT = 32 * 1024  # the entry limit: each run's long tool output goes to the artifact store
# The Nosey Parker capture is part of the detector's match: redacted in context, not known alone.
PARTIAL = {"np.aws.4", "np.mailgun.1", "np.wireguard.1"}


def _names_entry(case: Case) -> object:
    """The example in text and its value in every name field of one entry."""
    v = _name(case.secret)
    parts = (
        TextPart(text=case.example),
        ToolCallPart(
            tool_call_id="call-1",
            tool_name=v,
            permission_class=PermissionClass.EXECUTE_SAFE,
            arguments_hash=digest(v),
            started_at=sample_entry(EntryKind.USER_TASK).occurred_at,
        ),
        ErrorPart(category=v, message="x", signature=v),
        JsonPart(json_text=json.dumps({"x": v, "args": [v]})),  # no key that names a secret
    )
    return sample_entry(
        EntryKind.USER_TASK,
        parts=parts,
        actor=Actor(type=ActorType.USER, id=v),
        metadata={"note": v},
    )


def caught_cases() -> tuple[list[Case], set[str]]:
    """The Nosey Parker examples redacted in context, and the rules of those whose value alone
    survives in names beside them (in-process, before anything is published)."""
    cases = [
        c
        for c in load("noseyparker")
        if not survives(c.secret, as_text(c.example))
        and not survives(c.secret, as_tool_output(c.example))
    ]
    partial = set()
    for c in cases:
        redacted = redact_entry(_names_entry(c))  # type: ignore[arg-type]
        if any(c.secret in s for s in strings(to_json(redacted))):
            partial.add(c.rule)
            continue
        # and entry by entry as the test publishes them: one entry that holds the value in a
        # JSON text under a key ("token": <value>) redacts its copies in that entry only
        probe = _Run(Corpus(), "np-probe", FLEETS[0], 100)
        _carry(probe, 0, c, True)
        for entry in probe.b.entries:
            if any(c.secret in s for s in strings(to_json(redact_entry(entry)))):
                partial.add(c.rule)
                break
    return cases, partial


def _carry(r: _Run, k: int, case: Case, names: bool) -> None:
    """Case ``k``'s example in the free text of eight entries, its value in their names."""
    t = case.example
    v = case.secret if names else f"plain-{k}"
    n = _name(v)
    rid = r.run_id
    task = r.add(
        EntryKind.USER_TASK,
        [TextPart(text=t)],
        actor=Actor(type=ActorType.USER, id=n),
        metadata={"note": v, "scope": "src/"},
    )
    call_id = f"{rid}-np-{k}"
    request = r.add(
        EntryKind.TOOL_CALL_REQUEST,
        [
            ToolCallPart(
                tool_call_id=call_id,
                tool_name=n,
                permission_class=PermissionClass.EXECUTE_SAFE,
                arguments_hash=digest(t),
                started_at=r.next_time(),
                finished_at=r.next_time(1),
            ),
            TextPart(text=t),
        ],
        tool_call_id=call_id,
    )
    r.add(
        EntryKind.TOOL_CALL_RESULT,
        [
            ToolResultPart(
                tool_call_id=call_id,
                status=ToolResultStatus.FAILED,
                exit_code=1,
                timed_out=False,
                summary=t,
            )
        ],
        parent=request,
        tool_call_id=call_id,
    )
    files = (
        DiffFile(
            path=n,
            status=FileChangeStatus.MODIFIED,
            lines_added=2,
            lines_deleted=1,
            classification=FileClassification.CONFIG,
        ),
    )
    r.add(
        EntryKind.DIFF_SNAPSHOT,
        [DiffPart(files=files, workspace_tree_hash=f"{rid}-t{k}"), TextPart(text=t)],
    )
    r.add(
        EntryKind.VERIFIER_RESULT,
        [
            VerificationPart(
                verifier="pytest", profile="unit", status=VerificationStatus.FAILED, check_id=n
            ),
            TextPart(text=t),
        ],
    )
    r.add(EntryKind.ERROR_EVENT, [ErrorPart(category=n, message=t, signature=n)])
    doc = {"command": t, "token": v, "args": [v, {"again": v}]}
    r.add(EntryKind.APPROVAL_REQUEST, [JsonPart(json_text=json.dumps(doc))])
    fact = ProposedFact(fact=t, evidence_refs=(f"entry:{task.entry_id}",))
    r.add(EntryKind.MEMORY_UPDATE_PROPOSED, [MemoryProposalPart(facts=(fact,))])


def _big_output(r: _Run, cases: list[Case]) -> None:
    """A tool output over the entry limit holding every example of the run: the publisher
    redacts it, then moves it to the artifact store."""
    lines = [f"tests/test_config.py::test_case_{i} FAILED" for i in range(2000)]
    for i, c in enumerate(cases):
        lines.insert(1 + i * 2000 // max(len(cases), 1), c.example)
    output = "\n".join(lines)
    assert len(output.encode()) > 2 * LIMIT
    call_id = f"{r.run_id}-big"
    request = r.add(
        EntryKind.TOOL_CALL_REQUEST,
        [
            ToolCallPart(
                tool_call_id=call_id,
                tool_name="run_tests",
                permission_class=PermissionClass.EXECUTE_SAFE,
                arguments_hash=digest(call_id),
                started_at=r.next_time(),
                finished_at=r.next_time(1),
            )
        ],
        tool_call_id=call_id,
    )
    r.add(
        EntryKind.TOOL_CALL_RESULT,
        [
            ToolResultPart(
                tool_call_id=call_id,
                status=ToolResultStatus.FAILED,
                exit_code=1,
                timed_out=False,
                summary=output,
            )
        ],
        parent=request,
        tool_call_id=call_id,
    )


def build(cases: list[Case], partial: set[str]) -> Corpus:
    corpus = Corpus()
    for i in range(RUNS):
        chunk = list(range(i, len(cases), RUNS))
        r = _Run(corpus, f"np-run-{i:02d}", FLEETS[i % len(FLEETS)], 200 + i)
        _start(r, "Rotate the credentials leaked in the config")
        for k in chunk:
            _carry(r, k, cases[k], cases[k].rule not in partial)
        _big_output(r, [cases[k] for k in chunk])
        _finish(r, *OUTCOMES[i % len(OUTCOMES)])
        r.close()
    return corpus


# --------------------------------------------------------------------------- on disk


def _uncompressed_storage(dsn: str) -> list[tuple[str, str]]:
    """Store every text, jsonb and bytea column of the database's tables uncompressed
    (``STORAGE EXTERNAL``: inline or TOASTed, never pglz/lz4), so the data files hold each
    value's own bytes. Returns the (table, column) pairs, all of the database's varlena columns."""
    query = (
        "SELECT c.oid::regclass::text, a.attname FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
        "AND n.nspname NOT LIKE 'pg_toast%' AND a.attnum > 0 AND NOT a.attisdropped "
        "AND a.attlen = -1 ORDER BY 1, 2"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        columns = [(str(t), str(c)) for t, c in conn.execute(query).fetchall()]
        for table, column in columns:
            conn.execute(
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STORAGE EXTERNAL").format(
                    sql.SQL(table), sql.Identifier(column)
                )
            )
    return columns


def _compressed_values(dsn: str, columns: list[tuple[str, str]]) -> int:
    """Stored values PostgreSQL compressed anyway (0 means the raw search saw plain bytes)."""
    total = 0
    with psycopg.connect(dsn) as conn:
        for table, column in columns:
            row = conn.execute(
                sql.SQL(
                    "SELECT count(*) FROM {} WHERE pg_column_compression({}) IS NOT NULL"
                ).format(sql.SQL(table), sql.Identifier(column))
            ).fetchone()
            total += int(row[0]) if row else 0
    return total


def _pg_files(admin_dsn: str, db: str, since: float) -> tuple[Path, list[Path]]:
    """After a CHECKPOINT: every file of the database's directory and the WAL written since."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        (wal_compression,) = conn.execute("SHOW wal_compression").fetchone() or ("",)
        assert wal_compression == "off", "full-page images in the WAL would be compressed"
        (data,) = conn.execute("SHOW data_directory").fetchone() or ("",)
        row = conn.execute("SELECT oid FROM pg_database WHERE datname = %s", (db,)).fetchone()
    assert row is not None
    root = Path(str(data))
    files = [p for p in sorted((root / "base" / str(row[0])).rglob("*")) if p.is_file()]
    wal = [p for p in sorted((root / "pg_wal").glob("0*")) if p.stat().st_mtime >= since - 1]
    return root, files + wal


def _toast_values(dsn: str) -> Iterator[tuple[str, bytes]]:
    """Each TOAST relation of the database read back and each value's chunks joined."""
    query = (
        "SELECT c.oid::regclass::text, c.reltoastrelid::regclass::text FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.reltoastrelid <> 0 "
        "AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
    )
    with psycopg.connect(dsn) as conn:
        for table, toast in conn.execute(query).fetchall():
            rows = conn.execute(
                sql.SQL("SELECT chunk_id, chunk_data FROM {} ORDER BY chunk_id, chunk_seq").format(
                    sql.SQL(str(toast))
                )
            ).fetchall()
            values: dict[int, list[bytes]] = {}
            for chunk_id, data in rows:
                values.setdefault(int(chunk_id), []).append(bytes(data))
            yield f"{table} ({toast})", b"\n\x00\n".join(b"".join(v) for v in values.values())


_CODECS = {
    1: lambda b: zlib.decompress(b, 16 + zlib.MAX_WBITS),
    2: lambda b: bytes(cramjam.snappy.decompress_raw(b)),
    3: lambda b: bytes(cramjam.lz4.decompress(b)),
    4: lambda b: bytes(cramjam.zstd.decompress(b)),
}


def _segment_batches(segment: bytes) -> Iterator[bytes]:
    """The records of each batch of a Kafka log segment (format v2), decompressed."""
    pos = 0
    while pos + 61 <= len(segment):
        (length,) = struct.unpack_from(">i", segment, pos + 8)
        end = pos + 12 + length
        if length < 49 or end > len(segment):
            break
        (attributes,) = struct.unpack_from(">h", segment, pos + 21)
        assert segment[pos + 16] == 2, "a log segment batch of an old format"
        payload = segment[pos + 61 : end]
        codec = attributes & 7
        yield _CODECS[codec](payload) if codec else payload
        pos = end


def _kafka_segments(data: Path, prefix: str) -> list[Path]:
    """Every file of the deployment's topic-partition directories but the offset and time
    indexes (offsets and file positions only, preallocated to 10 MiB each)."""
    dirs = [d for d in sorted(data.iterdir()) if d.is_dir() and d.name.startswith(f"{prefix}.")]
    skip = {".index", ".timeindex"}
    return [f for d in dirs for f in sorted(d.iterdir()) if f.is_file() and f.suffix not in skip]


def _service_logs(state: Path) -> dict[Path, int]:
    """The services' log files and their sizes now (searched later from there on)."""
    paths = [state / "kafka" / "kafka.log", state / "postgres" / "postgres.log"]
    paths += [state / "redis" / "redis.log", *sorted((state / "kafka" / "logs").glob("*"))]
    return {p: p.stat().st_size for p in paths if p.is_file()}


def _local(path: Path) -> bool:
    """Whether the services run here (their files can be read); in CI they must."""
    if path.is_dir():
        return True
    assert not os.environ.get("CI"), f"{path} is not on this machine"
    return False


@pytest.fixture
def deployment(services: Settings, tmp_path: Path) -> Iterator[Deployment]:
    env = {
        "AGENTLEDGER_MAX_ENTRY_BYTES": str(LIMIT),
        "AGENTLEDGER_ARTIFACT_DIR": str(tmp_path / "artifacts"),
    }
    d = Deployment(services, "npsecrets", FLEETS, tmp_path / "logs", env)
    asyncio.run(d.create())
    yield d
    d.drop()


def _outbox(d: Deployment) -> int:
    with psycopg.connect(d.settings.pg_address) as conn:
        row = conn.execute("SELECT count(*) FROM al_changes").fetchone()
    assert row is not None
    return int(row[0])


def test_no_caught_example_or_its_copies_in_names_reaches_any_store_or_output(
    deployment: Deployment, tmp_path: Path
) -> None:
    d = deployment
    started = time.monotonic()
    began = time.time()
    logs_before = _service_logs(d.settings.state_dir)
    columns = _uncompressed_storage(d.settings.pg_address)
    assert len(columns) >= 20, "the deployment's text and jsonb columns"
    cases, partial = caught_cases()
    assert len(cases) >= 280, "the detector's in-context recall on its tuning corpus"
    assert partial == PARTIAL, "the values alone in names that a copy does not catch"
    secrets = [Secret(c.rule, c.secret, c.example) for c in cases]
    searcher = Searcher(secrets)
    planted = b"\n".join(f"<{s.value}>".encode() for s in secrets)
    assert searcher.find(planted) == list(range(len(secrets))), "the search finds each value"
    corpus = build(cases, partial)
    leaks: list[tuple[str, str]] = []

    # 1. published with the CLI, one file per fleet side by side
    files = []
    for fleet in FLEETS:
        path = tmp_path / f"np-{fleet}.jsonl"
        lines = [
            line for line in corpus.lines if corpus.fleets[json.loads(line)["run_id"]] == fleet
        ]
        path.write_text("\n".join(lines) + "\n")
        files.append(path)
    with ThreadPoolExecutor(2) as pool:
        published = list(pool.map(lambda p: d.cli("publish", str(p)), files))
    for path, proc in zip(files, published, strict=True):
        out = _output(proc)
        code = proc.returncode
        assert code == 0, f"{path.name}: {searcher.scrub(out.decode())[-2000:]}"
        leaks += _search_cli(searcher, f"publish {path.name}", out)
    expected = dict(corpus.runs)

    # 2. a worker folds everything; its relay sends the change outbox
    d.start_worker("w")
    d.wait_partitions("w")
    _wait_applied(d, expected, searcher, timeout_s=180)
    _wait_redis(d, expected, timeout_s=30)
    deadline = time.monotonic() + 60
    while _outbox(d) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _outbox(d) == 0, "the relay did not send the change outbox"
    applied_s = time.monotonic() - started

    # 3. the read commands: every run's timeline and rendered context, the rest on two runs
    runs = sorted(expected)
    commands: list[tuple[str, ...]] = []
    for run_id in runs:
        commands += [("timeline", run_id, "--json"), ("context", run_id, "--render")]
    for run_id in runs[:2]:
        commands += [
            ("memory", run_id, "--json"),
            ("failures", run_id, "--json"),
            ("context", run_id, "--json"),
        ]
    commands += [
        ("memory", runs[0]),
        ("timeline", runs[0]),
        ("runs", "--json"),
        ("costs", "--by", "run", "--json"),
        ("failures", "--json"),
        ("replay-package", runs[0], "--out", str(tmp_path / "package")),
    ]
    with ThreadPoolExecutor(3) as pool:
        outputs = dict(zip(commands, pool.map(lambda c: d.cli(*c), commands), strict=True))
    for command, proc in outputs.items():
        label = " ".join(command).replace(str(tmp_path), "TMP")
        out = _output(proc)
        code = proc.returncode
        assert code == 0, f"{label}: {searcher.scrub(out.decode())[-1500:]}"
        leaks += _search_cli(searcher, label, out)
    package = [p for p in sorted((tmp_path / "package").rglob("*")) if p.is_file()]
    assert any(p.parent.name == "artifacts" for p in package), "the stored output is packed"
    for path in package:
        leaks += searcher.search("cli", f"replay-package/{path.name}", path.read_bytes())
    unmarked = [
        c for c in commands if c[0] == "timeline" and MARKER.encode() not in outputs[c].stdout
    ]
    assert not unmarked, f"no {MARKER} marker in {unmarked}"

    # 4. Kafka: ledger, dead-letter and change topics, raw bytes of every record
    prefix = d.settings.topic_prefix
    ledger = [ledger_topic(prefix, f) for f in FLEETS]
    letters = [dead_letter_topic(prefix, f) for f in FLEETS]
    changes = [change_topic(prefix, p) for p in NAMES] + [change_schema_topic(prefix)]
    records = asyncio.run(read_all(d.settings.kafka_address, ledger))
    assert len(records) == sum(expected.values())
    dead = asyncio.run(read_all(d.settings.kafka_address, letters))
    assert not dead, "dead letters"
    changed = asyncio.run(read_all(d.settings.kafka_address, changes))
    assert {r.topic for r in changed} >= {change_topic(prefix, p) for p in NAMES}
    leaks += _search_topics(searcher, [*records, *changed])
    # 5. PostgreSQL, Redis, the artifact store, the worker's log
    dump = _pg_dump(d.settings.pg_address)
    leaks += _search_dump(searcher, "pg_dump", dump)
    client = redis.Redis.from_url(d.settings.redis_address)
    try:
        dumped = _redis_dump(client, d.settings.redis_prefix)
    finally:
        client.close()
    assert len(dumped) >= len(expected) * len(GROUPS["agent"])
    for key, blob in sorted(dumped.items()):
        leaks += searcher.search("redis", key, blob)
    stored = [p for p in sorted((tmp_path / "artifacts").rglob("*")) if p.is_file()]
    assert len(stored) >= RUNS, "each run's long output went to the store"
    for path in stored:
        leaks += searcher.search("artifacts", path.name, path.read_bytes())
    leaks += searcher.search("log", "worker", d.log_of("w").read_bytes())
    marker = MARKER.encode()
    assert marker in dump and any(marker in b for b in dumped.values())
    assert any(marker in p.read_bytes() for p in stored)
    assert any(marker in (r.value or b"") for r in changed)

    # 6. on disk: PostgreSQL's data files (and TOAST values joined), Kafka's log segments (raw
    # and decompressed), the services' logs since the test began
    on_disk: dict[str, int] = {}
    assert _compressed_values(d.settings.pg_address, columns) == 0, "values stored compressed"
    root, pg_files = _pg_files(d.admin_dsn, d.db, began)
    if _local(root):
        for path in pg_files:
            leaks += searcher.search("pg-files", str(path.relative_to(root)), path.read_bytes())
        joined = b"".join(p.read_bytes() for p in pg_files)
        assert marker in joined, "the data files hold the redacted entries"
        on_disk["pg_files"] = len(pg_files)
    toasted = 0
    toast_marker = False
    for where, blob in _toast_values(d.settings.pg_address):
        toasted += blob.count(b"\n\x00\n") + 1 if blob else 0
        toast_marker |= marker in blob
        leaks += searcher.search("pg-toast", where, blob)
    assert toasted and toast_marker, "TOASTed values hold redacted entries"
    on_disk["toast_values"] = toasted
    kafka_data = d.settings.state_dir / "kafka" / "data"
    if _local(kafka_data):
        segments = _kafka_segments(kafka_data, prefix)
        batches = 0
        decoded_marker = False
        for path in segments:
            raw = path.read_bytes()
            where = f"{path.parent.name}/{path.name}"
            leaks += searcher.search("kafka-files", where, raw)
            if path.suffix == ".log":
                for batch in _segment_batches(raw):
                    batches += 1
                    decoded_marker |= marker in batch
                    leaks += searcher.search("kafka-files", f"{where} (decompressed)", batch)
        assert decoded_marker and batches >= len(ledger), "the segments were decoded"
        on_disk |= {"kafka_files": len(segments), "kafka_batches": batches}
    logs_after = _service_logs(d.settings.state_dir)
    for path, size in sorted(logs_after.items()):
        start = logs_before.get(path, 0)
        with path.open("rb") as log:
            log.seek(start if size >= start else 0)  # a rotated log: all of it
            leaks += searcher.search("service-logs", path.name, log.read())
    on_disk["service_logs"] = len(logs_after)

    elapsed = time.monotonic() - started
    print(
        f"\nNosey Parker e2e: {len(cases)} examples ({len(cases) - len(partial)} also in names) "
        f"in {sum(expected.values())} entries of {len(expected)} runs; {len(stored)} artifacts; "
        f"{len(records)} ledger and {len(changed)} change records; bytes searched: "
        f"{dict(searcher.bytes_searched)}; on disk {on_disk}; applied {applied_s:.1f} s, "
        f"total {elapsed:.1f} s"
    )
    assert not leaks, f"{len(set(leaks))} hits (rule @ where): {sorted(set(leaks))[:60]}"
