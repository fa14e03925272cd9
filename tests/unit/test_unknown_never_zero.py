"""Unknown is never shown as zero in a cost row's JSON (issue 26): calls whose log keeps no
usage, calls of unpriced models, runs whose provider reported no cost."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from rich.console import Console

from consumers.analytics import CostReport, CostRow
from consumers.render_analytics import print_costs
from consumers.subscribe import summarize_state
from projectors.cost_metrics import CostTotals, known_sum, partly_unknown

ROW = CostRow(
    key="run-1",
    calls=4,
    failed_calls=0,
    input_tokens=1000,
    cached_input_tokens=0,
    output_tokens=50,
    reasoning_tokens=0,
    avg_latency_ms=None,
    cost_usd=Decimal("0.01"),
    unpriced_calls=0,
    reported_calls=4,
    provider_reported_cost_usd=Decimal("0.012"),
    cost_disagreements=0,
)


def test_known_figures_are_shown() -> None:
    doc = ROW.as_json()
    assert (doc["cost_usd"], doc["input_tokens"], doc["provider_reported_cost_usd"]) == (
        "0.01",
        1000,
        "0.012",
    )


def test_calls_of_unknown_usage_have_no_token_sums_and_no_cost() -> None:
    unmetered = replace(
        ROW, input_tokens=0, output_tokens=0, cost_usd=Decimal(0), usage_unknown_calls=4
    )
    doc = unmetered.as_json()
    assert doc["calls"] == 4
    assert doc["cost_usd"] is None and doc["input_tokens"] is None and doc["output_tokens"] is None
    some = replace(ROW, usage_unknown_calls=1).as_json()  # a lower bound, tokens of the others
    assert some["cost_usd"] == "0.01" and some["input_tokens"] == 1000


def test_unpriced_calls_and_unreported_costs_are_unknown() -> None:
    doc = replace(ROW, unpriced_calls=4, cost_usd=Decimal(0)).as_json()
    assert doc["cost_usd"] is None
    doc = replace(ROW, reported_calls=0, provider_reported_cost_usd=Decimal(0)).as_json()
    assert doc["provider_reported_cost_usd"] is None
    assert replace(ROW, calls=0).as_json()["cost_usd"] is None


def test_partly_unknown_figures_are_named_as_lower_bounds() -> None:
    doc = replace(ROW, unpriced_calls=1, reported_calls=3, usage_unknown_calls=1).as_json()
    assert doc["cost_usd"] == "0.01" and doc["input_tokens"] == 1000
    assert set(doc["partly_unknown"]) >= {"cost_usd", "input_tokens", "provider_reported_cost_usd"}
    assert ROW.as_json()["partly_unknown"] == []


def test_the_costs_table_shows_unknown_tokens_and_lower_bounds_never_zero() -> None:
    unmetered = replace(
        ROW,
        input_tokens=0,
        output_tokens=0,
        cost_usd=Decimal(0),
        usage_unknown_calls=4,
        reported_calls=0,
        provider_reported_cost_usd=Decimal(0),
    )
    partly = replace(ROW, key="run-2", usage_unknown_calls=1, reported_calls=2)
    total = replace(ROW, key="total", calls=8, usage_unknown_calls=5, reported_calls=6)
    console = Console(width=250, record=True)
    print_costs(console, CostReport("run", [unmetered, partly], total))
    text = console.export_text()
    lines = {ln.split("│")[1].strip(): ln for ln in text.splitlines() if ln.startswith("│")}
    cells = [c.strip() for c in lines["run-1"].split("│")[2:-1]]
    assert cells[:1] == ["4"] and "unknown" in cells and "0" not in cells[1:4], cells
    assert "$0.0000" not in lines["run-1"]
    assert ">= $0.0100" in lines["run-2"] and ">= 1.0k" in lines["run-2"]
    assert ">= $0.0120" in lines["run-2"]  # the provider reported for 2 of 4 calls


def test_subscribe_lines_and_run_costs_never_say_zero() -> None:
    unknown = {"totals": {"cost_usd": "0", "calls": 3, "usage_unknown_calls": 3}}
    assert "cost unknown, 3 calls" in summarize_state("cost-metrics", unknown)
    some = {"totals": {"cost_usd": "0.5", "calls": 3, "usage_unknown_calls": 1}}
    assert ">= $0.5, 3 calls" in summarize_state("cost-metrics", some)
    none = {"totals": {"cost_usd": "0", "calls": 0}}
    assert summarize_state("cost-metrics", none) == "cost unknown, no model calls recorded"
    assert known_sum(CostTotals(calls=2, unpriced_calls=2), "cost", Decimal(0)) is None
    assert known_sum(CostTotals(calls=2, unpriced_calls=1), "cost", Decimal(1)) == 1
    assert partly_unknown(CostTotals(calls=2, usage_unknown_calls=1, reported_calls=2)) == [
        "cost",
        "input_tokens",
        "cached_input_tokens",
        "output_tokens",
        "reasoning_tokens",
        "cache_write_input_tokens",
    ]


def test_a_token_count_some_calls_leave_unknown_is_unknown_or_a_lower_bound() -> None:
    """A count a call's source did not report (Claude Code's reasoning tokens, an output a log
    lost) while its other counts are known: the sum of that count is unknown when no call has
    it and a lower bound when some lack it, never 0 (found trying the product: every roll-up
    showed Claude Code runs' reasoning tokens as 0)."""
    claude = CostTotals(calls=3, reasoning_unknown_calls=3, output_unknown_calls=1)
    assert known_sum(claude, "reasoning_tokens", 0) is None
    assert known_sum(claude, "output_tokens", 4_509) == 4_509
    assert known_sum(claude, "input_tokens", 170_226) == 170_226
    assert partly_unknown(claude) == ["output_tokens"]
    # counts that keep no figure's own unknowns (a sum of costs only) read usage as before
    assert partly_unknown(ROW) == []


def test_a_costs_table_in_a_narrow_console_keeps_every_figure_and_column() -> None:
    """At 60 columns (a narrow terminal; piped, rich lays out at 80) the table keeps its own
    width: every figure and key whole, every column there. Before, rich fitted it to the
    console: ``374.…`` for 374,206 tokens, and the columns past the edge (cost) cropped."""
    row = replace(
        ROW,
        key="9f0e2b7c-4d1a-4c55-8a1f-144b9d2e0123",
        input_tokens=374_206,
        cached_input_tokens=200_498,
        output_tokens=16_371,
        reasoning_tokens=6_611,
        cost_usd=Decimal("0.2756128"),
    )
    console = Console(width=60, record=True)
    print_costs(console, CostReport("run", [row], replace(row, key="total")))
    text = console.export_text()
    assert "…" not in text
    header = next(ln for ln in text.splitlines() if ln.startswith("┃"))
    assert [h.strip() for h in header.split("┃")[1:-1]] == [
        "run",
        "calls",
        "in",
        "cached",
        "out",
        "reasoning",
        "latency",
        "cost",
        "reported",
        "disagree",
        "budget",
        "over",
    ]
    line = next(ln for ln in text.splitlines() if ln.startswith("│ 9f0e"))
    cells = [c.strip() for c in line.split("│")[1:-1]]
    assert cells[0] == "9f0e2b7c-4d1a-4c55-8a1f-144b9d2e0123"
    assert cells[2:5] == ["374.2k", "200.5k", "16.4k"] and cells[7] == "$0.2756", cells


def test_every_command_line_table_folds_past_its_widest() -> None:
    """The tables of every command come from one class (infra.cli_support.Table): a table
    wider than print_table lays out folds its cells instead of cutting them."""
    from infra.cli_support import WIDE_TABLE, Table, print_table

    table = Table("a", "b")
    table.add_column("c", justify="right")
    assert [c.overflow for c in table.columns] == ["fold", "fold", "fold"]
    table.add_row("x" * WIDE_TABLE, "374,206", "$0.2756")
    console = Console(width=80, record=True)
    print_table(table, console)
    text = console.export_text()
    assert "…" not in text and "374,206" in text and "$0.2756" in text
    assert text.count("x") == WIDE_TABLE


def test_claude_code_runs_reasoning_tokens_are_unknown_in_the_totals() -> None:
    """Anthropic's usage has no reasoning count (thinking is inside the output) and the
    importer says so; the cost projection read 0 from the raw usage and every roll-up showed
    0 reasoning tokens. Now unknown, and counted apart, while input and output stay known."""
    from projectors.base import fold_all
    from projectors.registry import all_projections
    from streams.importers.claude_code import import_file
    from tests.packs import SHARED

    [run], _summary = import_file(SHARED / "samples/claude-code/spotter-short.jsonl", "f")
    [cost] = [p for p in all_projections() if p.name == "cost-metrics"]
    state = fold_all(cost, run.entries)
    assert state is not None
    totals = state.totals
    assert totals.calls > 0 and totals.reasoning_unknown_calls == totals.calls
    assert known_sum(totals, "reasoning_tokens", totals.reasoning_tokens) is None
    assert known_sum(totals, "output_tokens", totals.output_tokens) == totals.output_tokens > 0


def test_a_rollout_that_keeps_no_usage_has_its_calls_unknown_not_zero() -> None:
    """A Codex rollout with no token counts at all: the import said its calls were unknown,
    but every view after projection said 0 calls, and costs --by run left it out. The
    importer says so on the ledger (RUN_STARTED metadata) and the run's cost header gives its
    calls as unknown."""
    from consumers.analytics import _cost_header
    from projectors.base import fold_all
    from projectors.cost_metrics import CALL_COUNTS, CALLS_KEY, CALLS_UNKNOWN
    from projectors.registry import all_projections
    from streams.importers.codex import import_file
    from tests.packs import SHARED

    [path] = (SHARED / "samples2/codex").glob("*0dd379793f80.jsonl")
    [run], summary = import_file(path, "f")
    assert summary.calls_known is False
    assert run.entries[0].metadata[CALLS_KEY] == CALLS_UNKNOWN
    [cost] = [p for p in all_projections() if p.name == "cost-metrics"]
    state = fold_all(cost, run.entries)
    assert state is not None and state.calls_unknown and state.totals.calls == 0
    header = _cost_header(state)
    assert header is not None and header["calls"] is None and header["cost_usd"] is None
    # every count of calls the header gives is unknown too (not "0 failed", "0 unpriced")
    assert [header[name] for name in CALL_COUNTS if name in header] == [None] * sum(
        name in header for name in CALL_COUNTS
    )
    assert {"calls", "unpriced_calls", "usage_unknown_calls", "latency_calls"} <= set(header)
    [metered] = (SHARED / "samples/codex").glob("codemie-rollout-*.jsonl")
    [run], _ = import_file(metered, "f")
    assert CALLS_KEY not in run.entries[0].metadata  # a rollout with token counts: counted


def test_a_tiny_known_cost_is_not_shown_as_zero() -> None:
    """Found trying the product: the runs list showed $0.0000 for a known cost of $0.0000141."""
    from consumers.analytics import money

    assert money("0.0000141") == "$0.000014"
    assert money("0.00009") == "$0.000090"
    assert money("0.25") == "$0.2500" and money("1234.5", 2) == "$1,234.50"
    assert money(None) == "-"


def test_a_run_whose_log_keeps_no_times_shows_no_times() -> None:
    """Found trying the product: a SWE-agent trajectory (no times; its entries carry the file's
    modification time, marked import.time: unknown) showed that time as when it started and
    a duration of 0 s. Its header and rows now say the times are unknown."""
    from consumers.analytics import assemble_timeline
    from projectors.base import fold_all
    from projectors.registry import all_projections
    from streams.importers import FORMATS
    from tests.packs import SHARED

    [path] = (SHARED / "samples2/swe-agent").glob("swesmith-1.0.1-pydantic*.traj")
    [run], _ = FORMATS["swe-agent"].import_file(path, "f")
    [timelines] = [p for p in all_projections() if p.name == "diff-timelines"]
    timeline = fold_all(timelines, run.entries)
    assert timeline is not None
    doc = assemble_timeline(timeline, [], None, None)
    assert doc["time_unknown"] and doc["time_unknown"].startswith("unknown")
    assert doc["started_at"] is doc["last_at"] is doc["duration_s"] is None
    assert doc["rows"] and all(r["occurred_at"] is None for r in doc["rows"])
    [path] = (SHARED / "samples/claude-code").glob("spotter-short.jsonl")
    [run], _ = FORMATS["claude-code"].import_file(path, "f")
    timeline = fold_all(timelines, run.entries)
    assert timeline is not None
    timed = assemble_timeline(timeline, [], None, None)
    assert timed["time_unknown"] is None and timed["duration_s"] is not None


def test_a_cost_row_and_a_runs_list_row_of_a_run_without_usage_give_no_count_as_zero() -> None:
    """Found trying the product: a run whose log keeps no usage showed "calls: unknown" in
    costs --by run but 0 failed calls, 0 disagreements in the same row, and 0 calls in the runs
    list."""
    from consumers.views import _shown
    from projectors.cost_metrics import CALL_COUNTS

    empty = replace(ROW, calls=0, reported_calls=0, cost_usd=Decimal(0), calls_unknown=True)
    doc = empty.as_json()
    assert {name: doc[name] for name in CALL_COUNTS} == dict.fromkeys(CALL_COUNTS)
    assert doc["cost_usd"] is None and doc["input_tokens"] is None
    console = Console(width=200, record=True)
    total = replace(empty, key="total", calls_unknown=False, runs_left_out=1)
    print_costs(console, CostReport("run", [empty], total))
    lines = console.export_text().splitlines()
    for key in ("run-1", "total"):  # no count of its calls shows as 0
        cells = next(t for t in lines if f" {key} " in t).replace("│", " ").split()
        assert cells[1] == "unknown" and "0" not in cells
    # a fleet's row (or the total) holding such a run: its counts and sums are lower bounds
    fleet = replace(ROW, key="fleet-1", failed_calls=1, runs_left_out=2).as_json()
    assert fleet["calls"] == 4 and {"calls", "failed_calls", "cost_usd"} <= set(
        fleet["partly_unknown"]
    )
    console = Console(width=200, record=True)
    bounded = replace(ROW, failed_calls=1, runs_left_out=2)
    print_costs(console, CostReport("fleet", [bounded], total))
    line = next(t for t in console.export_text().splitlines() if " run-1 " in t)
    assert ">= 4" in line and ">= 1" in line  # calls, failed calls
    row = {
        "run_id": "r", "fleet_id": "f", "status": None, "failure_class": None,
        "priced_cost_usd": Decimal(0), "calls": 0, "unpriced_calls": 0,
        "usage_unknown_calls": 0, "reported_calls": 0, "calls_unknown": True,
    }  # fmt: skip
    shown = _shown(dict(row))
    assert (shown["calls"], shown["unpriced_calls"], shown["usage_unknown_calls"]) == (None,) * 3
    assert shown["cost_usd"] is None and "calls_unknown" not in shown
    metered = _shown({**row, "calls": 2, "priced_cost_usd": Decimal("0.5")})
    assert (metered["calls"], metered["cost_usd"]) == (2, Decimal("0.5"))


def test_a_swe_agent_run_has_its_calls_unknown_beside_its_agents_totals() -> None:
    """Found trying the product: SWE-agent keeps no per-call usage, only its run totals
    (model_stats: 22 api calls), yet the runs list, costs and MCP said 0 calls. Its calls are
    unknown now; the tokens the agent reported for the run are still shown in the summary."""
    from consumers.analytics import _cost_header
    from projectors.base import fold_all
    from projectors.cost_metrics import CALLS_KEY, CALLS_UNKNOWN
    from projectors.registry import all_projections
    from streams.importers import FORMATS
    from tests.packs import SHARED

    [path] = (SHARED / "samples2/swe-agent").glob("swesmith-1.0.1-pydantic*.traj")
    [run], summary = FORMATS["swe-agent"].import_file(path, "f")
    assert run.entries[0].metadata[CALLS_KEY] == CALLS_UNKNOWN
    doc = summary.as_json()
    assert doc["calls"] is None and doc["input_tokens"] == 161_683
    [cost] = [p for p in all_projections() if p.name == "cost-metrics"]
    state = fold_all(cost, run.entries)
    assert state is not None and state.calls_unknown and state.reported_totals is not None
    header = _cost_header(state)
    assert header is not None and header["calls"] is None and header["cost_usd"] is None
    assert header["reported_totals"]["calls"] == 22


def test_a_run_whose_log_keeps_no_times_has_no_times_in_the_runs_list() -> None:
    """Found trying the product: the runs list (CLI, API, MCP, the web page) gave a SWE-agent
    run the moment of its import as its first and last entry, sorted and filtered by it, while
    its header said the times were unknown. run-stats 2 keeps them unknown (None)."""
    from projectors.base import fold_all
    from projectors.run_stats import RunStatsProjection
    from streams.importers import FORMATS
    from tests.packs import SHARED

    [path] = (SHARED / "samples2/swe-agent").glob("swesmith-1.0.1-pydantic*.traj")
    [run], _ = FORMATS["swe-agent"].import_file(path, "f")
    state = fold_all(RunStatsProjection(), run.entries)
    assert state is not None and state.time_unknown
    assert (state.first_at, state.last_at) == (None, None) and state.entries == len(run.entries)
    [timed] = FORMATS["claude-code"].import_file(
        SHARED / "samples/claude-code/spotter-short.jsonl", "f"
    )[0]
    state = fold_all(RunStatsProjection(), timed.entries)
    assert state is not None and not state.time_unknown and state.first_at is not None
