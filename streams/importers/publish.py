"""Publishing imported runs: only what the ledger does not hold yet.

For every run it first reads where the run stands on its ledger partition (its highest sequence
number), then sends the entries after it, in batches, each batch all or nothing. So importing a
file again publishes nothing, and an import stopped half way (or a follower killed and started
again) resumes where the ledger stands: nothing lost, nothing doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from infra.settings import Settings
from schemas.errors import AgentLedgerError
from schemas.models import EntryKind, LedgerEntry, ToolResultPart, validation_error
from streams.artifacts import ArtifactStore, FileArtifactStore, move_part
from streams.importers.base import (
    MAX_SUMMARY_CHARS,
    ImportedRun,
    ImportFormatError,
    Summary,
    mark_unmetered,
)
from streams.importers.verdicts import FORMAT as VERDICTS_FORMAT
from streams.importers.verdicts import Judged, index_runs, match
from streams.publisher import AsyncPublisher
from streams.run_fleets import RunFleets

if TYPE_CHECKING:
    from streams.importers import Importer

BATCH = 500


@dataclass(frozen=True)
class Sent:
    run_id: str
    already: int  # entries the ledger held before
    sent: int


async def publish_runs(
    settings: Settings,
    runs: Sequence[ImportedRun],
    progress: Callable[[Sent], None] | None = None,
) -> list[Sent]:
    """Send each run's entries after the ledger's last one; returns what each run got."""
    if not runs:
        return []
    async with AsyncPublisher(settings) as publisher:
        return await send_new(publisher, runs, progress)


async def send_new(
    publisher: AsyncPublisher,
    runs: Sequence[ImportedRun],
    progress: Callable[[Sent], None] | None = None,
) -> list[Sent]:
    """With a started publisher: each run's entries after the last one the ledger (or this
    publisher, which remembers what it sent) holds."""
    await publisher.resume({(r.fleet_id, r.run_id) for r in runs})
    store = FileArtifactStore.from_settings(publisher.settings)
    out = []
    for run in runs:
        last = publisher.book.last.get(run.run_id, 0)
        todo = [keep_outputs(e, store) for e in run.entries if e.sequence_no > last]
        for start in range(0, len(todo), BATCH):
            await publisher.publish_batch(todo[start : start + BATCH])
        done = Sent(run.run_id, min(last, len(run.entries)), len(todo))
        out.append(done)
        if progress is not None:
            progress(done)
    return out


def keep_outputs(entry: LedgerEntry, store: ArtifactStore) -> LedgerEntry:
    """``entry`` with each tool output over ``MAX_SUMMARY_CHARS`` moved into ``store`` (scanned
    for secrets before it is written), its start and the artifact's handle left inline: a long
    output is kept whole, never cut, and the entry stays small."""
    for index, part in enumerate(entry.parts):
        if isinstance(part, ToolResultPart) and len(part.summary) > MAX_SUMMARY_CHARS:
            entry = move_part(entry, index, store)
    return entry


@dataclass(frozen=True)
class FileImport:
    """One file of an import: its runs, summary and what each run got; or why it was skipped
    (``error``: nothing of it was sent)."""

    path: Path
    runs: list[ImportedRun]
    summary: Summary | None
    sent: list[Sent]
    error: str | None = None


class FilePublishError(AgentLedgerError):
    """Publishing a file's runs failed (the broker, a missing topic): ``cause`` says why; the
    files before it were published, this one may be in part (an import again completes it)."""

    def __init__(self, path: Path, cause: AgentLedgerError) -> None:
        super().__init__(str(cause))
        self.path = path
        self.cause = cause


def read_runs(importer: Importer, path: Path, fleet_id: str) -> FileImport:
    """One file mapped to runs, or the reason it cannot be (a file that cannot be imported is
    skipped with its reason; the others still are)."""
    why: str | None = None
    try:
        runs, summary = importer.import_file(path, fleet_id)
    except ImportFormatError as exc:
        why = str(exc)
    except ValidationError as exc:  # named by field, never by value (it may be a secret)
        why = (
            f"{path}: a record breaks the ledger contract at {validation_error(exc)}; "
            "nothing of this file was sent"
        )
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
        why = f"{path}: not importable as {importer.FORMAT} ({type(exc).__name__})"
    if why is not None:
        return FileImport(path, [], None, [], why)
    mark_unmetered(runs, summary)
    return FileImport(path, runs, summary, [])


async def import_paths(
    settings: Settings,
    importer: Importer,
    paths: Iterable[Path],
    fleet_id: str,
    on_file: Callable[[FileImport], None],
) -> None:
    """``agentledger import``: each file read and its new entries published, in order, by one
    publisher (one connection, and the ledger read once per partition, then only what was
    appended since); ``on_file`` gets each file's outcome as it is done. A publishing failure
    raises :class:`FilePublishError` naming the file."""
    publisher: AsyncPublisher | None = None
    fleets = RunFleets(settings)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(fleets.close)
        for path in paths:
            done = read_runs(importer, path, fleet_id)
            if done.error is None and done.runs:
                elsewhere = fleets.clash(done.runs)
                if elsewhere:
                    done = replace(done, runs=[], error=f"{path}: {elsewhere}; nothing was sent")
            if done.error is None and done.runs:
                try:
                    if publisher is None:
                        publisher = await stack.enter_async_context(AsyncPublisher(settings))
                    done = replace(done, sent=await send_new(publisher, done.runs))
                except AgentLedgerError as exc:
                    raise FilePublishError(path, exc) from exc
            on_file(done)


Report = Callable[[Path, Summary | None, list[Sent], str | None], None]


async def follow(
    settings: Settings,
    importer: Importer,
    paths: Iterable[Path],
    fleet_id: str,
    report: Report,
    poll_s: float = 0.5,
    stop: asyncio.Event | None = None,
    quiet_s: float = 2.0,
    streaming_s: float = 300.0,
) -> None:
    """Tail the files under ``paths`` (new ones included): whenever one grows, import it again
    and publish what the ledger lacks. A partly written last line, or a response whose lines may
    still be coming, waits: until the next pass, or until the file has been quiet for
    ``quiet_s`` (then it is taken as it stands). A response the format marks as unfinished (a
    Claude Code message whose last line has no stop reason yet: a model can think for tens of
    seconds between two lines of one response) waits for its next line however quiet the file
    is, up to ``streaming_s``: taken at the first quiet, its usage was a fraction of the
    response's (a user's follower counted 13 output tokens of 4,509). A restart resumes from
    the ledger itself."""
    roots = list(paths)
    seen: dict[Path, tuple[int, int, bool]] = {}  # size, mtime, imported settled (held back)
    fleets = RunFleets(settings)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(fleets.close)
        publisher = await stack.enter_async_context(AsyncPublisher(settings))
        while stop is None or not stop.is_set():
            for path in importer.discover(roots):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                quiet = time.time() - stat.st_mtime >= quiet_s
                if quiet and _still_streaming(importer, path, stat.st_mtime, streaming_s):
                    quiet = False  # a response still coming: its next line, not the quiet, ends it
                before = seen.get(path)
                unchanged = before is not None and before[:2] == (stat.st_size, stat.st_mtime_ns)
                if unchanged and not (before is not None and before[2] and quiet):
                    continue  # nothing new, and nothing held back that may go now
                settled = not quiet
                try:
                    runs, summary = importer.import_file(path, fleet_id, settled=settled)
                except ImportFormatError as exc:  # e.g. a JSON document still being written
                    report(path, None, [], str(exc))
                    continue
                mark_unmetered(runs, summary)
                elsewhere = fleets.clash(runs) if runs else ""
                if elsewhere:  # (said once per change of the file, as any error here)
                    seen[path] = (stat.st_size, stat.st_mtime_ns, False)
                    report(path, summary, [], f"{path}: {elsewhere}; nothing was sent")
                    continue
                sent = await send_new(publisher, runs)
                seen[path] = (stat.st_size, stat.st_mtime_ns, settled)
                report(path, summary, sent, None)
            if stop is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll_s)
            else:
                await asyncio.sleep(poll_s)


def _still_streaming(importer: Importer, path: Path, mtime: float, streaming_s: float) -> bool:
    """Whether ``path`` ends in a response its format marks as unfinished (the importer's
    ``still_streaming``, when it has one), written to less than ``streaming_s`` ago."""
    unfinished = getattr(importer, "still_streaming", None)
    if unfinished is None or time.time() - mtime >= streaming_s:
        return False
    return bool(unfinished(path))


def index_names(index: Mapping[str, list[str]], judged: Judged) -> bool:
    """Whether any of the verdict's names names a run of ``index`` (when no one run was matched:
    it names several, whatever other fleets hold)."""
    return any(name in index for name in judged.candidates)


@dataclass(frozen=True)
class Judgement:
    """What became of one verdict: the run it was sent to (None: skipped, with ``why``)."""

    candidates: tuple[str, ...]
    resolved: bool
    run_id: str | None
    sent: bool
    why: str = ""
    skip: str = ""  # why not, in a word: "no run for the instance", "ambiguous instance"...


async def send_verdicts(
    settings: Settings, judged: Sequence[Judged], fleet: str | None = None
) -> list[Judgement]:
    """Append each verdict to the run it names (found in the live run-stats build, of ``fleet``
    if given) as the run's next entry; a verdict the run already holds (or that an earlier one
    of ``judged`` gives it) is not sent again. One judgement per verdict, in order."""
    from projectors.stores import postgres_ops as ops

    with ops.connect(settings.pg_address) as conn:
        every = ops.live_run_ends(conn)
        runs = {r: end for r, end in every.items() if fleet is None or end[0] == fleet}
        index = index_runs(runs)
        others = index_runs(every) if fleet is not None else {}  # to say where a run is
        out: list[Judgement] = []
        todo: dict[str, LedgerEntry] = {}  # entry id -> the verdict entry to send
        for j in judged:
            run_id, why = match(j.candidates, index)
            if run_id is None:
                several = index_names(index, j)
                kind = "ambiguous instance" if several else "no run for the instance"
                other, _ = match(j.candidates, others) if not several else (None, "")
                if other is not None:  # (found trying the product: "no run" was all it said)
                    there = every[other][0]
                    kind = "run in another fleet"
                    why = (
                        f"instance {j.candidates[0]} is run {other} of fleet {there}, not "
                        f"{fleet}; none was judged (give --fleet {there})"
                    )
                out.append(Judgement(j.candidates, j.verdict.resolved, None, False, why, kind))
                continue
            fleet_id, last_at = runs[run_id]
            run = ImportedRun(run_id, fleet_id, j.candidates[0], VERDICTS_FORMAT)
            # the run's last time, or (a run whose log keeps no times) now: either way a
            # stand-in, which the entry's metadata says
            stand_in = "the run's last" if last_at is not None else "the time of the import"
            entry = run.add(
                EntryKind.VERIFIER_RESULT,
                last_at or datetime.now(UTC),
                j.verdict.source_id(),
                j.verdict.parts(),
                metadata={"import.time": f"unknown: the report keeps no time; {stand_in}"},
            )
            fresh = entry.entry_id not in todo and not ops.run_holds_entry(
                conn, run_id, entry.entry_id
            )
            if fresh:
                todo[entry.entry_id] = entry
            out.append(Judgement(j.candidates, j.verdict.resolved, run_id, fresh))
    if todo:
        async with AsyncPublisher(settings) as publisher:
            await publisher.resume({(e.fleet_id, e.run_id) for e in todo.values()})
            for entry in todo.values():
                seq = publisher.book.last.get(entry.run_id, 0) + 1
                await publisher.publish(entry.model_copy(update={"sequence_no": seq}))
    return out
