"""``agentledger``: the product's single entry point."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections import Counter
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from consumers.cli_rebuild import register as register_rebuild
from infra import local
from infra.services import ServiceStatus
from infra.settings import Settings, load_settings
from schemas.errors import AgentLedgerError, BadArgumentError
from schemas.models import FLEET_ID_PATTERN, FLEET_ID_RULE, RunStatus

app = typer.Typer(
    no_args_is_help=True, help="AgentLedger: the event-sourced ledger for agent fleets."
)
infra_app = typer.Typer(no_args_is_help=True, help="Local Kafka, PostgreSQL and Redis.")
app.add_typer(infra_app, name="infra")

console = Console(stderr=False)
err = Console(stderr=True, soft_wrap=True)  # one line per message, however long


def _settings() -> Settings:
    return load_settings()


def _run(settings: Settings, run_id: str) -> str:
    """The run a user means: its id, or a prefix only one run id starts with."""
    from consumers.views import NotFoundError, resolve_run

    try:
        return resolve_run(settings, run_id)
    except NotFoundError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(code=1) from None


def _fleet_option(values: list[str] | None) -> list[str] | None:
    """--fleet values, each checked against the fleet id rules before anything connects."""
    for value in values or []:
        if not re.fullmatch(FLEET_ID_PATTERN, value):
            raise typer.BadParameter(
                f"{value!r} is not valid: {FLEET_ID_RULE}", param_hint="--fleet"
            )
    return values


def _print_status(rows: list[ServiceStatus], as_json: bool) -> None:
    if as_json:
        print(json.dumps({r.name: r.as_dict() for r in rows}, indent=2))
        return
    table = Table("service", "state", "address", "pid", "managed")
    for r in rows:
        state = "[green]running[/]" if r.running else "[red]stopped[/]"
        table.add_row(
            r.name, state, r.address, str(r.pid or "-"), "local" if r.managed else "external"
        )
    console.print(table)


@infra_app.command("up")
def infra_up() -> None:
    """Start local Kafka, PostgreSQL and Redis (idempotent; external ones are left alone)."""
    rows = local.up(_settings(), console)
    _print_status(rows, as_json=False)


@infra_app.command("down")
def infra_down(
    purge: Annotated[bool, typer.Option("--purge", help="also delete their data")] = False,
) -> None:
    """Stop the local services cleanly; data is kept unless --purge."""
    local.down(_settings(), console, purge=purge)


@infra_app.command("status")
def infra_status(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Say what runs where: the services, the project's running workers (found from any
    folder inside the project) with their restarts, and every worker's health from
    PostgreSQL (lag per partition, last applied batch). Exit 1 when a worker has applied
    nothing for longer than AGENTLEDGER_WORKER_STALL_S while its partitions have lag."""
    from streams.health import WorkerHealth, read_health, stalled_workers

    settings = _settings()
    rows = local.status(settings, console)
    workers = local.running_workers(settings)
    health: list[WorkerHealth] = []
    pg = next((r for r in rows if r.name == "postgres"), None)
    if pg is not None and pg.running:
        try:
            health = read_health(settings.pg_address)
        except Exception as exc:  # status reports; it does not fail on a table it cannot read
            err.print(f"worker health unreadable: {escape(type(exc).__name__)}")
    stall_s = settings.worker_stall_s
    stalled = stalled_workers(health, stall_s)
    if as_json:
        doc: dict[str, object] = {r.name: r.as_dict() for r in rows}
        doc["workers"] = workers
        doc["worker_health"] = [w.as_dict(stall_s) for w in health]
        doc["stalled"] = [w.worker_id for w in stalled]
        print(json.dumps(doc, indent=2))
    else:
        _print_status(rows, as_json=False)
        if not workers:
            console.print(f"no workers running here (state: {settings.state_dir})")
        else:
            table = Table("worker pid", "faust pid", "projections", "restarts", "last exit")
            for w in workers:
                table.add_row(
                    str(w["pid"]),
                    str(w.get("child_pid") or "-"),
                    str(w["projections"]),
                    str(w.get("restarts", 0)),
                    str(w.get("last_exit") or "-"),
                )
            console.print(table)
        if health:
            table = Table("worker", "group", "state", "behind", "partitions", "last batch")
            for h in health:
                d = h.as_dict(stall_s)
                ago = h.last_applied_s_ago
                table.add_row(
                    h.worker_id,
                    h.group,
                    d["state"],
                    f"{h.behind:,}" if h.lag else "unknown",
                    str(len(h.lag)),
                    "never" if ago is None else f"{ago:.0f}s ago",
                )
            console.print(table)
    if stalled:
        for bad in stalled:
            err.print(
                f"[red]stalled:[/] worker {bad.worker_id} (faust pid {bad.pid}) has applied "
                f"nothing for over "
                f"{stall_s:g}s while {bad.behind:,} entries wait on its partitions"
            )
        raise typer.Exit(code=1)


