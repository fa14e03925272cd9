"""Human-readable views of projection documents for the CLI."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape


def _lines(items: list[Any], fmt: str) -> list[str]:
    return [fmt.format(**item) if isinstance(item, dict) else str(item) for item in items]


def print_memory(console: Console, view: dict[str, Any]) -> None:
    m = view["state"]
    where = view.get("applied_seq", view.get("seq"))
    gaps = view.get("gaps") or []
    # every value is the run's own text (untrusted): escaped, so none is read as markup (a
    # `[link=...]` in a tool output would otherwise become a terminal hyperlink)
    console.print(
        f"[bold]working memory[/] run {escape(m['run_id'])} (fleet {escape(m['fleet_id'])}), "
        f"snapshot v{m['snapshot_version']}, {as_of(where, view.get('asked_seq'))}"
        + (f", [red]incomplete: missing {gaps}[/]" if gaps else "")
    )
    console.print(f"goal: {escape(m.get('task_goal') or '-')}")
    for step in m.get("current_plan") or []:
        console.print(f"  plan: {escape(str(step))}")
    console.print(f"changed files: {escape(changed_files(m))}")
    for title, lines in memory_sections(m):
        console.print(f"[bold]{title}[/]")
        for line in lines:
            console.print(f"  - {escape(line)}")


def changed_files(m: dict[str, Any]) -> str:
    """A memory's changed files in one line: those it lists, and how many more it changed
    (a memory lists the ones changed last; its evidence index lists them all)."""
    files = list(m.get("changed_files") or [])
    more = (m.get("changed_files_total") or 0) - len(files)
    listed = ", ".join(files) or "-"
    return f"{listed} (and {more} more in the evidence index)" if more > 0 else listed


def memory_sections(m: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The working memory's non-empty sections, each a title and its items as lines (the CLI
    prints them, the run's memory page lists them)."""
    sections = [
        (
            "known facts",
            [f for f in m.get("known_facts", []) if f.get("status") == "active"],
            "{fact}  <- {evidence}",
        ),
        (
            "superseded facts",
            [f for f in m.get("known_facts", []) if f.get("status") != "active"],
            "{fact}  (superseded by {superseded_by})",
        ),
        ("open problems", m.get("open_problems", []), "{problem}  <- {evidence}"),
        ("blocked by", m.get("blocked_by", []), "{kind}: {blocker}"),
        ("decisions", m.get("decisions", []), "{decision} ({reason})"),
        ("unsupported claims", m.get("unsupported_claims", []), "{claim}: {reason}"),
        ("flags", m.get("flags", []), "{}"),
    ]
    return [(title, _lines(items, fmt)) for title, items, fmt in sections if items]


def as_of(where: Any, asked: Any) -> str:
    """``through seq N``; for ``--at A`` where the memory last changed at N < A, say so."""
    if asked is None or asked == where:
        return f"through seq {where}"
    return (
        f"as it stood after seq {asked}: last changed by seq {where} "
        f"(entries after {where} did not change it)"
    )


def print_manifest(console: Console, m: dict[str, Any]) -> None:
    console.print(
        f"[bold]{m['kind']} manifest[/] {escape(str(m['manifest_id']))} as of seq "
        f"{m['as_of_sequence_no']}: "
        f"{len(m['items'])} items, {m['total_tokens']} tokens, "
        f"stable prefix {m.get('stable_prefix_tokens')} tokens"
    )
    console.print(f"tokens by section: {_tally(m['tokens_by_section'])}")
    console.print(f"tokens by trust: {_tally(m['tokens_by_trust'])}")
    for item in m["items"]:
        flags = f"  [yellow]{escape(', '.join(item['flags']))}[/]" if item.get("flags") else ""
        console.print(
            escape(
                f"  {item.get('section') or '-':<24} {item['item_kind']:<24} "
                f"{item['trust_level']:<20} {item['tokens']:>6}"
            )
            + flags
        )
    for v in m.get("violations", []):
        console.print(f"  [red]violation[/] {escape(violation_text(v))}")
    for d in m.get("dropped", []):
        console.print(f"  [dim]dropped[/] {escape(dropped_text(d))}")
    if m.get("dropped_omitted"):
        console.print(
            f"  [dim]dropped[/] {m['dropped_omitted']:,} more items, not listed "
            f"({m.get('dropped_tokens', 0):,} tokens dropped in all)"
        )


def _tally(counts: dict[str, int]) -> str:
    """``a 12 · b 3``, largest first; ``-`` when empty."""
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return " · ".join(f"{name} {n}" for name, n in ordered) or "-"


def violation_text(v: dict[str, Any]) -> str:
    """One line for a manifest violation: its code, the item it is about, why, and its source."""
    detail = str(v.get("detail") or "")
    if detail.endswith(" in section None"):
        detail = detail.removesuffix(" in section None") + " outside every section"
    source = f" (source entry {v['source_entry_id']})" if v.get("source_entry_id") else ""
    return f"{v.get('code')} at item {v.get('item_index')}: {detail}{source}"


def dropped_text(d: dict[str, Any]) -> str:
    """One line for an item dropped from the manifest for the budget."""
    of = d.get("tool_call_id") or d.get("source_entry_id") or "-"
    return f"{d.get('item_kind')} of {of}, {d.get('tokens')} tokens: {d.get('reason')}"
