"""``agentledger`` write-side commands: topics, simulate, publish, import, otlp, artifact, dlq,
worker (the composition root ``infra.main`` adds them to the command line)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from infra.cli_support import (
    Table,
    bounded,
    check_fleets,
    console,
    err,
    fleet_option,
    print_table,
)
from infra.cli_support import settings as _settings
from infra.settings import Settings
from schemas.errors import AgentLedgerError
from schemas.topics import ledger_topic

commands = typer.Typer()


topics_app = typer.Typer(no_args_is_help=True, help="Ledger and dead-letter topics.")
commands.add_typer(topics_app, name="topics")


@topics_app.command("create")
def topics_create(
    fleet: Annotated[
        list[str] | None,
        typer.Option(
            "--fleet", help="fleet id (repeatable); default: settings", callback=fleet_option
        ),
    ] = None,
) -> None:
    """Create each fleet's ledger and dead-letter topics (idempotent)."""
    from infra.admin import create_fleet_topics_sync

    settings = _settings()
    fleets = fleet or settings.fleet_ids
    from streams.changes import ensure_change_topics, stream_projections

    created = create_fleet_topics_sync(settings, fleets)
    changes = asyncio.run(ensure_change_topics(settings))
    for name in created + changes:
        console.print(f"created {name}")
    console.print(
        f"{len(created)} topics created, fleets: {', '.join(fleets)} (each fleet: a ledger and a "
        f"dead-letter topic, {settings.topic_partitions} partitions, replication "
        f"{settings.topic_replication}, kept forever, zstd; existing topics are left as they are)"
    )
    streamed = stream_projections(settings)
    if streamed:
        console.print(
            f"{len(changes)} change topics created: {settings.topic_prefix}.changes.<projection> "
            f"for {', '.join(streamed)} and the schema topic (same partitions and replication, "
            "compacted: each run's latest state is kept)"
        )


