"""``agentledger`` read commands: memory, context, timeline, costs, failures, runs, subscribe
(the composition root ``infra.main`` adds them to the command line). Nothing here writes."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Annotated

import typer
from rich.markup import escape

from infra.cli_support import (
    Table,
    check_fleets,
    console,
    err,
    fleet_option,
    print_table,
    terminal_safe,
)
from infra.cli_support import settings as _settings
from infra.settings import Settings
from schemas.models import RunStatus

commands = typer.Typer()


def _run(settings: Settings, run_id: str) -> str:
    """The run a user means: its id, or a prefix only one run id starts with."""
    from consumers.views import resolve_run
    from schemas.errors import NotFoundError

    try:
        return resolve_run(settings, run_id)
    except NotFoundError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(code=1) from None


def fleets_exist(settings: Settings, fleet: str | list[str] | None, strict: bool = True) -> None:
    """:func:`infra.cli_support.check_fleets` over the live builds and the cluster."""
    from infra.admin import existing_fleets_now
    from projectors.stores.postgres_ops import fleets_with_runs

    check_fleets(
        [fleet] if isinstance(fleet, str) else list(fleet or []),
        partial(fleets_with_runs, settings.pg_address),
        partial(existing_fleets_now, settings),
        strict,
    )


@commands.command("memory")
def memory(
    run_id: Annotated[str, typer.Argument(help="the run")],
    at: Annotated[
        int | None, typer.Option("--at", help="as it stood after this sequence", min=0)
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    index: Annotated[
        str | None,
        typer.Option(
            "--index",
            help="a page of the evidence index instead (JSON): entries, tool_calls, artifacts, "
            "created_files, changed_files, recent_files or file_changes",
        ),
    ] = None,
    offset: Annotated[int, typer.Option("--offset", help="with --index: the first member")] = 0,
    limit: Annotated[int, typer.Option("--limit", help="with --index: members a page")] = 1000,
) -> None:
    """A run's evidence-bound working memory (live build), now or after any sequence number.
    --json leaves the evidence index out (it counts its members); --index pages through it."""
    from consumers import queries
    from consumers.render import print_memory
    from schemas.errors import BadArgumentError, NotFoundError

    if index is not None and at is not None:
        raise typer.BadParameter("the index is the live memory's: not with --at", param_hint="--at")
    if index is None and (offset or limit != 1000):
        raise typer.BadParameter("only with --index", param_hint="--offset/--limit")
    settings = _settings()
    run_id = _run(settings, run_id)
    try:
        if index is not None:  # (JSON: --json or not)
            print(json.dumps(queries.memory_index(settings, run_id, index, offset, limit)))
            return
        view = queries.memory_doc(settings, run_id, at)
    except NotFoundError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(code=1) from None
    except BadArgumentError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(code=2) from None
    if as_json:
        print(json.dumps(view, indent=2, default=str))
        return
    print_memory(console, view)


@commands.command("context")
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
    from consumers import queries
    from consumers.render import print_manifest
    from schemas.errors import NotFoundError

    settings = _settings()
    run_id = _run(settings, run_id)
    try:
        doc = queries.manifest(settings, run_id, call)
    except NotFoundError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(code=1) from None
    if doc is None:
        err.print(f"[red]error:[/] run {escape(run_id)} has no next-turn manifest yet")
        raise typer.Exit(code=1)
    if render_it:  # as the model reads it, but what a terminal would obey shown as escapes
        print(terminal_safe(queries.render_manifest(doc)))
    elif as_json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print_manifest(console, doc)


@commands.command("timeline")
def timeline(
    run_id: Annotated[str, typer.Argument(help="the run")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A run's timeline: each step with its time, cost so far and drill-down references."""
    from consumers import queries
    from consumers.render_analytics import print_timeline
    from schemas.errors import NotFoundError

    settings = _settings()
    try:
        doc = queries.timeline(settings, _run(settings, run_id))
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