topics_app = typer.Typer(no_args_is_help=True, help="Ledger and dead-letter topics.")
app.add_typer(topics_app, name="topics")


@topics_app.command("create")
def topics_create(
    fleet: Annotated[
        list[str] | None,
        typer.Option(
            "--fleet", help="fleet id (repeatable); default: settings", callback=_fleet_option
        ),
    ] = None,
) -> None:
    """Create each fleet's ledger and dead-letter topics (idempotent)."""
    from streams.admin import create_fleet_topics_sync

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
    from streams.admin import existing_fleets

    settings = _settings()
    fleets = asyncio.run(existing_fleets(settings))
    if as_json:
        print(json.dumps({"prefix": settings.topic_prefix, "fleets": fleets}))
        return
    for fleet in fleets:
        console.print(f"{fleet}\t{settings.topic_prefix}.ledger.{fleet}")
    configured = [f for f in settings.fleet_ids if f not in fleets]
    console.print(
        f"{len(fleets)} fleets"
        + (f"; configured but without topics: {', '.join(configured)}" if configured else "")
    )


@app.command("simulate")
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

    from streams.admin import create_fleet_topics

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


@app.command("publish")
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


def _import_verdicts(paths: list[Path], fleet: str | None, as_json: bool) -> None:
    """``import swebench-report``: each report's verdicts appended to the runs they judge."""
    from streams.importers import verdicts
    from streams.importers.base import ImportFormatError
    from streams.importers.publish import send_verdicts

    settings = _settings()
    if fleet is not None:
        _fleet_option([fleet])
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
        skipped = Counter(
            "no run for the instance" if "no run" in j.why else "ambiguous instance"
            for j in done
            if j.run_id is None
        )
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


