"""Charts as inline SVG geometry, computed here so the templates only place it (no script, no
chart library): a run's cost so far along its timeline, a fleet's cost per day."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from consumers.analytics import money
from infra.cli_support import bounded

WIDTH = 600
HEIGHT = 120


@dataclass(frozen=True)
class Line:
    points: str  # the polyline's "x,y x,y ..."
    top_usd: Decimal  # the value at the chart's top edge


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    value: str


def cost_line(rows: Sequence[dict[str, Any]]) -> Line | None:
    """The run's cost so far at each timeline row (rows before any known cost are left out);
    None when no row has a known cost."""
    known = [
        (n, Decimal(str(r["cost_so_far_usd"])))
        for n, r in enumerate(rows)
        if r.get("cost_so_far_usd") is not None
    ]
    if not known:
        return None
    top = max(v for _, v in known) or Decimal(1)
    span = max(len(rows) - 1, 1)
    points = " ".join(
        f"{WIDTH * n / span:.1f},{HEIGHT - float(v / top) * HEIGHT:.1f}" for n, v in known
    )
    return Line(points, top)


def bars(items: Sequence[tuple[str, Any]]) -> list[Bar]:
    """A bar per (label, USD or None) in order; an unknown value is a bar of height 0 whose
    value reads ``unknown``."""
    values = [Decimal(str(v)) if v is not None else None for _, v in items]
    top = max((v for v in values if v is not None), default=Decimal(0)) or Decimal(1)
    step = WIDTH / max(len(items), 1)
    out = []
    for n, ((label, _), value) in enumerate(zip(items, values, strict=True)):
        height = float(value / top) * HEIGHT if value is not None else 0.0
        shown = bounded(value, money)
        out.append(Bar(n * step + 1, HEIGHT - height, max(step - 2, 1), height, label, shown))
    return out


PALETTE = ("#4a78a8", "#e08a3c", "#5aa469", "#c8504b", "#8a6bb8", "#8c6d5a", "#d67fb8", "#7f7f7f")


@dataclass(frozen=True)
class Segment:
    x: float
    y: float
    width: float
    height: float
    label: str  # the bar's (a day)
    series: str  # the segment's (a model, a failure class)
    value: str
    color: str


def stacked(
    items: Sequence[tuple[str, str, Any]], unit: str = "usd"
) -> tuple[list[Segment], list[tuple[str, str]]]:
    """A bar per label (in the order first given) stacked with a segment per (label, series,
    value); a value of None is a segment of height 0 that reads ``unknown``. ``unit``: ``usd``
    or ``count``. Also the legend: (series, color), series in sorted order (colors repeat after
    eight)."""
    labels = list(dict.fromkeys(label for label, _, _ in items))
    series = sorted({s for _, s, _ in items})
    color = {s: PALETTE[n % len(PALETTE)] for n, s in enumerate(series)}
    values = [Decimal(str(v)) if v is not None else None for _, _, v in items]
    totals: dict[str, Decimal] = {}
    for (label, _, _), value in zip(items, values, strict=True):
        totals[label] = totals.get(label, Decimal(0)) + (value or Decimal(0))
    top = max(totals.values(), default=Decimal(0)) or Decimal(1)
    step = WIDTH / max(len(labels), 1)
    base = dict.fromkeys(labels, float(HEIGHT))
    out = []
    for (label, name, _), value in zip(items, values, strict=True):
        height = float(value / top) * HEIGHT if value is not None else 0.0
        base[label] -= height
        shown = _shown(value, unit)
        x = labels.index(label) * step + 1
        out.append(
            Segment(x, base[label], max(step - 2, 1), height, label, name, shown, color[name])
        )
    return out, [(s, color[s]) for s in series]


def _shown(value: Decimal | None, unit: str) -> str:
    return bounded(value, money if unit == "usd" else "{:,}".format)