@topics_app.command("list")
def topics_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The fleets that exist (a ledger topic under the prefix): what workers project and
    rebuild, verify and dlq read, whatever AGENTLEDGER_FLEETS names."""
    from infra.admin import existing_fleets

    settings = _settings()
    fleets = asyncio.run(existing_fleets(settings))
    if as_json:
        print(json.dumps({"prefix": settings.topic_prefix, "fleets": fleets}))
        return
    for fleet in fleets:
        console.print(f"{fleet}\t{ledger_topic(settings.topic_prefix, fleet)}")
    configured = [f for f in settings.fleet_ids if f not in fleets]
    console.print(
        f"{len(fleets)} fleets"
        + (f"; configured but without topics: {', '.join(configured)}" if configured else "")
    )


@commands.command("simulate")
def simulate_cmd(
    fleets: Annotated[int, typer.Option(help="number of fleets")] = 2,
    runs: Annotated[int, typer.Option(help="runs per fleet")] = 14,
    seed: Annotated[int, typer.Option(help="same seed, same entries")] = 1,
    entries_per_run: Annotated[
        int | None, typer.Option(help="make every run about this long (30 to 20,000 entries)")
    ] = None,
    length_profile: Annotated[
        str,
        typer.Option(
            help="run lengths: 'short' (~30 entries) or 'real' (as real agents': median 150, "
            "~19% over 500, ~1.3% over 3,000)"
        ),
    ] = "short",
    out: Annotated[Path | None, typer.Option(help="write the JSON form, one per line")] = None,
    publish: Annotated[
        bool, typer.Option("--publish", help="publish to the ledger topics")
    ] = False,
) -> None:
    """Generate deterministic, realistic agent runs (for demos, tests and benchmarks)."""
    from schemas.json_form import to_json_text
    from streams.publisher import AsyncPublisher
    from streams.simulate import LENGTH_PROFILES, simulate

    if (out is None) == (not publish):
        raise typer.BadParameter("give exactly one of --out FILE or --publish")
    if length_profile not in LENGTH_PROFILES:
        raise typer.BadParameter(f"known profiles: {', '.join(LENGTH_PROFILES)}")
    if entries_per_run is not None and not 30 <= entries_per_run <= 20_000:
        raise typer.BadParameter("--entries-per-run takes 30 to 20,000")
    if entries_per_run is not None and length_profile != "short":
        raise typer.BadParameter("give --entries-per-run or --length-profile, not both")
    entries = simulate(
        fleets, runs, seed, entries_per_run=entries_per_run, length_profile=length_profile
    )
    if out is not None:
        with out.open("w") as f:
            for entry in entries:
                f.write(to_json_text(entry) + "\n")
        console.print(f"wrote {len(entries)} entries of {fleets * runs} runs to {out}")
        return

    from infra.admin import create_fleet_topics

    settings = _settings()
    fleet_ids = sorted({e.fleet_id for e in entries})

    async def _publish() -> list[str]:
        # The simulator makes its fleets, so it creates their topics, as `topics create` does.
        created = await create_fleet_topics(settings, fleet_ids)
        async with AsyncPublisher(settings) as publisher:
            for start in range(0, len(entries), 1000):
                await publisher.publish_batch(entries[start : start + 1000])
        return created

    created = asyncio.run(_publish())
    if created:
        console.print(f"created topics {', '.join(created)} (as `topics create` would)")
    console.print(f"published {len(entries)} entries of {fleets * runs} runs")


@commands.command("publish")
def publish_cmd(
    file: Annotated[Path, typer.Argument(help="entries in the JSON form, one per line")],
    partial: Annotated[
        bool,
        typer.Option(
            "--partial", help="send the runs that have no invalid line (default: all or nothing)"
        ),
    ] = False,
) -> None:
    """Publish a JSONL file of entries. The whole file is checked first: an invalid line means
    nothing is sent (or, with --partial, nothing of its run). Sending a file again is harmless:
    entries the ledger already holds are skipped by the projections as duplicates."""
    from streams.publish_file import publish_file

    if not file.is_file():
        raise typer.BadParameter(f"no such file: {file}", param_hint="FILE")
    try:
        report = asyncio.run(publish_file(file, _settings(), partial=partial))
    except AgentLedgerError as exc:
        # One line however long (scripts grep for it; rich would wrap at 80 columns in a pipe),
        # and the message verbatim: it quotes addresses and lists in brackets, not markup.
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(code=1) from None
    for number, reason in report.invalid:
        err.print(f"line {number}: {escape(reason)}")
    for note in report.notes:
        err.print(f"[yellow]note:[/] {escape(note)}")
    fleets = ", ".join(f"{k}={v}" for k, v in sorted(report.by_fleet.items()))
    if report.invalid and not partial:
        console.print(
            f"nothing sent: {len(report.invalid)} invalid lines; fix them and publish the file "
            f"again, or --partial to send the runs without one ({report.held_back} valid "
            f"entries of {len(report.runs_held_back)} runs held back)",
            soft_wrap=True,
        )
        raise typer.Exit(code=2)
    held = (
        f"; {report.held_back} valid entries of {len(report.runs_held_back)} runs with an "
        "invalid line held back"
        if report.held_back
        else ""
    )
    console.print(
        f"published {report.sent} entries ({fleets or 'none'}); "
        f"{len(report.invalid)} invalid lines not sent{held}. Publishing the file again is "
        "harmless: entries already on the ledger are skipped as duplicates",
        soft_wrap=True,
    )
    if report.invalid:
        raise typer.Exit(code=2)


def _verdict_reports(paths: Iterable[Path]) -> list[Path]:
    """The files among ``paths`` that read as SWE-bench reports (found by a user trial: `import
    auto` left them out without saying what they were or how their verdicts go in)."""
    from streams.importers import verdicts
    from streams.importers.base import ImportFormatError

    found = []
    for path in paths:
        try:
            if path.suffix == ".json" and verdicts.read_report(path):
                found.append(path)
        except (ImportFormatError, OSError, ValueError):
            continue
    return found


def _import_verdicts(paths: list[Path], fleet: str | None, as_json: bool) -> None:
    """``import swebench-report``: each report's verdicts appended to the runs they judge."""
    from streams.importers import verdicts
    from streams.importers.base import ImportFormatError
    from streams.importers.publish import send_verdicts

    settings = _settings()
    if fleet is not None:
        fleet_option([fleet])
    files = verdicts.discover(paths)
    if not files:
        raise typer.BadParameter(f"no report files under {', '.join(map(str, paths))}")
    reports: list[dict[str, Any]] = []
    read: list[tuple[Path, list[verdicts.Judged]]] = []
    for number, path in enumerate(files, 1):
        try:
            read.append((path, verdicts.read_report(path)))
        except (ImportFormatError, OSError) as exc:
            why = str(exc) if isinstance(exc, ImportFormatError) else f"{path}: unreadable"
            reports.append({"path": str(path), "error": why, "published": 0})
            if not as_json:
                err.print(f"[{number}/{len(files)}] [red]skipped:[/] {escape(why)}", soft_wrap=True)
    try:  # all files at once: two reports giving one verdict on a run send it once
        done_all = asyncio.run(send_verdicts(settings, [j for _, js in read for j in js], fleet))
    except AgentLedgerError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        if as_json:
            print(json.dumps(reports, indent=2))
        raise typer.Exit(code=1) from None
    at = 0
    for path, judged in read:
        done, at = done_all[at : at + len(judged)], at + len(judged)
        skipped = Counter(j.skip for j in done if j.run_id is None)
        report = {
            "path": str(path),
            "verdicts": len(done),
            "published": sum(j.sent for j in done),
            "already_on_ledger": sum(j.run_id is not None and not j.sent for j in done),
            "resolved": sum(j.resolved for j in done if j.run_id is not None),
            "unresolved": sum(not j.resolved for j in done if j.run_id is not None),
            "skipped": dict(sorted(skipped.items())),
            "judged": [
                {"instance": j.candidates[0], "run_id": j.run_id, "resolved": j.resolved}
                | ({"skipped": j.why} if j.run_id is None else {})
                for j in done
            ],
        }
        reports.append(report)
        if not as_json:
            skips = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
            console.print(
                f"{path.name}: {len(done)} verdicts, {report['published']} published; "
                f"of runs found: {report['resolved']} resolved, {report['unresolved']} "
                f"unresolved, {report['already_on_ledger']} already on the ledger"
                + (f"; skipped: {skips}" if skips else ""),
                soft_wrap=True,
            )
            unmatched = [j for j in done if j.run_id is None]
            for j in unmatched[:5]:
                err.print(f"  skipped: {escape(j.why)}", soft_wrap=True)
            if len(unmatched) > 5:
                err.print(f"  ... and {len(unmatched) - 5} more (--json lists them all)")
    if as_json:
        print(json.dumps(reports, indent=2))
    if any("error" in r or r.get("skipped") for r in reports):
        raise typer.Exit(code=1)


