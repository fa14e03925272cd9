"""``agentledger``: the product's single entry point, and the composition root: the one module
that may import every layer (nothing imports it). It assembles the command line from
``streams.cli`` (writes), ``streams.cli_rebuild`` (rebuild, verify, replay packages) and
``consumers.cli`` (reads), and holds what composes several layers: ``infra`` (services up,
down and status with the workers' health), ``bench`` and ``demo``."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from consumers import cli as read_commands
from consumers import mcp_cli as mcp_commands
from consumers.examples.budget_guard import BudgetGuard
from consumers.web import cli as web_commands
from infra import local
from infra.cli_support import Table, console, err, merge, print_table
from infra.cli_support import settings as _settings
from infra.process import is_running
from infra.services import ServiceStatus
from infra.settings import Settings
from schemas.errors import AgentLedgerError, BadArgumentError, NotFoundError
from streams import cli as write_commands
from streams.cli_rebuild import register as register_rebuild
from streams.kafka_logs import hold_back_kafka_floods

app = typer.Typer(
    no_args_is_help=True, help="AgentLedger: the event-sourced ledger for agent fleets."
)
infra_app = typer.Typer(no_args_is_help=True, help="Local Kafka, PostgreSQL and Redis.")
app.add_typer(infra_app, name="infra")


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
    print_table(table)


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
    folder inside the project) with their restarts, every worker's health from PostgreSQL
    (lag per partition, last applied batch), and the entries the live builds have not applied.
    Exit 1 when a worker has applied nothing for longer than AGENTLEDGER_WORKER_STALL_S while
    its partitions have lag, or when entries wait and no worker reports."""
    import asyncio

    from streams.health import (
        GONE_AFTER_S,
        WorkerHealth,
        entries_waiting,
        read_health,
        stalled_workers,
    )

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
    # a row of this host whose faust process is dead or stopped is gone now, not once its row
    # has aged 30 s (found trying the product: `ok, behind 0` for 30-40 s after a SIGKILL)
    here = socket.gethostname()
    health = [
        replace(h, not_running=True)
        if h.worker_id.rpartition(":")[0] == here and not is_running(h.pid)
        else h
        for h in health
    ]
    stall_s = settings.worker_stall_s
    stalled = stalled_workers(health, stall_s)
    # what the live builds have not applied, from Kafka and PostgreSQL themselves (None:
    # unknown, e.g. a service down): a worker gone or never started reports nothing
    waiting: dict[str, int] | None = None
    kafka = next((r for r in rows if r.name == "kafka"), None)
    if pg is not None and pg.running and kafka is not None and kafka.running:
        try:
            waiting = asyncio.run(asyncio.wait_for(entries_waiting(settings), 20))
        except Exception as exc:  # status reports; it does not fail on what it cannot read
            err.print(f"entries waiting unreadable: {escape(type(exc).__name__)}")
    reporting = [w for w in health if not w.gone]
    unapplied = sum(waiting.values()) if waiting else 0
    # entries wait and no worker reports: whatever processes there are (a worker frozen, or
    # not reporting for GONE_AFTER_S, is no worker applying), but one started less than that
    # ago may not have reported yet
    starting = [w for w in workers if _age_s(w.get("started_at")) < GONE_AFTER_S]
    idle = bool(unapplied and not reporting and not starting)
    if as_json:
        doc: dict[str, object] = {r.name: r.as_dict() for r in rows}
        doc["workers"] = workers
        doc["worker_health"] = [w.as_dict(stall_s) for w in health]
        doc["stalled"] = [w.worker_id for w in stalled]
        doc["waiting"] = waiting  # per ledger partition with any; null: unknown
        doc["nothing_applying"] = idle
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
            print_table(table)
        if health:
            table = Table("worker", "group", "state", "behind", "partitions", "last batch")
            for h in health:
                d = h.as_dict(stall_s)
                ago = h.last_applied_s_ago
                table.add_row(
                    h.worker_id,
                    h.group,
                    d["state"],
                    f"{d['behind']:,}" if d["behind"] is not None else "unknown",
                    str(len(h.lag)),
                    "never" if ago is None else f"{ago:.0f}s ago",
                )
            print_table(table)
        console.print(
            "entries the live builds have not applied: unknown"
            if waiting is None
            else f"entries the live builds have not applied: {unapplied:,}"
            + (f" on {len(waiting)} partitions" if waiting else "")
        )
    if idle:
        err.print(
            f"[red]nothing is applying:[/] {unapplied:,} entries wait and no worker reports "
            + (
                f"({len(workers)} worker processes here do not report: frozen, cut off from "
                f"PostgreSQL, for over {GONE_AFTER_S:g}s)"
                if workers
                else "(start one: agentledger worker)"
            )
        )
    if stalled:
        for bad in stalled:
            err.print(
                f"[red]stalled:[/] worker {bad.worker_id} (faust pid {bad.pid}) has applied "
                f"nothing for over "
                f"{stall_s:g}s while {bad.behind:,} entries wait on its partitions"
            )
        raise typer.Exit(code=1)
    if idle:
        raise typer.Exit(code=1)


