"""``agentledger demo``, the reading half: each projection's result printed for a few runs as it
lands, then the analytics (``streams.demo`` publishes the simulated fleet)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.markup import escape

from consumers.analytics import (
    ANALYTICS,
    cost_report,
    failure_report,
    money,
    run_timeline,
    runs_applied,
)
from consumers.render_analytics import timeline_headline, tokens
from infra.cli_support import Table, print_table
from infra.clients import redis_client
from infra.settings import Settings
from projectors.stores.redis import RedisViewStore
from schemas.errors import NotFoundError
from schemas.models import EntryKind, LedgerEntry

SHOWN = 6
WAIT_S = 120.0
ANALYTICS_WAIT_S = 60.0


def show(
    settings: Settings, entries: list[LedgerEntry], published_at: float, console: Console
) -> None:
    """Follow the published runs into the projections and print what each shows as it lands
    (the publishing half is ``streams.demo``; ``infra.main`` runs both)."""
    runs = _runs(entries)
    landed = asyncio.run(_watch(settings, runs, published_at, console))
    analysed = _analytics(settings, runs, published_at, console)
    _summary(console, settings, runs, landed, analysed)


def _runs(entries: list[LedgerEntry]) -> dict[str, list[LedgerEntry]]:
    runs: dict[str, list[LedgerEntry]] = {}
    for e in entries:
        runs.setdefault(e.run_id, []).append(e)
    return runs


HOT = ("run-stats", "working-memory", "context-manifests")


async def _watch(
    settings: Settings,
    runs: dict[str, list[LedgerEntry]],
    published_at: float,
    console: Console,
) -> dict[str, float]:
    """Poll the live Redis views until every run is complete; print a few as they land."""
    client = redis_client(settings)
    store = RedisViewStore(client, settings.redis_prefix)
    landed: dict[str, float] = {}
    deadline = time.perf_counter() + WAIT_S
    try:
        while len(landed) < len(runs) and time.perf_counter() < deadline:
            for run_id, entries in runs.items():
                if run_id in landed:
                    continue
                views = [await store.read_live(p, run_id) for p in HOT]
                if all(v is not None and v[0] == len(entries) for v in views):
                    landed[run_id] = time.perf_counter() - published_at
                    if len(landed) <= SHOWN:
                        docs = {p: v[1]["state"] for p, v in zip(HOT, views, strict=True) if v}
                        _print_run(console, docs, landed[run_id])
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()
    return landed


def _print_run(console: Console, docs: dict[str, Any], seconds: float) -> None:
    stats, memory, context = docs["run-stats"], docs["working-memory"], docs["context-manifests"]
    facts = [f for f in memory["known_facts"] if f["status"] == "active"]
    turn = context.get("next_turn") or {}
    console.print(
        f"[bold]run {stats['run_id'][:8]}[/] {stats['fleet_id']}: {stats['entries']} entries, "
        f"status {stats['status']}, landed in Redis {seconds * 1000:.0f} ms after publish"
    )
    console.print(
        f"  working-memory     goal: {(memory['task_goal'] or '-')[:60]}; "
        f"{len(facts)} facts, {len(memory['unsupported_claims'])} unsupported claims, "
        f"{len(memory['open_problems'])} open problems, {len(memory['blocked_by'])} blockers"
    )
    console.print(
        f"  context-manifests  {context['manifests_recorded']} model calls recorded; next turn: "
        f"{len(turn.get('items', []))} items, {turn.get('total_tokens', 0)} tokens, "
        f"stable prefix {turn.get('stable_prefix_tokens', 0)} tokens; "
        f"{context['findings_total']} instruction-like findings in untrusted content"
    )


def _analytics(
    settings: Settings,
    runs: dict[str, list[LedgerEntry]],
    published_at: float,
    console: Console,
) -> int:
    """Wait for the analytics projections (PostgreSQL only) to apply every run, then show them."""
    expected = {run_id: entries[-1].sequence_no for run_id, entries in runs.items()}
    deadline = time.perf_counter() + ANALYTICS_WAIT_S
    done = runs_applied(settings, expected)
    while done < len(runs) and time.perf_counter() < deadline:
        time.sleep(0.1)
        done = runs_applied(settings, expected)
    seconds = time.perf_counter() - published_at
    console.print(
        f"\n[bold]analytics[/] ({', '.join(ANALYTICS)}): {done}/{len(runs)} runs applied in "
        f"PostgreSQL {seconds * 1000:.0f} ms after publish"
    )
    run_ids = list(runs)
    costs = cost_report(settings, "model", run_ids=run_ids)
    table = Table("model", "calls", "tokens in", "tokens out", "cost", "provider-reported")
    for row in [*costs.rows, costs.total]:
        if row is costs.total:
            table.add_section()
        reported = money(row.provider_reported_cost_usd) if row.reported_calls else "-"
        if row.cost_disagreements:
            reported += f" ({row.cost_disagreements} disagree)"
        table.add_row(
            escape(row.key),
            str(row.calls),
            tokens(row.input_tokens),
            tokens(row.output_tokens),
            money(row.cost_usd),
            reported,
            style="bold" if row is costs.total else None,
        )
    print_table(table, console)
    failures = failure_report(settings, run_ids=run_ids)
    classes = ", ".join(f"{name} {n}" for name, n in failures.by_class.items())
    console.print(
        f"failure classes ({failures.total.final} final, {failures.total.repair_loops} repair "
        f"loops): {classes}"
    )
    shown = next(
        (r for r, entries in runs.items() if entries[-1].metadata.get("outcome") == "budget"),
        run_ids[0],
    )
    try:
        console.print(f"timeline: {escape(timeline_headline(run_timeline(settings, shown)))}")
    except NotFoundError as exc:
        console.print(f"[red]{exc}[/]")
    return done


def _summary(
    console: Console,
    settings: Settings,
    runs: dict[str, list[LedgerEntry]],
    landed: dict[str, float],
    analysed: int,
) -> None:
    outcomes = Counter(
        e.metadata.get("outcome", "?")
        for entries in runs.values()
        for e in entries
        if e.kind is EntryKind.RUN_FINISHED
    )
    run_ids = list(runs)
    table = Table("projections", "runs complete", "slowest run landed", "outcomes across runs")
    slowest = f"{max(landed.values()) * 1000:.0f} ms" if landed else "-"
    table.add_row(", ".join(HOT), f"{len(landed)}/{len(runs)}", slowest, str(len(outcomes)))
    print_table(table, console)
    console.print(
        "\nThe stack keeps running. Explore:\n"
        "  .venv/bin/agentledger infra status        # what runs where\n"
        "  .venv/bin/agentledger dlq list            # dead letters (none expected)\n"
        f"  .venv/bin/agentledger memory {next(iter(runs))} [--at 20] [--json]\n"
        f"  .venv/bin/agentledger context {next(iter(runs))} [--render]\n"
        f"  .venv/bin/agentledger timeline {next(iter(runs))} [--json]\n"
        "  .venv/bin/agentledger costs --by fleet|run|model|purpose|day [--json]\n"
        f"  .venv/bin/agentledger failures [--json]; .venv/bin/agentledger failures {run_ids[1]}\n"
        f"  psql {settings.pg_address} -c 'SELECT * FROM al_failures'   # docs/ANALYTICS.md\n"
        f"  psql {settings.pg_address} -c 'SELECT * FROM al_live'\n"
        f"  tail -f {settings.state_dir / 'worker' / 'worker.log'}\n"
        "Stop everything:\n"
        "  .venv/bin/agentledger infra down"
    )
    if len(landed) < len(runs):
        raise SystemExit(f"only {len(landed)}/{len(runs)} runs landed within {WAIT_S:.0f}s")
    if analysed < len(runs):
        raise SystemExit(
            f"analytics applied only {analysed}/{len(runs)} runs within {ANALYTICS_WAIT_S:.0f}s"
        )