@app.command("import")
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
    _fleet_option([fleet_id])
    if follow_on:
        _follow_imports(settings, module, paths, fleet_id, poll_s, as_json)
        return
    files = module.discover(paths)
    if not files:
        raise typer.BadParameter(f"no {source_format} logs under {', '.join(map(str, paths))}")
    if isinstance(module, AutoImporter) and module.ignored and not as_json:
        err.print(
            f"{len(module.ignored)} files under the folders are no log of a known format "
            "(left out)",
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
        cost = sum((t.cost_usd for t in totals), Decimal(0))
        unpriced = sum(t.unpriced_calls for t in totals)
        unmetered = sum(t.usage_unknown_calls for t in totals)
        calls = sum(t.calls for t in totals)
        counts = CostTotals(
            calls=calls,
            unpriced_calls=unpriced,
            usage_unknown_calls=unmetered,
            reported_calls=sum(t.reported_calls for t in totals),
        )
        # tokens: unknown when the log keeps no usage, or none of its calls has token counts
        tokens_unknown = not summary.calls_known or (calls and unmetered >= calls)
        report = summary.as_json() | {
            # priced as the projection will (None: no call, or none could be priced; never $0)
            # (a lower bound when some calls are unpriced or of unknown usage)
            "cost_usd": known_sum(counts, "cost", usd_text(cost)),
            "unpriced_calls": unpriced,
            "usage_unknown_calls": unmetered,
            "provider_reported_cost_usd": known_sum(
                counts,
                "provider_reported_cost",
                usd_text(sum((t.provider_reported_cost_usd for t in totals), Decimal(0))),
            ),
            "partly_unknown": [
                name for figure in partly_unknown(counts) for name in FIGURE_FIELDS[figure]
            ],
            "fleet_id": fleet_id,
            "published": sum(s.sent for s in sent),
            "already_on_ledger": sum(s.already for s in sent),
            "run_ids": [r.run_id for r in runs],
            "run_entries": {r.run_id: len(r.entries) for r in runs},
        }
        if tokens_unknown:
            report.update(input_tokens=None, output_tokens=None)  # never 0
        reports.append(report)
        if not as_json:
            skipped = ", ".join(f"{n} {why}" for why, n in sorted(report["skipped"].items()))
            console.print(
                f"[{number}/{len(files)}] {path.name}: {summary.runs} runs, "
                f"{summary.entries} entries "
                f"({report['published']} published, {report['already_on_ledger']} already on "
                f"the ledger), "
                + (
                    f"{summary.calls} model calls ({summary.duplicate_reports} repeated usage "
                    "reports not counted), "
                    if summary.calls_known
                    else "model calls unknown (the log keeps no usage), "
                )
                + (
                    "tokens unknown"
                    if tokens_unknown
                    else f"{summary.input_tokens:,} in / {summary.output_tokens:,} out tokens"
                )
                + ", cost "
                + (
                    (">= " if unpriced + unmetered else "") + f"${report['cost_usd']}"
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
                f"{failed} of {len(files)} files skipped (see above); the others were imported"
            )
        if unmapped:
            err.print(
                f"{unmapped} records could not be mapped and were skipped (their reasons are "
                "under 'skipped' above); the rest of their files was imported"
            )
    if failed or unmapped:
        raise typer.Exit(code=1)


@app.command("otlp")
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
    from the span that made the call), tool spans tool calls."""
    from streams.otlp import serve

    settings = _settings()
    fleet_id = fleet or settings.fleet_ids[0]
    _fleet_option([fleet_id])
    console.print(f"OTLP/HTTP receiver on http://{host}:{port}/v1/traces (fleet {fleet_id})")
    try:
        asyncio.run(serve(settings, fleet_id, host, port, run_attribute))
    except KeyboardInterrupt:
        console.print("stopped")
    except OSError as exc:
        err.print(f"[red]error:[/] cannot listen on {host}:{port}: {escape(str(exc))}")
        raise typer.Exit(code=1) from None


def _follow_imports(
    settings: Any, module: Any, paths: list[Path], fleet_id: str, poll_s: float, as_json: bool
) -> None:
    """``import --follow``: one line (or JSON object) per file that grew, until interrupted."""
    from streams.importers.base import Summary
    from streams.importers.publish import Sent, follow

    def report(path: Path, summary: Summary | None, sent: list[Sent], waiting: str | None) -> None:
        published = sum(s.sent for s in sent)
        if as_json:
            doc = {"path": str(path), "published": published, "waiting": waiting}
            print(json.dumps(doc), flush=True)
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
app.add_typer(artifact_app, name="artifact")


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
app.add_typer(dlq_app, name="dlq")


def _fleets(fleet: list[str] | None) -> list[str]:
    """The fleets given, or every fleet that exists (its ledger topic does)."""
    if fleet:
        return fleet
    from streams.admin import existing_fleets

    return asyncio.run(existing_fleets(_settings()))


@dlq_app.command("list")
def dlq_list(
    fleet: Annotated[
        list[str] | None,
        typer.Option("--fleet", help="fleet id (repeatable)", callback=_fleet_option),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show the dead letters of the fleets: source position, run, error class, reason, status."""
    from schemas.codec import LedgerCodec
    from streams.dlq import dismissed_sources, read_dead_letters, redriven_sources, run_of

    settings = _settings()
    letters = asyncio.run(read_dead_letters(settings, _fleets(fleet)))
    done = asyncio.run(redriven_sources(settings))
    dismissed = asyncio.run(dismissed_sources(settings))
    codec = LedgerCodec()
    rows = []
    for d in letters:
        handled = dismissed.get(d.source)
        rows.append(
            {
                "source": f"{d.source_topic}/{d.source_partition}/{d.source_offset}",
                "run_id": run_of(d, codec),
                "error_class": d.error_class,
                "reason": d.message,
                "bytes": d.size,
                "truncated": d.truncated,
                "redriven": d.source in done,
                "dismissed": None
                if handled is None
                else {"reason": handled[0], "at": handled[1].isoformat()},
            }
        )
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
            str(r["reason"])[:80],
            f"{r['bytes']} (prefix kept)" if r["truncated"] else str(r["bytes"]),
            status,
        )
    console.print(table)
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
        typer.Option("--fleet", help="fleet id (repeatable)", callback=_fleet_option),
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
        typer.Option("--fleet", help="fleet id (repeatable)", callback=_fleet_option),
    ] = None,
) -> None:
    """Send dead letters that decode now back to their source topic (each at most once)."""
    from streams.dlq import redrive

    report = asyncio.run(redrive(_settings(), _fleets(fleet)))
    for letter, reason in report.still_bad:
        err.print(
            f"{letter.source_topic}/{letter.source_partition}/{letter.source_offset}: "
            f"still undecodable: {escape(reason)}"
        )
    console.print(
        f"redriven {report.redriven}, already redriven {report.already}, "
        f"dismissed {report.dismissed}, still bad {len(report.still_bad)}"
    )