@commands.command("import")
def import_cmd(
    source_format: Annotated[
        str,
        typer.Argument(
            metavar="FORMAT",
            help="the agent's log format: claude-code, codex, openhands, aider, mini-swe-agent, "
            "swe-agent, otel; auto (each file's format recognised by its content, for a folder "
            "of mixed logs); or swebench-report (evaluation verdicts of runs already imported)",
        ),
    ],
    paths: Annotated[list[Path], typer.Argument(help="log files or folders (searched)")],
    fleet: Annotated[
        str | None,
        typer.Option(
            "--fleet", help="the fleet the runs belong to (default: the first configured fleet)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the summaries as JSON")] = False,
    follow_on: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="keep going: tail the files (and new ones under the folders), publishing new "
            "lines as they are written; a restart resumes where the ledger stands",
        ),
    ] = False,
    poll_s: Annotated[
        float, typer.Option("--poll-s", min=0.05, help="with --follow: seconds between looks")
    ] = 0.5,
) -> None:
    """Import real agents' logs as ledger runs: each format's double counts avoided, entry ids
    from the source's own ids. Importing a file again publishes nothing new; an import stopped
    half way resumes where it stopped."""
    from streams.importers import FORMATS, Importer
    from streams.importers.detect import AutoImporter
    from streams.importers.publish import FileImport, FilePublishError, import_paths

    module: Importer | None = AutoImporter() if source_format == "auto" else None
    module = module or FORMATS.get(source_format)
    if module is None and source_format != "swebench-report":
        raise typer.BadParameter(
            f"{source_format!r} is not a format this version imports "
            f"({', '.join([*FORMATS, 'auto', 'swebench-report'])})",
            param_hint="FORMAT",
        )
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise typer.BadParameter(f"no such file or folder: {', '.join(missing)}", param_hint="PATH")
    if module is None:  # swebench-report
        _import_verdicts(paths, fleet, as_json)
        return
    settings = _settings()
    fleet_id = fleet or settings.fleet_ids[0]
    fleet_option([fleet_id])
    if follow_on:
        _follow_imports(settings, module, paths, fleet_id, poll_s, as_json)
        return
    files = module.discover(paths)
    if not files:
        raise typer.BadParameter(f"no {source_format} logs under {', '.join(map(str, paths))}")
    if isinstance(module, AutoImporter) and module.ignored and not as_json:
        reports_among = _verdict_reports(module.ignored)
        err.print(
            f"{len(module.ignored)} files under the folders are no log of a known format "
            "(left out)"
            + (
                f"; {len(reports_among)} of them SWE-bench reports: their verdicts go in by "
                "agentledger import swebench-report PATH, once the runs are imported"
                if reports_among
                else ""
            ),
            soft_wrap=True,
        )
    from projectors.base import fold_all
    from projectors.cost_metrics import FIGURE_FIELDS, CostTotals, known_sum, partly_unknown
    from projectors.pricing import usd_text
    from projectors.registry import all_projections

    [pricing] = [p for p in all_projections(settings) if p.name == "cost-metrics"]
    reports: list[dict[str, Any]] = []
    failed = 0

    def report_file(done: FileImport) -> None:
        nonlocal failed
        number, path = len(reports) + 1, done.path
        if done.error is not None or done.summary is None:
            why = done.error or f"{path}: not imported"
            failed += 1
            reports.append({"path": str(path), "error": why, "published": 0})
            if not as_json:
                err.print(f"[{number}/{len(files)}] [red]skipped:[/] {escape(why)}", soft_wrap=True)
            return
        runs, summary, sent = done.runs, done.summary, done.sent
        priced = [fold_all(pricing, r.entries) for r in runs]
        totals = [s.totals for s in priced if s is not None]
        counts = CostTotals()  # every run's sums and counts of unknowns, added
        for t in totals:
            counts = counts.added(t.__dict__)
        cost, calls = counts.cost_usd, counts.calls
        unpriced, unmetered = counts.unpriced_calls, counts.usage_unknown_calls
        # each count unknown when no call reports it, a lower bound when some do not
        shown_in = known_sum(counts, "input_tokens", summary.input_tokens)
        shown_out = known_sum(counts, "output_tokens", summary.output_tokens)
        # tokens: unknown when the log keeps no usage (and its agent reported no totals), or
        # none of its calls has token counts
        tokens_unknown = (not summary.calls_known and not summary.tokens_reported) or bool(
            calls and shown_in is None and shown_out is None
        )
        bounds = partly_unknown(counts)
        # runs that keep no usage beside runs that do: the file's sums leave them out
        left_out = bool(summary.runs_unmetered and summary.calls_known)
        if left_out:
            bounds = [*bounds, "input_tokens", "output_tokens", "cost"]
        report = summary.as_json() | {
            # priced as the projection will (None: no call, or none could be priced; never $0)
            # (a lower bound when some calls are unpriced or of unknown usage)
            "cost_usd": known_sum(counts, "cost", usd_text(cost)),
            "unpriced_calls": unpriced,
            "usage_unknown_calls": unmetered,
            "provider_reported_cost_usd": known_sum(
                counts,
                "provider_reported_cost",
                usd_text(counts.provider_reported_cost_usd),
            ),
            "partly_unknown": sorted(
                {name for figure in bounds for name in FIGURE_FIELDS[figure]}
                | ({"calls"} if left_out else set())
            ),
            "fleet_id": fleet_id,
            "published": sum(s.sent for s in sent),
            "already_on_ledger": sum(s.already for s in sent),
            "run_ids": [r.run_id for r in runs],
            "run_entries": {r.run_id: len(r.entries) for r in runs},
        }
        if tokens_unknown:
            report.update(input_tokens=None, output_tokens=None)  # never 0
        elif calls:
            report.update(input_tokens=shown_in, output_tokens=shown_out)
        reports.append(report)
        if not as_json:
            skipped = ", ".join(f"{n} {why}" for why, n in sorted(report["skipped"].items()))
            console.print(
                f"[{number}/{len(files)}] {path.name}: {summary.runs} runs, "
                f"{summary.entries} entries "
                f"({report['published']} published, {report['already_on_ledger']} already on "
                f"the ledger), "
                + (
                    f"{'>= ' if left_out else ''}{summary.calls} model calls "
                    f"({summary.duplicate_reports} repeated usage reports not counted"
                    + (
                        f"; {summary.runs_unmetered} runs keep no usage: calls unknown"
                        if left_out
                        else ""
                    )
                    + "), "
                    if summary.calls_known
                    else "model calls unknown (the log keeps no per-call usage), "
                )
                + (
                    "tokens unknown"
                    if tokens_unknown
                    else f"{bounded(shown_in, '{:,}'.format, 'input_tokens' in bounds)} in / "
                    f"{bounded(shown_out, '{:,}'.format, 'output_tokens' in bounds)} out tokens"
                    if calls
                    else f"{summary.input_tokens:,} in / {summary.output_tokens:,} out tokens"
                    + (" (the run totals its agent reported)" if summary.tokens_reported else "")
                )
                + ", cost "
                + (
                    (">= " if unpriced + unmetered or left_out else "") + f"${report['cost_usd']}"
                    if report["cost_usd"] is not None
                    else ("unpriced" if unpriced else "unknown")
                    if calls
                    else "- (no model calls)"
                    if summary.calls_known
                    else "unknown"
                )
                + (f" ({unpriced} calls unpriced)" if unpriced else "")
                + (f" ({unmetered} calls of unknown usage)" if unmetered else "")
                + (f"; skipped: {skipped}" if skipped else ""),
                soft_wrap=True,
            )
            for note in summary.notes:  # what --json has as notes: how the log was read
                console.print(f"  note: {escape(note)}", soft_wrap=True, highlight=False)

    try:
        asyncio.run(import_paths(settings, module, files, fleet_id, report_file))
    except FilePublishError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        if as_json:
            reports.append({"path": str(exc.path), "error": str(exc), "published": 0})
            print(json.dumps(reports, indent=2))
        raise typer.Exit(code=1) from None
    unmapped = sum(r.get("unmapped", 0) for r in reports)
    if as_json:
        print(json.dumps(reports, indent=2))
    else:
        if failed:
            err.print(
                f"{failed} of {len(files)} files skipped (see above)"
                + ("; the others were imported" if failed < len(files) else "")
            )
        if unmapped:
            err.print(
                f"{unmapped} records could not be mapped and were skipped (their reasons are "
                "under 'skipped' above); the rest of their files was imported"
            )
    if failed or unmapped:
        raise typer.Exit(code=1)


