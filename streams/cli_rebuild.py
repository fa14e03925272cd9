"""``agentledger rebuild | verify | replay-package``: regenerate projections from the topics."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from infra.cli_support import Table, print_table
from infra.migrate import migrate_and_claim
from infra.settings import Settings, load_settings
from projectors.cost_metrics import shown_state
from projectors.registry import NAMES, all_projections, projection
from streams.rebuild import (
    BuildInfo,
    RebuildError,
    Start,
    Verdict,
    builds_json,
    create_build,
    drop,
    find_build,
    list_builds,
    live_offsets,
    run_build,
    swap,
    verify,
)
from streams.source import Progress

console = Console()
err = Console(stderr=True, soft_wrap=True)  # one line per message, however long
PROJECTIONS = ", ".join(NAMES)


def _progress(label: str) -> Callable[[Progress], None]:
    def report(p: Progress) -> None:
        eta = f"{p.eta_s:,.0f} s" if p.eta_s is not None else "-"
        err.print(
            f"{label}: {p.done:,}/{p.total:,} entries, {p.rate:,.0f}/s, lag {p.lag:,}, ETA {eta}"
        )

    return report


def _start(from_beginning: bool, from_offset: str | None, from_time: str | None) -> Start:
    chosen = [x for x in (from_beginning, from_offset, from_time) if x]
    if len(chosen) > 1:
        raise RebuildError("give one of --from-beginning, --from-offset, --from-time")
    if from_offset:
        return Start("offsets", from_offset)
    if from_time:
        return Start("time", from_time)
    return Start()


def _table(builds: list[BuildInfo], settings: Settings) -> Table:
    table = Table(
        "projection", "build", "live", "version", "inputs", "start", "runs", "behind live"
    )
    live: dict[str, dict[tuple[str, int], int] | None] = {}
    for b in builds:
        if b.projection not in live:
            try:
                live[b.projection] = live_offsets(settings, b.projection)[1]
            except RebuildError:
                live[b.projection] = None
        positions = live[b.projection]
        behind = "-" if positions is None else f"{b.behind(positions):,}"
        inputs = ", ".join(f"{k}={v}" for k, v in b.inputs.items() if k != "context_budget")
        table.add_row(
            b.projection,
            b.build,
            "[green]live[/]" if b.live else "",
            str(b.version),
            inputs or "-",
            b.start or "beginning",
            f"{b.runs:,}",
            behind,
        )
    return table


def register(app: typer.Typer) -> None:
    @app.command("rebuild")
    def rebuild(
        what: Annotated[
            str, typer.Argument(help=f"a projection ({PROJECTIONS}), or: list | swap | drop")
        ],
        build: Annotated[
            str | None, typer.Argument(help="PROJECTION/BUILD (or BUILD), for swap and drop")
        ] = None,
        from_beginning: Annotated[bool, typer.Option("--from-beginning")] = False,
        from_offset: Annotated[
            str | None,
            typer.Option("--from-offset", help="N, or [topic:]partition=offset,..."),
        ] = None,
        from_time: Annotated[
            str | None,
            typer.Option(
                "--from-time",
                help="start at entries published at or after this time (the Kafka record time, "
                "not the entry's own timestamp): an ISO date (midnight UTC) or date-time "
                "(UTC without an offset), e.g. 2026-11-30 or 2026-11-30T08:00Z",
            ),
        ] = None,
        do_swap: Annotated[
            bool, typer.Option("--swap", help="make it live once caught up with the live build")
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="for list")] = False,
        processes: Annotated[
            int | None,
            typer.Option(
                "--processes",
                min=1,
                help="split the partitions between N processes (default: "
                "AGENTLEDGER_REBUILD_PROCESSES; 0 or unset: one per core)",
            ),
        ] = None,
    ) -> None:
        """Rebuild a projection into a new build beside the live one; list, swap, drop builds.

        The new build replays the ledger topics with the current code and data (price table,
        taxonomy, context budget) while the live build keeps serving; readers switch only on
        swap. Runs that began before a --from-offset/--from-time start are skipped.
        """
        settings = load_settings()
        n = processes or settings.rebuild_processes or os.cpu_count() or 1
        try:
            if what == "list":
                if as_json:
                    print(json.dumps(builds_json(settings), indent=2, default=str))
                else:
                    print_table(_table(list_builds(settings), settings), console)
                return
            if what in ("swap", "drop"):
                if build is None:
                    raise RebuildError(f"rebuild {what} needs a BUILD (see `rebuild list`)")
                info = find_build(settings, build)
                migrate_and_claim(settings.pg_address, settings.topic_prefix)  # (see below)
                if what == "drop":
                    asyncio.run(drop(settings, info.projection, info.build))
                    console.print(f"dropped {info.projection} build {info.build}")
                    return
                p = projection(info.projection, settings)
                previous = asyncio.run(swap(settings, p, info.build, _progress(info.build)))
                console.print(f"{p.name}: live build {previous} -> {info.build}")
                return
            p = projection(what, settings)
            start = _start(from_beginning, from_offset, from_time)
            # it writes builds: never into another deployment's database (arguments first)
            migrate_and_claim(settings.pg_address, settings.topic_prefix)
            new = asyncio.run(create_build(settings, p, start))
            err.print(f"{p.name}: building {new} from {start.describe()}")
            stats = asyncio.run(run_build(settings, p, new, progress=_progress(new), processes=n))
            console.print(
                f"{p.name}: build {new} applied {stats.records:,} entries "
                f"({stats.skipped:,} of runs begun before the start skipped, "
                f"{stats.dead_lettered:,} dead-lettered)"
            )
            if do_swap:
                previous = asyncio.run(swap(settings, p, new, _progress(new)))
                console.print(f"{p.name}: live build {previous} -> {new}")
            else:
                console.print(f"make it live: agentledger rebuild swap {p.name}/{new}")
        except (RebuildError, KeyError) as exc:
            err.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(code=2) from None

    @app.command("verify")
    def verify_cmd(
        name: Annotated[str | None, typer.Argument(help=f"the projection ({PROJECTIONS})")] = None,
        every: Annotated[bool, typer.Option("--all", help="every projection")] = False,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Replay into a scratch build up to the live offsets and compare canonical digests.

        Exit code 0 only when every compared projection is equal.
        """
        settings = load_settings()
        if every == (name is not None):
            err.print("[red]give one PROJECTION or --all[/]")
            raise typer.Exit(code=2)
        chosen = all_projections(settings) if every else [projection(str(name), settings)]
        # it writes scratch builds and verdicts: never into another deployment's database
        migrate_and_claim(settings.pg_address, settings.topic_prefix)
        verdicts = []
        for p in chosen:
            try:
                verdicts.append(asyncio.run(verify(settings, p, _progress(f"verify {p.name}"))))
            except RebuildError as exc:
                err.print(f"[red]error:[/] {p.name}: {escape(str(exc))}")
                raise typer.Exit(code=2) from None
            if not as_json:  # each verdict as it is reached: one that fails later loses none
                _say_verdict(verdicts[-1])
        if as_json:
            print(
                json.dumps(
                    [
                        {
                            "projection": v.projection,
                            "equal": v.equal,
                            "live_build": v.live_build,
                            "runs": v.runs,
                            "live_digest": v.live_digest,
                            "replay_digest": v.scratch_digest,
                            "differences": v.differences,
                        }
                        for v in verdicts
                    ],
                    indent=2,
                )
            )
        if not all(v.equal for v in verdicts):
            raise typer.Exit(code=1)

    @app.command("replay-package")
    def replay_package(
        what: Annotated[str, typer.Argument(help="a RUN_ID, or: load")],
        folder: Annotated[Path | None, typer.Argument(help="the package folder, for load")] = None,
        out: Annotated[
            Path | None, typer.Option("--out", help="where to write (default ./replay-RUN_ID)")
        ] = None,
    ) -> None:
        """Write a run's replay package (entries, offsets, schemas, versions, artifact refs and
        the artifacts the store holds), or `replay-package load DIR`: fold one back into every
        projection offline (prints JSON)."""
        from projectors.stores import postgres_ops as ops
        from schemas.errors import NotFoundError
        from streams import replay_package as rp
        from streams.artifacts import FileArtifactStore

        settings = load_settings()
        projections = all_projections(settings)
        try:
            if what == "load":
                if folder is None:
                    raise rp.ReplayPackageError("replay-package load needs a DIR")
                manifest, docs = rp.load_package(folder, projections)
                cost = docs.get("cost-metrics")  # its sums as every output shows them
                if cost is not None:
                    docs["cost-metrics"] = shown_state(cost)
                print(json.dumps({"run_id": manifest["run_id"], "views": docs}, indent=2))
                return
            try:
                with ops.connect(settings.pg_address) as conn:  # an id, or a unique prefix
                    what = ops.resolve_run(conn, what)
            except NotFoundError as exc:
                raise rp.ReplayPackageError(str(exc)) from None
            located, topic = rp.located_run(settings, what)
            target = rp.write_package(
                out or Path(f"replay-{what}"),
                located,
                projections,
                topic,
                store=FileArtifactStore.from_settings(settings),
            )
            console.print(
                f"wrote {target}: {len(located)} entries of run {what} "
                f"(offsets {located[0].offset}..{located[-1].offset} of "
                f"{topic}[{located[0].partition}]){_artifact_note(target)}"
            )
        except rp.ReplayPackageError as exc:
            err.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(code=1) from None


def _say_verdict(v: Verdict) -> None:
    mark = "[green]equal[/]" if v.equal else "[red]DIFFERENT[/]"
    console.print(
        f"{v.projection} ({v.live_build}, {v.runs:,} runs): {mark}  "
        f"live {v.live_digest[:12]} replay {v.scratch_digest[:12]}"
    )
    for line in v.differences:
        console.print(f"  {line}")


def _artifact_note(package: Path) -> str:
    """ ", N of M artifacts included" for a package that refers to any."""
    refs = json.loads((package / "package.json").read_text()).get("artifacts", [])
    if not refs:
        return ""
    included = sum(1 for r in refs if r.get("included"))
    return f", {included} of {len(refs)} artifacts included"
