"""Human-readable views of the analytics reports: timeline, costs, failures."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape

from consumers.analytics import (
    CostReport,
    CostRow,
    FailureCount,
    FailureReport,
    RunFailure,
    money,
)
from infra.cli_support import Table, bounded, print_table
from projectors.failure_classifications import explain

_STATUS_STYLE = {
    "SUCCEEDED": "green",
    "PASSED": "green",
    "APPROVED": "green",
    "OK": "green",
    "none": "green",
    "FAILED": "red",
    "ERROR": "red",
    "REJECTED": "red",
    "TIMED_OUT": "red",
    "PENDING": "yellow",
}


def tokens(n: int) -> str:
    """A token count at a glance: 812, 98.9k, 2.48M (--json has the exact figures)."""
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.2f}M"


def _styled(status: str | None) -> str:
    if status is None:
        return ""
    style = _STATUS_STYLE.get(status)
    return f"[{style}]{escape(status)}[/]" if style else escape(status)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


# -- timeline ------------------------------------------------------------------------------


def timeline_headline(t: dict[str, Any]) -> str:
    """One line: status, class, cost against budget, diff size and flags (the demo prints it)."""
    failure, cost, diff = t["failure"], t["cost"], t["diff"]
    parts = [f"run {t['run_id']} ({t['fleet_id']}) {t['status']}"]
    if failure is not None:
        final = "" if failure["final"] else " (provisional)"
        parts.append(f"class {failure['failure_class']}{final}")
    if cost is not None:
        budget = budget_text(cost, t["status"])
        calls = (
            f"in {cost['calls']} calls"
            if cost["calls"]
            else "(model calls unknown: the log keeps no usage)"
            if cost["calls"] is None
            else "(no model calls recorded)"
        )
        parts.append(f"{figure(cost, 'cost_usd', money)}{budget} {calls}")
    s = diff["summary"]
    flags = sorted({f["kind"] for f in diff["flags"]})
    parts.append(
        f"{s['snapshots']} diffs, {s['files_touched']} files, +{s['lines_added']} "
        f"-{s['lines_deleted']}" + (f" [{', '.join(flags)}]" if flags else "")
    )
    took = "time unknown" if t.get("time_unknown") else _duration(t["duration_s"])
    parts.append(f"{len(t['rows'])} steps in {took}")
    return "; ".join(parts)


def print_timeline(console: Console, t: dict[str, Any]) -> None:
    status = _styled(t["status"])
    console.print(f"[bold]run[/] {t['run_id']}  fleet {t['fleet_id']}  status {status}")
    if t.get("gaps"):
        console.print(f"[red]incomplete: missing sequence numbers {t['gaps']}[/]")
    repo = t["repository"] or "-"
    sha = f" @ {t['base_sha']}" if t["base_sha"] else ""
    scope = f"  scope {', '.join(t['scope'])}" if t["scope"] else ""
    console.print(f"repo {escape(repo)}{sha}{scope}")
    if t.get("time_unknown"):  # the log keeps no times: its entries carry a stand-in time
        console.print(f"times unknown ({escape(str(t['time_unknown']))})")
    else:
        console.print(
            f"started {t['started_at'] or '-'}, last entry {t['last_at'] or '-'} "
            f"({_duration(t['duration_s'])})"
        )
    _print_cost_header(console, t["cost"], t["status"])
    _print_failure_header(console, t["failure"])
    _print_diff_header(console, t["diff"])
    console.print("[bold]timeline[/] (time, seq, step, status, what; below: where to drill down)")
    for row in t["rows"]:
        console.print(_timeline_line(row), highlight=False)
        refs = "  ".join(f"{name} {value}" for name, value in row["refs"].items())
        console.print(f"{'':>15}[dim]{escape(refs)}[/]", highlight=False)
    console.print(
        "[bold magenta]*[/] evidence of the failure class; model calls show their cost "
        "and the run's cost so far"
    )


def _timeline_line(row: dict[str, Any]) -> str:
    status = row["status"] or ""
    marker = "[bold magenta]*[/]" if row["evidence"] else " "
    cost = ""
    if row["kind"] == "model-call":
        spent = "unpriced" if row.get("unpriced") else figure(row, "cost_usd", money)
        so_far = money(row["cost_so_far_usd"]) if row["cost_so_far_usd"] is not None else "unknown"
        bound = ">= " if row.get("cost_so_far_lower_bound") else ""
        cost = f"  [cyan]{spent}, {bound}{so_far} so far[/]"
    return (
        f"{_clock(row['occurred_at'])} {row['seq']:>5} {marker} {row['kind']:<13} "
        f"{_styled(status)}{' ' * max(1, 16 - len(status))}{escape(row['summary'])}{cost}"
    )


def _clock(iso: str | None) -> str:
    return datetime.fromisoformat(iso).strftime("%H:%M:%S") if iso else "   ?    "


def budget_text(cost: dict[str, Any], status: str | None) -> str:
    """`` of $1.00 budget``, ``OVER BUDGET`` when our priced cost passed it, and why a run the
    agent stopped for its budget can show a cost under it."""
    if not cost["task_budget_usd"]:
        return ""
    text = f" of {money(cost['task_budget_usd'], 2)} budget"
    if cost["over_budget"]:
        return text + " OVER BUDGET"
    if status == "BUDGET_EXCEEDED":
        return text + (
            " (the agent stopped for its budget by its own count; the calls priced here "
            "come to less)"
        )
    return text


def _print_cost_header(console: Console, cost: dict[str, Any] | None, status: str | None) -> None:
    if cost is None:
        console.print("cost: [dim]no cost-metrics for this run[/]")
        return
    budget = escape(budget_text(cost, status)).replace("OVER BUDGET", "[red]OVER BUDGET[/]")
    reported = (
        f"; provider reported {figure(cost, 'provider_reported_cost_usd', money)}, "
        f"{cost['cost_disagreements']} disagreements"
        if cost["provider_reported_cost_usd"] is not None
        else "; provider reported no cost"
        if cost["calls"]
        else ""
    )
    unknown = cost.get("usage_unknown_calls") or 0
    if cost["calls"] is None:  # a log that keeps no usage (e.g. a Codex rollout without it)
        console.print(f"cost unknown{budget}: model calls unknown (the log keeps no usage)")
    elif not cost["calls"]:
        console.print(f"cost unknown{budget}: no model calls recorded")
    else:
        console.print(
            f"cost {figure(cost, 'cost_usd', money)}{budget}: {cost['calls']} calls "
            f"({cost['unpriced_calls']} unpriced, "
            + (f"{unknown} of unknown usage, " if unknown else "")
            + f"{cost['duplicate_reports']} duplicate reports "
            f"ignored){reported}; prices {escape(str(cost['price_version']))}"
        )
        console.print(
            f"tokens: {figure(cost, 'input_tokens', _count)} in "
            f"({figure(cost, 'cached_input_tokens', _count)} cached), "
            f"{figure(cost, 'output_tokens', _count)} out"
        )
    totals = cost.get("reported_totals")
    if totals:
        said = [money(totals["cost_usd"])] if totals.get("cost_usd") is not None else []
        if totals.get("input_tokens") is not None or totals.get("output_tokens") is not None:
            sent, received = totals.get("input_tokens"), totals.get("output_tokens")
            said.append(f"{bounded(sent, _count)} in / {bounded(received, _count)} out")
        if totals.get("calls") is not None:
            said.append(f"{totals['calls']} calls")
        flag = " [red]differs from the calls above[/]" if cost.get("reported_disagrees") else ""
        console.print(f"the agent reported for the run: {', '.join(said)}{flag}")


def figure(doc: dict[str, Any], name: str, fmt: Callable[[Any], str]) -> str:
    """One figure of a document that follows the unknown-is-never-zero rule
    (:func:`projectors.cost_metrics.known_figures`): "unknown" when None, ``>= `` before a lower
    bound (named in ``partly_unknown``)."""
    return bounded(doc.get(name), fmt, name in doc.get("partly_unknown", ()))


def _count(n: int) -> str:
    return f"{n:,}"


def _print_failure_header(console: Console, failure: dict[str, Any] | None) -> None:
    if failure is None:
        console.print("failure class: [dim]not classified yet[/]")
        return
    final = "final" if failure["final"] else "provisional"
    loop = ""
    if failure["repair_loop"]:
        signature = failure["repair_signature"]
        loop = f"; [red]repair loop[/] {escape(signature)} x{failure['repair_count']}"
    console.print(
        f"failure class [bold]{_styled(failure['failure_class'])}[/] ({final}, rule "
        f"{escape(failure['rule'])}, {escape(failure['taxonomy_version'])}): "
        f"{escape(failure['explanation'])}"
        f"{loop}"
    )


def _print_diff_header(console: Console, diff: dict[str, Any]) -> None:
    s = diff["summary"]
    console.print(
        f"diff: {s['snapshots']} snapshots, {s['files_touched']} files touched, "
        f"{s['files_changed']} with a net change, +{s['lines_added']} -{s['lines_deleted']}"
    )
    for f in diff["flags"]:
        console.print(
            f"  [yellow]{f['kind']}[/] {escape(f['path'])}: {escape(f['reason'])} "
            f"(seq {f['raised_at_seq']})"
        )


# -- costs ---------------------------------------------------------------------------------


def print_costs(console: Console, report: CostReport) -> None:
    """One row per key and a total; columns that are empty for every row are left out."""
    t = report.total
    columns: list[tuple[str, Callable[[CostRow], str]]] = [
        ("calls", _calls_cell("calls")),
        ("failed", _calls_cell("failed_calls")),
        ("in", _tokens_cell("input_tokens")),
        ("cached", _tokens_cell("cached_input_tokens")),
        ("cache write", _tokens_cell("cache_write_input_tokens")),
        ("out", _tokens_cell("output_tokens")),
        ("reasoning", _tokens_cell("reasoning_tokens")),
        ("usage unknown", lambda r: "all" if r.calls_unknown else f"{r.usage_unknown_calls:,}"),
        ("latency", _latency),
        ("cost", cost_cell),
        ("reported", _reported_cell),
        ("disagree", _calls_cell("cost_disagreements")),
    ]
    empty = {
        "failed": not t.failed_calls,
        "cache write": not t.cache_write_input_tokens,
        "usage unknown": not t.usage_unknown_calls,
        "reasoning": not t.reasoning_tokens,
        "reported": not t.reported_calls,
        "disagree": not t.reported_calls,
    }
    columns = [c for c in columns if not empty.get(c[0], False)]
    if report.by == "run":
        columns += [("budget", lambda r: money(r.task_budget_usd, 2)), ("over", _over)]
        if any(r.reported_cost_usd is not None or r.reported_input_tokens for r in report.rows):
            columns += [("run total (agent's)", _reported_run)]
    table = Table(report.by)
    # Whole keys (run ids are what a reader copies); the numbers' columns give way first.
    table.columns[0].min_width = min(40, max(len(r.key) for r in [*report.rows, t]))
    for name, _ in columns:
        table.add_column(name, justify="right")
    for row in report.rows:
        table.add_row(escape(row.key), *(cell(row) for _, cell in columns))
    table.add_section()
    table.add_row(
        "total",
        *(cell(t) if name not in ("over", "run total (agent's)") else "" for name, cell in columns),
    )
    table.rows[-1].style = "bold"
    print_table(table, console)
    if t.unpriced_calls:
        console.print(
            f"[yellow]{t.unpriced_calls} calls of models the price table lacks: unpriced, not "
            "in cost (never counted as $0)[/]"
        )
    if report.runs_calls_unknown:
        console.print(
            f"[yellow]{report.runs_calls_unknown} runs whose log keeps no usage at all: their "
            "calls, tokens and cost are unknown and not in the total (a lower bound)[/]"
        )
    if t.usage_unknown_calls:
        console.print(
            f"[yellow]{t.usage_unknown_calls} calls whose log gives no token counts (or too "
            "few to price them): their cost is unknown, so a cost shown with >= is a lower "
            "bound[/]"
        )


def _calls_cell(name: str) -> Callable[[CostRow], str]:
    """A count of calls: "unknown" for a run whose log keeps no usage, never 0; >= when the
    row leaves such runs out."""

    def cell(row: CostRow) -> str:
        return figure(row.as_json(), name, lambda n: f"{n:,}")

    return cell


def cost_cell(row: CostRow) -> str:
    """Our cost of the row's calls: "unpriced" when no call could be priced, never $0; a lower
    bound (>=) when some calls are unpriced or of unknown usage."""
    if not row.calls:
        return "-"  # no per-call figures (a run may still have totals its agent reported)
    doc = row.as_json()
    if doc["cost_usd"] is None and row.unpriced_calls:
        return "unpriced"
    return figure(doc, "cost_usd", money)


def _tokens_cell(name: str) -> Callable[[CostRow], str]:
    """A token sum: "unknown" when no call reported tokens, never 0; >= when some did not."""

    def cell(row: CostRow) -> str:
        return figure(row.as_json(), name, tokens) if row.calls else "-"

    return cell


def _reported_cell(row: CostRow) -> str:
    """The provider's cost: "-" when no call reported one, >= when only some did."""
    doc = row.as_json()
    return (
        "-"
        if doc["provider_reported_cost_usd"] is None
        else figure(doc, "provider_reported_cost_usd", money)
    )