@commands.command("otlp")
def otlp_cmd(
    port: Annotated[int, typer.Option(min=1, max=65535, help="OTLP/HTTP port")] = 4318,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    fleet: Annotated[
        str | None, typer.Option("--fleet", help="the fleet (default: the first configured)")
    ] = None,
    run_attribute: Annotated[
        str | None,
        typer.Option(
            "--run-attribute", help="a span or resource attribute naming the run (default: trace)"
        ),
    ] = None,
) -> None:
    """Receive OpenTelemetry GenAI spans over OTLP/HTTP (POST /v1/traces, protobuf or JSON) and
    publish them as ledger entries: a trace is a run, LLM spans model calls (usage taken once,
    from the span that made the call), tool spans tool calls (a failed one's error its result),
    the trace's root span the run's end (OK succeeded, ERROR failed, UNSET unknown); a run on
    the ledger in another fleet is refused, named in OTLP's partial success."""
    from streams.otlp import serve

    settings = _settings()
    fleet_id = fleet or settings.fleet_ids[0]
    fleet_option([fleet_id])
    console.print(f"OTLP/HTTP receiver on http://{host}:{port}/v1/traces (fleet {fleet_id})")
    try:
        asyncio.run(serve(settings, fleet_id, host, port, run_attribute))
    except KeyboardInterrupt:
        console.print("stopped")
    except OSError as exc:
        err.print(f"[red]error:[/] cannot listen on {host}:{port}: {escape(str(exc))}")
        raise typer.Exit(code=1) from None