def _age_s(started_at: object) -> float:
    """Seconds since a worker note's ``started_at`` (``%Y-%m-%dT%H:%M:%SZ``); infinite when
    it has none."""
    try:
        began = datetime.strptime(str(started_at), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return float("inf")
    return (datetime.now(UTC) - began).total_seconds()


merge(app, write_commands.commands)


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
    web: Annotated[
        bool,
        typer.Option(
            "--web",
            help="only the web's figures: runs list over many runs, a big run's page in "
            "Chromium, live rows",
        ),
    ] = False,
    mcp: Annotated[
        bool,
        typer.Option(
            "--mcp",
            help="only the MCP phase: an agent reading through `agentledger mcp` under the hot "
            "path's load, beside the hot path and the Redis read",
        ),
    ] = False,
    seconds: Annotated[
        float | None, typer.Option(help="--mcp: seconds measured (after a 3 s warm-up)", min=1)
    ] = None,
    web_port: Annotated[
        int, typer.Option(help="--web: the port of the bench's `agentledger serve`", min=1)
    ] = 8701,
) -> None:
    """Measure throughput and latency, each beside a baseline measured in the same run."""
    from consumers.mcp_bench import mcp_reader
    from streams.bench import FULL, QUICK, BenchReport, machine_info, mcp_phase, run_bench
    from streams.simulate import LENGTH_PROFILES

    if mix not in LENGTH_PROFILES:
        raise typer.BadParameter(f"known mixes: {', '.join(LENGTH_PROFILES)}")
    if entries is not None and entries < 1000:
        raise typer.BadParameter("--entries takes at least 1,000")
    settings = _settings()
    local.up(settings, Console(quiet=True))
    if web:
        report = BenchReport(machine=machine_info())
        report.settings, report.figures = asyncio.run(_web_bench(settings, quick, web_port))
    elif mcp:
        report = BenchReport(machine=machine_info())
        sizes = QUICK if quick else FULL
        report.settings = {"mcp": True, "hot_rate": sizes.hot_rate, "seconds": seconds}
        report.figures = asyncio.run(mcp_phase(settings, sizes, mcp_reader, seconds))
    else:
        report = asyncio.run(
            run_bench(settings, quick, _budget_guard, mix, entries, mcp_reader=mcp_reader)
        )
    if as_json:
        print(report.as_json())
        return
    table = Table("figure", "value", "baseline (same run)", "ratio")
    for f in report.figures:
        base = f"{f.baseline:,.1f} {f.unit}  ({f.baseline_name})" if f.baseline is not None else "-"
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "-"
        table.add_row(f.name, f"{f.value:,.1f} {f.unit}", base, ratio)
    print_table(table)
    console.print(json.dumps(report.machine))


WEB_SIZES = {  # quick: exercises the code only
    False: {
        "runs": 100_000,
        "seed_runs": 1_000,
        "samples": 100,
        "loads": 20,
        "big": 10_000,
        "live_entries": 160,
    },
    True: {
        "runs": 2_000,
        "seed_runs": 200,
        "samples": 10,
        "loads": 3,
        "big": 1_000,
        "live_entries": 40,
    },
}


async def _web_bench(settings: Settings, quick: bool, port: int) -> tuple[dict[str, Any], Any]:
    """``bench --web``: a private deployment filled by the write side (streams.bench_web), the
    real ``agentledger serve`` process over it, timed by the read side (consumers.web.bench)."""
    import time
    import urllib.request

    from consumers.access import create_token
    from consumers.web import bench as web_bench
    from streams import bench as write_bench
    from streams import bench_web
    from streams.deployment import PrivateDeployment

    sizes = WEB_SIZES[quick]
    chromium = os.environ.get("AGENTLEDGER_CHROMIUM", web_bench.CHROMIUM)
    if not os.path.exists(chromium):
        raise BadArgumentError(f"bench --web needs Chromium at {chromium} (tests/ensure-chromium)")
    fleets = write_bench.FLEETS
    d = PrivateDeployment(settings, "benchweb", fleets, settings.state_dir / "bench")
    await d.create()
    figures: list[Any] = []
    try:
        filled = await bench_web.fill_runs(d.settings, fleets, sizes["runs"], sizes["seed_runs"])
        big = await bench_web.big_run(d.settings, fleets[0], sizes["big"])
        live = bench_web.LiveRun(d.settings, fleets[0], sizes["live_entries"], 10)
        live_run = await live.start()
        token = str(create_token(d.settings, fleets)["token"])
        d.start_process("serve", ["-m", "infra.main", "serve", "--port", str(port)])
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    log = d.log_of("serve")
                    raise RuntimeError(f"the bench's server did not answer; {log}") from None
                await asyncio.sleep(0.2)
        try:
            figures += await asyncio.to_thread(
                web_bench.runs_list,
                d.settings,
                base,
                token,
                fleets,
                web_bench.RUN_QUERIES,
                sizes["samples"],
            )
            figures += await web_bench.big_page(base, token, big, sizes["loads"], chromium)
            figures += await web_bench.live_rows(
                base, token, live_run, live.left(), live.step, chromium
            )
        finally:
            await live.close()
    finally:
        d.drop()
    settings_doc = {
        "web": True,
        "quick": quick,
        **sizes,
        "runs_made": filled.runs,
        "seed_entries": filled.seed_entries,
        "seed_engine_s": round(filled.engine_s, 1),
        "copies_s": round(filled.copy_s, 1),
        "load_average": os.getloadavg(),
    }
    return settings_doc, [write_bench.Figure(*f) for f in figures]