@commands.command("costs")
def costs(
    by: Annotated[
        str, typer.Option("--by", help="run, fleet, model, purpose, day or day-model")
    ] = "model",
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
    from consumers import queries
    from consumers.analytics import DIMENSIONS, cost_report
    from consumers.render_analytics import print_costs

    dimension = next((d for d in DIMENSIONS if d == by), None)
    if dimension is None:
        raise typer.BadParameter(f"one of {', '.join(DIMENSIONS)}", param_hint="--by")
    fleets_exist(_settings(), fleet)
    if as_json:
        print(json.dumps(queries.costs(_settings(), dimension, fleet, _since(since)), indent=2))
        return
    report = cost_report(_settings(), dimension, fleet, _since(since))
    print_costs(console, report)


@commands.command("failures")
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
    from consumers import queries
    from consumers.analytics import failure_report, run_failure
    from consumers.render_analytics import print_failures, print_run_failure
    from schemas.errors import NotFoundError

    settings = _settings()
    if run_id is not None:
        run = _run(settings, run_id)
        try:
            if as_json:
                print(json.dumps(queries.failure(settings, run, stalled_after), indent=2))
            else:
                print_run_failure(console, run_failure(settings, run, stalled_after))
        except NotFoundError as exc:
            err.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(code=1) from None
        return
    fleets_exist(settings, fleet)
    if as_json:
        found = queries.failures(settings, fleet, _since(since), stalled_after)
        print(json.dumps(found, indent=2))
        return
    report = failure_report(settings, fleet, _since(since), stalled_after)
    print_failures(console, report)


RUN_STATUSES = ("RUNNING", *(status.value for status in RunStatus))


@commands.command("runs")
def runs_cmd(
    fleet: Annotated[
        list[str] | None, typer.Option("--fleet", help="one fleet only", callback=fleet_option)
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
    model: Annotated[
        str | None,
        typer.Option("--model", help="runs with a call of this model (provider/model or model)"),
    ] = None,
    outcome: Annotated[
        str | None,
        typer.Option(help="how runs ended, in the words of the outcome column, e.g. 'timed out'"),
    ] = None,
    repository: Annotated[
        str | None,
        typer.Option(
            "--repo",
            "--repository",
            help="runs whose run-started entry names this repository (as `timeline` shows it)",
        ),
    ] = None,
    sort: Annotated[str, typer.Option(help="last, first, cost, entries or id")] = "last",
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Find runs (live builds): by fleet, status, failure class, time, cost or text."""
    from decimal import InvalidOperation

    from consumers import queries
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
    if outcome is not None and outcome not in queries.OUTCOMES:
        raise typer.BadParameter(f"one of {'; '.join(queries.OUTCOMES)}", param_hint="--outcome")
    filters = queries.RunFilters(
        fleet=fleet[0] if fleet else None,
        status=status.upper() if status else None,
        failure_class=failure_class,
        since=_since(since),
        until=_since(until, "--until"),
        cost_above=cost,
        text=search,
        sort=sort,
        model=model,
        outcome=outcome,
        repository=repository,
    )
    found = queries.runs(_settings(), filters, limit=limit)
    if not found:  # (a fleet of found runs exists: asked only when nothing was found)
        fleets_exist(_settings(), fleet)
    if as_json:
        print(json.dumps(found, indent=2, default=str))
        return
    table = Table(
        "run", "fleet", "outcome", "entries", "last entry", "class", "cost", "conflicts", "task"
    )
    for run in found:
        table.add_row(
            run["run_id"],
            run["fleet_id"],
            run["outcome"],
            str(run["entries"]),
            str(run["last_at"] or "-"),
            run["failure_class"] or "-",
            queries.cost_text(run),
            str(run["conflicting_duplicates"] or "-"),
            (run["task"] or "-")[:60],
        )
    print_table(table)
    console.print(f"{len(found)} runs" + (f" (the first {limit})" if len(found) == limit else ""))


@commands.command("subscribe")
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
    fleets_exist(settings, fleet, strict=False)  # (a fleet may come after its subscriber)
    if from_beginning and from_time:
        raise typer.BadParameter("give at most one of --from-beginning and --from-time")
    start: Start = "beginning" if from_beginning else "now"
    if from_time is not None:
        start = _since(from_time, "--from-time") or start
    try:
        for change in changes(settings, name, start=start, fleet=fleet, idle_timeout_s=idle_exit_s):
            line = change_line(change, as_json)
            print(line if as_json else terminal_safe(line), flush=True)
    except LookupError as exc:
        raise typer.BadParameter(str(exc)) from None
    except KeyboardInterrupt:
        return