def _clipped(text: str, limit: int) -> str:
    """``text``, or its start and an ellipsis that says it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _follow_imports(
    settings: Any, module: Any, paths: list[Path], fleet_id: str, poll_s: float, as_json: bool
) -> None:
    """``import --follow``: one line (or JSON object) per file that grew, until interrupted."""
    from streams.importers.base import Summary
    from streams.importers.publish import Sent, follow

    def report(path: Path, summary: Summary | None, sent: list[Sent], why: str | None) -> None:
        published = sum(s.sent for s in sent)
        # why nothing went: a file read whole but refused (its run is in another fleet), or one
        # that cannot be read yet (still being written: it waits)
        refused = why if why is not None and summary is not None else None
        waiting = why if refused is None else None
        if as_json:
            doc = {"path": str(path), "published": published, "waiting": waiting}
            print(json.dumps(doc | ({"error": refused} if refused else {})), flush=True)
        elif refused is not None:
            err.print(f"[red]not sent:[/] {escape(refused)}", soft_wrap=True)
        elif waiting is not None:
            console.print(f"{path.name}: waiting ({escape(waiting)})", soft_wrap=True)
        elif published:
            console.print(f"{path.name}: {published} new entries published", soft_wrap=True)

    if not as_json:
        console.print(f"following {', '.join(map(str, paths))} (Ctrl-C stops)")
    try:
        asyncio.run(follow(settings, module, paths, fleet_id, report, poll_s))
    except KeyboardInterrupt:
        console.print("stopped")
    except AgentLedgerError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(code=1) from None


artifact_app = typer.Typer(
    no_args_is_help=True, help="The artifact store: content too large for an entry."
)
commands.add_typer(artifact_app, name="artifact")


def _sha_argument(value: str) -> str:
    from streams.artifacts import sha256_of

    try:
        return sha256_of(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="SHA") from None


@artifact_app.command("get")
def artifact_get(
    sha: Annotated[
        str,
        typer.Argument(
            help="the artifact's sha256, a unique prefix of it (4+ digits), or its id sha256:<hex>",
            callback=_sha_argument,
        ),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="write it to FILE (default: standard output)")
    ] = None,
) -> None:
    """Read an artifact back from the store (AGENTLEDGER_ARTIFACT_DIR, default
    <state>/artifacts), its sha256 checked; as stored, i.e. with secrets already redacted."""
    import sys

    from streams.artifacts import ArtifactError, FileArtifactStore

    store = FileArtifactStore.from_settings(_settings())
    try:
        data = store.get(store.find(sha))
    except ArtifactError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(code=1) from None
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    out.write_bytes(data)
    err.print(f"wrote {out}: {len(data):,} bytes")


dlq_app = typer.Typer(no_args_is_help=True, help="Dead letters: poison records and their reasons.")
commands.add_typer(dlq_app, name="dlq")


def _fleets(fleet: list[str] | None) -> list[str]:
    """The fleets given (each must exist: :func:`check_fleets`), or every fleet that exists
    (its ledger topic does)."""
    from infra.admin import existing_fleets, existing_fleets_now
    from projectors.stores.postgres_ops import fleets_with_runs

    settings = _settings()
    if fleet:
        check_fleets(
            fleet,
            partial(fleets_with_runs, settings.pg_address),
            partial(existing_fleets_now, settings),
        )
        return fleet
    return asyncio.run(existing_fleets(settings))


@dlq_app.command("list")
def dlq_list(
    fleet: Annotated[
        list[str] | None,
        typer.Option("--fleet", help="fleet id (repeatable)", callback=fleet_option),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show the dead letters of the fleets: source position, run, error class, reason, status."""
    from streams.dlq import dead_letter_rows

    settings = _settings()
    rows = asyncio.run(dead_letter_rows(settings, _fleets(fleet)))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("source topic/partition/offset", "run", "error", "reason", "bytes", "status")
    for r in rows:
        dismissal = r["dismissed"]
        status = (
            f"dismissed: {dismissal['reason']}"
            if isinstance(dismissal, dict)
            else "redriven"
            if r["redriven"]
            else "pending"
        )
        table.add_row(
            str(r["source"]),
            str(r["run_id"] or "?"),
            str(r["error_class"]),
            _clipped(str(r["reason"]), 300),  # whole, folded, unless very long (--json has it)
            f"{r['bytes']} (prefix kept)" if r["truncated"] else str(r["bytes"]),
            status,
        )
    print_table(table)
    pending = sum(1 for r in rows if not r["redriven"] and r["dismissed"] is None)
    console.print(f"{len(rows)} dead letters, {pending} pending")