def _budget_guard(settings: Settings) -> BudgetGuard:
    """The bench's budget guard: the example consumer, following changes from now on."""
    return BudgetGuard(settings, start="now", idle_timeout_s=0.5)


merge(app, read_commands.commands)
merge(app, web_commands.commands)
merge(app, mcp_commands.commands)


def web_app(settings: Settings) -> Any:
    """``agentledger serve``'s FastAPI app: the read side's pages and API, given the write
    side's dead letters, dismiss, redrive and builds (composed here, at the edge)."""
    from consumers.web.app import create_app
    from streams.dlq import dead_letter_rows, dismiss, redrive_json
    from streams.rebuild import builds_json

    def dead_letters(fleets: Sequence[str]) -> list[dict[str, Any]]:
        return asyncio.run(dead_letter_rows(settings, fleets))

    def dismiss_one(fleets: Sequence[str], source: str, reason: str) -> bool:
        [(_, done)] = asyncio.run(dismiss(settings, fleets, [source], reason))
        return done

    def replay_package(run_id: str) -> dict[str, Any]:
        from projectors.registry import all_projections
        from streams import replay_package as rp
        from streams.artifacts import FileArtifactStore

        try:
            located, topic = rp.located_run(settings, run_id)
        except rp.ReplayPackageError as exc:
            raise NotFoundError(str(exc)) from None
        store = FileArtifactStore.from_settings(settings)
        return rp.package_doc(located, all_projections(settings), topic, store=store)

    return create_app(
        settings,
        dead_letters,
        dismiss_one,
        lambda: builds_json(settings),
        lambda fleets: asyncio.run(redrive_json(settings, fleets)),
        replay_package,
    )


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on", min=1, max=65535)] = 8700,
) -> None:
    """Serve the JSON API (/api/v1) and the web pages over the live builds (read-only)."""
    import uvicorn

    from consumers.mcp_http import mount as mount_mcp
    from projectors.stores import postgres_ops

    settings = _settings()
    # the address is taken before "serving" is said (found trying the product: a taken port
    # printed "serving http://..." and then failed)
    listening = _listen(host, port)
    app = web_app(settings)
    mount_mcp(app, settings, host)  # the MCP server over streamable HTTP at /mcp
    # every read (a page, an API answer, each poll of a live page's event stream) borrows a
    # pooled connection rather than opening one: opening was most of a quick read's time
    postgres_ops.keep_connections(settings.pg_address)
    # open event streams (a running run's page) get 5 s to end once a stop is asked
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    err.print(f"serving http://{host}:{port}/ (sign in at /login?token=TOKEN)")
    try:
        server.run(sockets=[listening])
    finally:
        postgres_ops.drop_connections(settings.pg_address)


def _listen(host: str, port: int) -> Any:
    """A socket bound to ``host:port``, or an error naming why not (exit 1)."""
    import socket

    sock: socket.socket | None = None
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        if sock is not None:
            sock.close()
        err.print(f"[red]error:[/] cannot listen on {escape(host)}:{port}: {escape(str(exc))}")
        raise typer.Exit(code=1) from None
    return sock


@app.command("demo")
def demo() -> None:
    """Bring the stack up and run the demo pipeline end to end."""
    from consumers.demo import show
    from streams.demo import publish_demo

    settings = _settings()
    local.up(settings, console)
    local.start_worker(settings, console)
    entries, published_at = publish_demo(settings, console)
    show(settings, entries, published_at, console)
    _demo_web(settings, sorted({e.fleet_id for e in entries}))


def _demo_web(settings: Settings, fleets: list[str]) -> None:
    """The web pages of the demo's runs: a background ``agentledger serve`` and the sign-in URL
    of a new admin token for the demo's fleets (``infra down`` stops the server)."""
    from consumers.access import create_token

    port = local.start_server(settings, console)
    token = create_token(settings, fleets, admin=True)["token"]
    console.print(f"web: http://127.0.0.1:{port}/login?token={token}", soft_wrap=True)


register_rebuild(app)


def main() -> None:
    """Every error is one line on stderr: exit 2 for a bad argument, 1 for anything else (set
    AGENTLEDGER_DEBUG=1 to get an unexpected error's traceback)."""

    # the Kafka client's retry floods held back for every command (a user trial: `dlq list` printed
    # 77-148 retry lines in the seconds after a broker died); the worker sets its own level
    hold_back_kafka_floods()
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