@app.command("worker")
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
    if no_restart:
        from streams.worker import run_worker

        run_worker(settings, loglevel)
    from streams.supervisor import supervise

    args = ["--loglevel", loglevel]
    if projections is not None:
        args += ["--projections", projections]
    raise typer.Exit(code=supervise(settings, args, settings.worker_projections))


@app.command("bench")
def bench(
    quick: Annotated[
        bool, typer.Option("--quick", help="small N: exercises the code only")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    mix: Annotated[
        str, typer.Option(help="run lengths of the traffic: 'real' (as real agents') or 'short'")
    ] = "real",
    entries: Annotated[
        int | None, typer.Option(help="entries for the ingest and rebuild figures")
    ] = None,
) -> None:
    """Measure throughput and latency, each beside a baseline measured in the same run."""
    from streams.bench import run_bench
    from streams.simulate import LENGTH_PROFILES

    if mix not in LENGTH_PROFILES:
        raise typer.BadParameter(f"known mixes: {', '.join(LENGTH_PROFILES)}")
    if entries is not None and entries < 1000:
        raise typer.BadParameter("--entries takes at least 1,000")
    settings = _settings()
    local.up(settings, Console(quiet=True))
    report = asyncio.run(run_bench(settings, quick, mix, entries))
    if as_json:
        print(report.as_json())
        return
    table = Table("figure", "value", "baseline (same run)", "ratio")
    for f in report.figures:
        base = f"{f.baseline:,.1f} {f.unit}  ({f.baseline_name})" if f.baseline is not None else "-"
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "-"
        table.add_row(f.name, f"{f.value:,.1f} {f.unit}", base, ratio)
    console.print(table)
    console.print(json.dumps(report.machine))


@app.command("memory")
def memory(
    run_id: Annotated[str, typer.Argument(help="the run")],
    at: Annotated[int | None, typer.Option("--at", help="as it stood after this sequence")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A run's evidence-bound working memory (live build), now or after any sequence number."""
    from consumers.render import print_memory
    from consumers.views import NotFoundError, history_at, live_state

    settings = _settings()
    run_id = _run(settings, run_id)
    try:
        if at is None:
            view = live_state(settings, "working-memory", run_id)
        else:
            view = history_at(settings, "working-memory", run_id, "snapshot", at)
    except NotFoundError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(code=1) from None
    if as_json:
        print(json.dumps(view, indent=2, default=str))
        return
    print_memory(console, view)


@app.command("context")
def context(
    run_id: Annotated[str, typer.Argument(help="the run")],
    call: Annotated[
        str | None, typer.Option("--call", help="a model call's entry id: what that call saw")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    render_it: Annotated[
        bool, typer.Option("--render", help="the sectioned, trust-wrapped context it describes")
    ] = False,
) -> None:
    """A run's next-turn context manifest, or the manifest recorded for one model call."""
    from consumers.render import print_manifest
    from consumers.views import NotFoundError, history_row, live_state
    from projectors.context_manifests import ContextManifest, render, resolve_manifest

    settings = _settings()
    run_id = _run(settings, run_id)
    try:
        if call is None:
            view = live_state(settings, "context-manifests", run_id)
            doc = view["state"]["next_turn"]
        else:
            row = history_row(settings, "context-manifests", run_id, "manifest", call)["state"]

            def fetch(key: str) -> dict[str, Any] | None:
                try:
                    found = history_row(settings, "context-manifests", run_id, "manifest", key)
                except NotFoundError:
                    return None
                state: dict[str, Any] = found["state"]
                return state

            doc = resolve_manifest(row, fetch)
    except NotFoundError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(code=1) from None
    if doc is None:
        err.print(f"[red]error:[/] run {escape(run_id)} has no next-turn manifest yet")
        raise typer.Exit(code=1)
    if render_it:
        print(render(ContextManifest.model_validate(doc)))
    elif as_json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print_manifest(console, doc)


@app.command("timeline")
def timeline(
    run_id: Annotated[str, typer.Argument(help="the run")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A run's timeline: each step with its time, cost so far and drill-down references."""
    from consumers.analytics import run_timeline
    from consumers.render_analytics import print_timeline
    from consumers.views import NotFoundError

    settings = _settings()
    try:
        doc = run_timeline(settings, _run(settings, run_id))
    except NotFoundError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(code=1) from None
    if as_json:
        print(json.dumps(doc, indent=2, default=str))
        return
    print_timeline(console, doc)


def _since(value: str | None, option: str = "--since") -> datetime | None:
    from consumers.analytics import parse_since

    if value is None:
        return None
    try:
        return parse_since(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


@app.command("costs")
def costs(
    by: Annotated[str, typer.Option("--by", help="run, fleet, model, purpose or day")] = "model",
    fleet: Annotated[str | None, typer.Option("--fleet", help="one fleet only")] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="calls made at or after this time (each call's own timestamp, not the publish "
            "time): an ISO date (midnight UTC) or date-time (UTC without an offset)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Model-call tokens and cost rolled up by run, fleet, model, purpose or day (live build)."""
    from consumers.analytics import DIMENSIONS, cost_report
    from consumers.render_analytics import print_costs

    dimension = next((d for d in DIMENSIONS if d == by), None)
    if dimension is None:
        raise typer.BadParameter(f"one of {', '.join(DIMENSIONS)}", param_hint="--by")
    report = cost_report(_settings(), dimension, fleet, _since(since))
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
        return
    print_costs(console, report)


@app.command("failures")
def failures(
    run_id: Annotated[
        str | None, typer.Argument(help="explain this run instead of counting all")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="runs whose last entry is at or after an ISO date/time"),
    ] = None,
    fleet: Annotated[str | None, typer.Option("--fleet", help="one fleet only")] = None,
    stalled_after: Annotated[
        float,
        typer.Option(
            "--stalled-after",
            help="minutes without news before an unfinished run counts as stalled",
        ),
    ] = 30.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Runs by failure class and fleet (final, provisional, stalled), or why one run failed."""
    from consumers.analytics import failure_report, run_failure
    from consumers.render_analytics import print_failures, print_run_failure
    from consumers.views import NotFoundError

    settings = _settings()
    if run_id is not None:
        try:
            found = run_failure(settings, _run(settings, run_id), stalled_after)
        except NotFoundError as exc:
            err.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(code=1) from None
        if as_json:
            print(json.dumps(found.as_json(), indent=2))
        else:
            print_run_failure(console, found)
        return
    report = failure_report(settings, fleet, _since(since), stalled_after)
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
        return
    print_failures(console, report)


RUN_STATUSES = ("RUNNING", *(status.value for status in RunStatus))


@app.command("runs")
def runs_cmd(
    fleet: Annotated[
        list[str] | None, typer.Option("--fleet", help="one fleet only", callback=_fleet_option)
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(help="RUNNING (not finished yet) or a final status, e.g. FAILED"),
    ] = None,
    failure_class: Annotated[
        str | None, typer.Option("--class", help="a failure class, e.g. tool_error")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="runs with entries at or after an ISO date or date-time")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="runs that began before an ISO date or date-time")
    ] = None,
    cost_above: Annotated[
        str | None, typer.Option("--cost-above", help="USD; runs without a known cost never match")
    ] = None,
    search: Annotated[
        str | None,
        typer.Option("--search", help="text in the task, the failure explanation or open problems"),
    ] = None,
    sort: Annotated[str, typer.Option(help="last, first, cost, entries or id")] = "last",
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Find runs (live builds): by fleet, status, failure class, time, cost or text."""
    from decimal import Decimal, InvalidOperation

    from consumers.views import find_runs
    from projectors.stores.postgres_ops import RUN_SORTS

    if status is not None and status.upper() not in RUN_STATUSES:
        raise typer.BadParameter(f"one of {', '.join(RUN_STATUSES)}", param_hint="--status")
    if sort not in RUN_SORTS:
        raise typer.BadParameter(f"one of {', '.join(RUN_SORTS)}", param_hint="--sort")
    cost = None
    if cost_above is not None:
        try:
            cost = Decimal(cost_above)
        except InvalidOperation:
            raise typer.BadParameter("a number of USD", param_hint="--cost-above") from None
    if fleet is not None and len(fleet) > 1:
        raise typer.BadParameter("one fleet", param_hint="--fleet")
    found = find_runs(
        _settings(),
        fleet=fleet[0] if fleet else None,
        status=status.upper() if status else None,
        failure_class=failure_class,
        since=_since(since),
        until=_since(until, "--until"),
        cost_above=cost,
        text=search,
        sort=sort,
        limit=limit,
    )
    for run in found:
        run["status"] = run["status"] or "RUNNING"
    if as_json:
        print(json.dumps(found, indent=2, default=str))
        return
    table = Table(
        "run", "fleet", "outcome", "entries", "last entry", "class", "cost", "conflicts", "task"
    )
    for run in found:
        if run["cost_usd"] is None:  # never $0
            cost_text = "unpriced" if run["unpriced_calls"] else "unknown"
        else:
            bound = ">= " if run["cost_partly_unknown"] else ""
            cost_text = f"{bound}${run['cost_usd']:.4f}"
            if run["unpriced_calls"]:
                cost_text += f" + {run['unpriced_calls']} unpriced"
            if run["usage_unknown_calls"]:
                cost_text += f" + {run['usage_unknown_calls']} of unknown usage"
        table.add_row(
            run["run_id"],
            run["fleet_id"],
            run["outcome"],
            str(run["entries"]),
            str(run["last_at"] or "-"),
            run["failure_class"] or "-",
            cost_text,
            str(run["conflicting_duplicates"] or "-"),
            (run["task"] or "-")[:60],
        )
    console.print(table)
    console.print(f"{len(found)} runs" + (f" (the first {limit})" if len(found) == limit else ""))


@app.command("subscribe")
def subscribe_cmd(
    projection: Annotated[str, typer.Argument(help="the projection whose changes to follow")],
    from_beginning: Annotated[
        bool,
        typer.Option("--from-beginning", help="every run's current state first, then changes"),
    ] = False,
    from_time: Annotated[
        str | None,
        typer.Option("--from-time", help="changes committed since (ISO time or date, UTC)"),
    ] = None,
    fleet: Annotated[str | None, typer.Option("--fleet", help="only this fleet's runs")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    idle_exit_s: Annotated[
        float | None, typer.Option("--idle-exit", help="stop after this many idle seconds")
    ] = None,
) -> None:
    """Print a projection's committed changes as they come (Ctrl-C stops)."""
    from consumers.subscribe import Start, change_line, changes
    from projectors.registry import projection as find_projection

    settings = _settings()
    name = find_projection(projection, settings).name
    if from_beginning and from_time:
        raise typer.BadParameter("give at most one of --from-beginning and --from-time")
    start: Start = "beginning" if from_beginning else "now"
    if from_time is not None:
        start = _since(from_time, "--from-time") or start
    try:
        for change in changes(settings, name, start=start, fleet=fleet, idle_timeout_s=idle_exit_s):
            print(change_line(change, as_json), flush=True)
    except LookupError as exc:
        raise typer.BadParameter(str(exc)) from None
    except KeyboardInterrupt:
        return


@app.command("demo")
def demo() -> None:
    """Bring the stack up and run the demo pipeline end to end."""
    from consumers.demo import run_demo

    run_demo(_settings(), console)


register_rebuild(app)


def main() -> None:
    """Every error is one line on stderr: exit 2 for a bad argument, 1 for anything else (set
    AGENTLEDGER_DEBUG=1 to get an unexpected error's traceback)."""

    # typer carries its own copy of click: its usage errors are BadParameter's bases
    bases = typer.BadParameter.__mro__
    usage_error: type[Exception] = next(c for c in bases if c.__name__ == "UsageError")
    click_error: type[Exception] = next(c for c in bases if c.__name__ == "ClickException")
    try:
        code = app(standalone_mode=False)
    except usage_error as exc:  # a bad or missing argument or option, an unknown command
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "agentledger"
        message = exc.format_message()  # type: ignore[attr-defined]
        if message:  # (a command group given no command has printed its help)
            err.print(f"[red]error:[/] {escape(message)} (see {where} --help)", soft_wrap=True)
        raise SystemExit(2) from None
    except click_error as exc:
        err.print(f"[red]error:[/] {escape(exc.format_message())}", soft_wrap=True)  # type: ignore[attr-defined]
        raise SystemExit(exc.exit_code) from None  # type: ignore[attr-defined]
    except typer.Abort:
        err.print("[red]aborted[/]")
        raise SystemExit(1) from None
    except BadArgumentError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise SystemExit(2) from None
    except AgentLedgerError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise SystemExit(1) from None
    except Exception as exc:
        if os.environ.get("AGENTLEDGER_DEBUG"):
            raise
        err.print(
            f"[red]error:[/] unexpected {type(exc).__name__}: {escape(str(exc))} "
            "(AGENTLEDGER_DEBUG=1 shows where)",
            soft_wrap=True,
        )
        raise SystemExit(1) from None
    if isinstance(code, int) and code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