@dlq_app.command("dismiss")
def dlq_dismiss(
    sources: Annotated[
        list[str], typer.Argument(help="TOPIC/PARTITION/OFFSET of each, as `dlq list` shows")
    ],
    reason: Annotated[str, typer.Option("--reason", help="why it needs nothing more (kept)")],
    fleet: Annotated[
        list[str] | None,
        typer.Option("--fleet", help="fleet id (repeatable)", callback=fleet_option),
    ] = None,
) -> None:
    """Mark dead letters handled, with the reason (kept for audit); redrive then leaves them."""
    from streams.dlq import dismiss, parse_source

    for text in sources:
        parse_source(text)  # malformed: exit 2 before connecting
    if not reason.strip():
        raise typer.BadParameter("say why (it is kept for audit)", param_hint="--reason")
    done = asyncio.run(dismiss(_settings(), _fleets(fleet), sources, reason))
    for text, new in done:
        console.print(f"{text}: {'dismissed' if new else 'already dismissed (first reason kept)'}")


@dlq_app.command("redrive")
def dlq_redrive(
    fleet: Annotated[
        list[str] | None,
        typer.Option("--fleet", help="fleet id (repeatable)", callback=fleet_option),
    ] = None,
) -> None:
    """Send dead letters that decode now back to their source topic (each at most once)."""
    from streams.dlq import redrive

    report = asyncio.run(redrive(_settings(), _fleets(fleet)))
    for letter, reason in report.still_bad:
        err.print(
            f"{letter.source_topic}/{letter.source_partition}/{letter.source_offset}: "
            f"still bad: {escape(reason)}"
        )
    console.print(
        f"redriven {report.redriven}, already redriven {report.already}, "
        f"dismissed {report.dismissed}, still bad {len(report.still_bad)}"
    )