def _reported_run(row: CostRow) -> str:
    """The run totals the agent reported itself (e.g. SWE-agent's model_stats)."""
    if row.reported_cost_usd is None and row.reported_input_tokens is None:
        return "-"
    parts = []
    if row.reported_cost_usd is not None:
        parts.append(money(row.reported_cost_usd))
    if row.reported_input_tokens is not None or row.reported_output_tokens is not None:
        sent, received = row.reported_input_tokens, row.reported_output_tokens
        parts.append(f"{bounded(sent, tokens)} in / {bounded(received, tokens)} out")
    flag = " [red]differs from the calls[/]" if row.reported_disagrees else ""
    return ", ".join(parts) + flag


def _latency(row: CostRow) -> str:
    return f"{row.avg_latency_ms / 1000:.1f}s" if row.avg_latency_ms is not None else "-"


def _over(row: CostRow) -> str:
    return "" if row.over_budget is None else ("[red]yes[/]" if row.over_budget else "no")


# -- failures ------------------------------------------------------------------------------


def print_failures(console: Console, report: FailureReport) -> None:
    """Classes down, fleets across; then how many are final, provisional or stalled."""
    fleets = sorted({r.fleet_id for r in report.rows})
    classes: dict[str, list[FailureCount]] = {}
    for r in report.rows:
        classes.setdefault(r.failure_class, []).append(r)
    table = Table("class", *fleets, "final", "provisional", "stalled", "repair loops", "runs")
    for name, rows in sorted(classes.items()):
        per_fleet = {r.fleet_id: r.runs for r in rows}
        table.add_row(
            _styled(name),
            *(str(per_fleet.get(f, 0)) for f in fleets),
            *_count_cells([sum(getattr(r, k) for r in rows) for k in _COUNTS]),
        )
    t = report.total
    table.add_section()
    fleet_totals = [str(sum(r.runs for r in report.rows if r.fleet_id == f)) for f in fleets]
    cells = _count_cells([getattr(t, k) for k in _COUNTS])
    table.add_row("total", *fleet_totals, *cells, style="bold")
    print_table(table, console)
    console.print(
        f"final: finished runs; provisional: unfinished; stalled: unfinished and not written "
        f"for {report.stalled_after_minutes:g} minutes"
    )
    if report.runs_left_out:
        console.print(
            f"[yellow]{report.runs_left_out} runs whose times are unknown are not counted "
            "(they may be in the window)[/]"
        )


_COUNTS = ("final", "provisional", "stalled", "repair_loops", "runs")


def _count_cells(values: list[int]) -> list[str]:
    final, provisional, stalled, loops, runs = values
    return [
        str(final),
        str(provisional),
        f"[red]{stalled}[/]" if stalled else "0",
        str(loops),
        str(runs),
    ]


def print_run_failure(console: Console, found: RunFailure) -> None:
    console.print(escape(explain(found.diagnosis)), highlight=False)
    if found.stalled:
        console.print(
            f"[red]stalled[/]: unfinished, nothing applied since {found.updated_at.isoformat()}"
        )
