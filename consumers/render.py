"""Human-readable views of projection documents for the CLI."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def _lines(items: list[Any], fmt: str) -> list[str]:
    return [fmt.format(**item) if isinstance(item, dict) else str(item) for item in items]


def print_memory(console: Console, view: dict[str, Any]) -> None:
    m = view["state"]
    where = view.get("applied_seq", view.get("seq"))
    gaps = view.get("gaps") or []
    console.print(
        f"[bold]working memory[/] run {m['run_id']} (fleet {m['fleet_id']}), "
        f"snapshot v{m['snapshot_version']}, through seq {where}"
        + (f", [red]incomplete: missing {gaps}[/]" if gaps else "")
    )
    console.print(f"goal: {m.get('task_goal') or '-'}")
    for step in m.get("current_plan") or []:
        console.print(f"  plan: {step}")
    console.print(f"changed files: {', '.join(m.get('changed_files') or []) or '-'}")
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
    for title, items, fmt in sections:
        if items:
            console.print(f"[bold]{title}[/]")
            for line in _lines(items, fmt):
                console.print(f"  - {line}")


def print_manifest(console: Console, m: dict[str, Any]) -> None:
    console.print(
        f"[bold]{m['kind']} manifest[/] {m['manifest_id']} as of seq {m['as_of_sequence_no']}: "
        f"{len(m['items'])} items, {m['total_tokens']} tokens, "
        f"stable prefix {m.get('stable_prefix_tokens')} tokens"
    )
    console.print(f"by section: {m['tokens_by_section']}")
    console.print(f"by trust: {m['tokens_by_trust']}")
    for item in m["items"]:
        flags = f"  [yellow]{', '.join(item['flags'])}[/]" if item.get("flags") else ""
        console.print(
            f"  {item.get('section') or '-':<24} {item['item_kind']:<24} "
            f"{item['trust_level']:<20} {item['tokens']:>6}{flags}"
        )
    for v in m.get("violations", []):
        console.print(f"  [red]violation[/] {v}")
    for d in m.get("dropped", []):
        console.print(f"  [dim]dropped[/] {d}")