def _claimed_unless_unreachable(settings: Settings) -> None:
    """Refuse (DeploymentMismatchError) a database that holds another deployment; a database
    not answering yet is the faust process's to wait for (it retries, with backoff; it exits
    78 too if the database then holds another deployment, and is not started again)."""
    from infra.errors import DeploymentMismatchError, is_retriable
    from infra.migrate import migrate_and_claim
    from streams.supervisor import EXIT_CONFIG

    try:
        migrate_and_claim(settings.pg_address, settings.topic_prefix)
    except DeploymentMismatchError as exc:
        # exit 78 (misconfigured), which a supervisor does not restart
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(code=EXIT_CONFIG) from None
    except Exception as exc:
        if not is_retriable(exc):
            raise


@commands.command("worker")
def worker(
    loglevel: Annotated[str, typer.Option(help="faust/worker log level")] = "warning",
    projections: Annotated[
        str | None,
        typer.Option(help="all, agent, analytics, or projection names (comma-separated)"),
    ] = None,
    no_restart: Annotated[
        bool,
        typer.Option(
            "--no-restart",
            help="run the faust process itself, without the supervisor that restarts it "
            "(for platforms that supervise: systemd, Kubernetes); it exits non-zero on a "
            "crash or stall",
        ),
    ] = False,
) -> None:
    """Run a projection worker (several form one consumer group and share the partitions).

    By default a supervisor runs the faust process and starts it again whenever it ends
    without being asked to (a crash, a stall, new fleet topics), with backoff."""
    from projectors.registry import selected

    settings = _settings()
    if projections is not None:
        settings = settings.model_copy(update={"worker_projections": projections})
    selected(settings.worker_projections, settings)  # an unknown name: exit 2 before starting
    _claimed_unless_unreachable(settings)  # another deployment's database: exit 1, no restarts
    if no_restart:
        from streams.worker import run_worker

        run_worker(settings, loglevel)
    from streams.supervisor import supervise

    args = ["--loglevel", loglevel]
    if projections is not None:
        args += ["--projections", projections]
    raise typer.Exit(code=supervise(settings, args, settings.worker_projections))
