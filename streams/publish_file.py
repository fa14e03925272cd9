"""``agentledger publish FILE.jsonl``: the whole file is checked first; by default nothing is
sent when a line is invalid (each reported with its reason), with ``partial`` the runs that have
no invalid line are sent. Sending a file again is harmless: what the ledger already holds is a
duplicate the projections skip."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

from infra.settings import Settings
from schemas.errors import LedgerValidationError
from schemas.json_form import from_json_text
from streams.publisher import AsyncPublisher, BrokerUnavailableError, Prepared
from streams.run_fleets import RunFleets, elsewhere_text

BATCH = 500


@dataclass
class PublishReport:
    sent: int = 0
    invalid: list[tuple[int, str]] = field(default_factory=list)
    by_fleet: dict[str, int] = field(default_factory=dict)
    held_back: int = 0  # valid entries not sent: an invalid line in the file (or in their run)
    runs_held_back: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be checked


@dataclass
class _Progress:
    """How far the file got, for the account given when Kafka stops answering."""

    read: int = 0  # valid entries read (and staged) so far
    line: int = 0  # number of the last line read
    sending: int = 0  # entries in the batch being sent (0 between batches)
    eof: bool = False


def _run_of(line: bytes) -> str | None:
    """The run id an invalid line names, when it is JSON at all."""
    try:
        found = json.loads(line)
    except (ValueError, RecursionError):
        return None
    run_id = found.get("run_id") if isinstance(found, dict) else None
    return run_id if isinstance(run_id, str) else None


def _one_fleet_each(
    staged: list[tuple[int, Prepared]], settings: Settings, notes: list[str]
) -> list[tuple[int, str, str]]:
    """``(line, run_id, why)`` of the runs that would be in two fleets: named with two in the
    file (at the first line naming the second), or on the ledger already in another fleet (at
    the run's first line). A run belongs to one fleet; the workers dead-letter entries of a
    run from another fleet's topic, so the publisher refuses them first (found trying the
    product: `publish` said it had sent such a run, and the replays of rebuild and verify then
    chose its fleet by which topic they read first)."""
    first: dict[str, tuple[int, str]] = {}
    refused: dict[str, tuple[int, str]] = {}
    for number, p in staged:
        run_id, fleet = p.entry.run_id, p.entry.fleet_id
        seen = first.setdefault(run_id, (number, fleet))
        if seen[1] != fleet and run_id not in refused:
            refused[run_id] = (
                number,
                f"run {run_id} is in fleet {fleet} here and {seen[1]} on line {seen[0]}: a run "
                "belongs to one fleet",
            )
    fleets = RunFleets(settings)
    try:
        for run_id, there, here in fleets.elsewhere(
            [(r, f) for r, (_n, f) in first.items() if r not in refused]
        ):
            refused[run_id] = (first[run_id][0], elsewhere_text(run_id, there, here))
        if fleets.unanswered:
            notes.append(
                "PostgreSQL did not answer: the runs' fleets on the ledger were not checked (a "
                "worker dead-letters entries of a run from another fleet)"
            )
    finally:
        fleets.close()
    return sorted((n, r, why) for r, (n, why) in refused.items())


async def publish_file(path: Path, settings: Settings, partial: bool = False) -> PublishReport:
    report = PublishReport()
    progress = _Progress()
    try:
        async with AsyncPublisher(settings) as publisher:
            numbered: list[tuple[int, Prepared]] = []
            bad_runs: set[str] = set()
            with path.open("rb") as lines:
                for number, line in enumerate(lines, start=1):
                    progress.line = number
                    if not line.strip():
                        continue
                    try:
                        numbered.append((number, publisher.stage(from_json_text(line))))
                    except LedgerValidationError as exc:
                        report.invalid.append((number, str(exc)))
                        run_id = _run_of(line)
                        if run_id is not None:
                            bad_runs.add(run_id)
            clashes = await asyncio.to_thread(_one_fleet_each, numbered, settings, report.notes)
            for number, run_id, why in clashes:
                report.invalid.append((number, why))
                bad_runs.add(run_id)
            report.invalid.sort()
            staged = [p for _n, p in numbered]
            if report.invalid and not partial:
                report.held_back = len(staged)
                report.runs_held_back = sorted({p.entry.run_id for p in staged})
                return report
            sending = [p for p in staged if p.entry.run_id not in bad_runs]
            report.held_back = len(staged) - len(sending)
            report.runs_held_back = sorted(bad_runs & {p.entry.run_id for p in staged})
            progress.read = len(sending)
            progress.eof = True
            for start in range(0, len(sending), BATCH):
                await _send(publisher, sending[start : start + BATCH], report, progress)
    except BrokerUnavailableError as exc:
        if progress.eof and progress.sending == 0 and report.sent == progress.read:
            return report  # every entry was acknowledged; only the disconnect failed
        raise _stopped(path, settings, report, progress, exc) from exc
    return report


async def _send(
    publisher: AsyncPublisher, batch: list[Prepared], report: PublishReport, progress: _Progress
) -> None:
    if not batch:
        return
    progress.sending = len(batch)
    await publisher.send(batch)
    progress.sending = 0
    report.sent += len(batch)
    for p in batch:
        report.by_fleet[p.entry.fleet_id] = report.by_fleet.get(p.entry.fleet_id, 0) + 1


def _stopped(
    path: Path,
    settings: Settings,
    report: PublishReport,
    progress: _Progress,
    exc: BrokerUnavailableError,
) -> BrokerUnavailableError:
    """The account of a file Kafka cut short, in the file's terms. The advice is the whole file
    again, not its unacknowledged lines: a new run numbers each run's entries from 1, so only the
    complete file passes the sequence check, and what did arrive is skipped as a duplicate."""
    if report.sent == 0 and progress.sending == 0:
        return BrokerUnavailableError(
            f"publishing {path}: nothing was published: {exc}; publish the file again once "
            "Kafka answers"
        )
    acked = report.sent + len(exc.acknowledged)
    not_acked = progress.sending - len(exc.acknowledged)
    rest = "" if progress.eof else f", the lines after line {progress.line} not sent"
    # what Kafka did: refused the sends (and said why), or did not answer
    did = "refused the sends" if exc.refusals else "stopped answering"
    return BrokerUnavailableError(
        f"publishing {path}: Kafka at {settings.kafka_address} {did} "
        f"({exc.cause}): {acked} of the file's {progress.read} entries read so far "
        f"acknowledged, {not_acked} not{rest}; publish the whole file again (entries that did "
        "arrive are skipped as duplicates)",
        acknowledged=exc.acknowledged,
        unacknowledged=exc.unacknowledged,
        cause=exc.cause,
        refusals=exc.refusals,
    )
