"""The read side of ``agentledger bench --web``: what the web answers cost, each beside a
baseline timed in the same run.

- runs list: ``GET /api/v1/runs`` and the ``/runs`` page, p50/p99 of ``samples`` requests for
  each of several filter and sort sets, beside the bare SQL query of the same set
  (:func:`projectors.stores.postgres_ops.find_runs` on one open connection);
- a big run's page in Chromium: ``domInteractive`` of the run page (navigation timing), beside
  the time the server took to answer the same page to a plain HTTP client;
- live rows: from the engine's commit of a new entry to its row in the open page (a
  ``MutationObserver`` stamps each new row with the wall clock), beside the time from publish to
  that commit.

Chromium is Debian's (``executable_path``); nothing downloads a browser.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import httpx

from consumers.web.app import run_cursor
from infra.settings import Settings
from projectors.stores import postgres_ops as ops

CHROMIUM = "/usr/bin/chromium"  # Debian's (AGENTLEDGER_CHROMIUM names another)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
# (label, query string of /api/v1/runs and /runs, find_runs' keyword arguments)
RunQuery = tuple[str, dict[str, str], dict[str, Any]]
Figure = tuple[str, float, str, str, float | None]
DEEP = 10_000  # the deep page starts after this many runs
BUDGET_S = 15.0  # at most this long timing one query one way

# The runs list's queries timed: what a person asks most, and the ones no index serves.
RUN_QUERIES: tuple[RunQuery, ...] = (
    ("newest first (default)", {}, {}),
    ("status FAILED", {"status": "FAILED"}, {"status": "FAILED"}),
    (
        "one fleet, sort first",
        {"fleet": "fleet-01", "sort": "first"},
        {"fleet": "fleet-01", "sort": "first"},
    ),
    ("sort entries", {"sort": "entries"}, {"sort": "entries"}),
    ("class verifier", {"class": "verifier"}, {"failure_class": "verifier"}),
    # its cursor (keyset: the 10,000th run's last entry time and id) is found before timing
    ("page after 10,000 runs", {"cursor": "deep"}, {"after": "deep"}),
    ("model gpt-4.1", {"model": "gpt-4.1"}, {"model": "gpt-4.1"}),
    ("sort cost", {"sort": "cost"}, {"sort": "cost"}),
    ("text search", {"search": "pagination"}, {"text": "pagination"}),
)


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (the nearest rank at or above it)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _timed(call: Callable[[], Any], samples: int, budget_s: float = BUDGET_S) -> list[float]:
    """Seconds of each of ``samples`` calls after a warming one; fewer when they have taken
    ``budget_s`` already (a query no index serves may take seconds each)."""
    call()  # warm: the first answer pays for connections and plans
    out: list[float] = []
    spent = 0.0
    while len(out) < samples and spent < budget_s:
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
        spent += out[-1]
    return out


def runs_list(
    settings: Settings,
    base: str,
    token: str,
    fleets: Sequence[str],
    queries: Sequence[RunQuery],
    samples: int,
) -> list[Figure]:
    """p99 of the API and the page per query, each beside the bare SQL query's p99."""
    figures: list[Figure] = []
    headers = {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=base, headers=headers, timeout=60) as client,
        ops.connect(settings.pg_address) as conn,
    ):
        deep: dict[str, Any] = {}
        for label, params, kwargs in queries:
            if params.get("cursor") == "deep" and not deep:
                tenth = ops.find_runs(conn, fleets=list(fleets), limit=DEEP)[-1]
                conn.rollback()
                deep = {"cursor": run_cursor("last", tenth), "after": ops.run_key("last", tenth)}
            if params.get("cursor") == "deep":
                params = {**params, "cursor": deep["cursor"]}
                kwargs = {**kwargs, "after": deep["after"]}
            query = urlencode(params)

            def api(query: str = query) -> None:
                client.get(f"/api/v1/runs?{query}").raise_for_status()

            def page(query: str = query) -> None:
                client.get(f"/runs?{query}").raise_for_status()

            def bare(kwargs: Mapping[str, Any] = kwargs) -> None:
                ops.find_runs(conn, fleets=list(fleets), limit=51, **kwargs)
                conn.rollback()

            sql_s = _timed(bare, samples)
            api_s = _timed(api, samples)
            page_s = _timed(page, samples)
            base_ms = round(pct(sql_s, 0.99) * 1000, 1)
            sql_name = f"bare SQL query p99 (n={len(sql_s)})"
            label = f"{label} (n={len(api_s)}, {len(page_s)})"
            figures += [
                (
                    f"web: /api/v1/runs p99, {label}",
                    round(pct(api_s, 0.99) * 1000, 1),
                    "ms",
                    sql_name,
                    base_ms,
                ),
                (
                    f"web: /runs page p99, {label}",
                    round(pct(page_s, 0.99) * 1000, 1),
                    "ms",
                    sql_name,
                    base_ms,
                ),
                (
                    f"web: /api/v1/runs p50, {label}",
                    round(pct(api_s, 0.5) * 1000, 1),
                    "ms",
                    "bare SQL query p50",
                    round(pct(sql_s, 0.5) * 1000, 1),
                ),
            ]
    return figures


async def _browser(chromium: str) -> Any:
    from playwright.async_api import async_playwright

    driver = await async_playwright().start()
    browser = await driver.chromium.launch(
        executable_path=chromium, args=CHROMIUM_ARGS, headless=True
    )
    return driver, browser


async def _signed_in(browser: Any, base: str, token: str) -> Any:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    answer = await page.goto(f"{base}/login?token={token}")
    if answer is None or not answer.ok:
        raise RuntimeError("the bench could not sign in to its web server")
    return context, page


async def big_page(
    base: str, token: str, run_id: str, loads: int, chromium: str = CHROMIUM
) -> list[Figure]:
    """Time to interactive of ``run_id``'s page in Chromium, p50 and p99 of ``loads`` loads,
    beside the server's answer time for the same page."""
    url = f"{base}/runs/{run_id}"
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        # the first answer assembles the run's timeline; the timed ones after it are served
        # from the assembly the server keeps until the run's rows are written again
        started = time.perf_counter()
        size = len(client.get(url).raise_for_status().content)
        first = time.perf_counter() - started
        served = await asyncio.to_thread(_timed, lambda: client.get(url).raise_for_status(), loads)
    driver, browser = await _browser(chromium)
    try:
        context, page = await _signed_in(browser, base, token)
        interactive: list[float] = []
        await page.goto(url)  # warm, as the timed loads after it
        for _ in range(loads):
            await page.goto(url, wait_until="load")
            timing = await page.evaluate(
                "() => { const n = performance.getEntriesByType('navigation')[0];"
                " return n.domInteractive - n.startTime; }"
            )
            interactive.append(float(timing) / 1000)
        await context.close()
    finally:
        await browser.close()
        await driver.stop()
    server_name = f"the server's answer for the page ({size / 1000:.0f} KB), p99"
    return [
        (
            "web: big run page, time to interactive p99",
            round(pct(interactive, 0.99) * 1000, 1),
            "ms",
            server_name,
            round(pct(served, 0.99) * 1000, 1),
        ),
        (
            "web: big run page, the server's first answer (its timeline assembled)",
            round(first * 1000, 1),
            "ms",
            "the answers after it, p50",
            round(pct(served, 0.5) * 1000, 1),
        ),
        (
            "web: big run page, time to interactive p50",
            round(pct(interactive, 0.5) * 1000, 1),
            "ms",
            "the server's answer, p50",
            round(pct(served, 0.5) * 1000, 1),
        ),
    ]


# Each live row added to the page is stamped with the wall clock (ms since the epoch).
_OBSERVE = """
() => {
  window.__seen = [];
  const list = document.querySelector('ol.timeline[data-events]');
  new MutationObserver((changes) => {
    const now = performance.timeOrigin + performance.now();
    for (const change of changes) {
      for (const node of change.addedNodes) {
        if (node.nodeName === 'LI') { window.__seen.push(now); }
      }
    }
  }).observe(list, { childList: true });
  return list !== null;
}
"""


async def live_rows(
    base: str,
    token: str,
    run_id: str,
    steps: int,
    step: Callable[[], Awaitable[tuple[float, float]]],
    chromium: str = CHROMIUM,
) -> list[Figure]:
    """Commit -> row in the open page of a running run, over ``steps`` entries committed one
    at a time by ``step`` (which returns the commit's wall-clock time and publish -> commit
    seconds)."""
    driver, browser = await _browser(chromium)
    latency: list[float] = []
    publish: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    try:
        context, page = await _signed_in(browser, base, token)
        await page.goto(f"{base}/runs/{run_id}")
        if not await page.evaluate(_OBSERVE):
            raise RuntimeError(f"run {run_id}'s page does not follow it (is it running?)")
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as client:

            async def rows() -> int:
                answer = await client.get(f"/api/v1/runs/{run_id}")
                answer.raise_for_status()
                return int(answer.json()["row_count"])

            first = shown = await rows()
            await asyncio.sleep(1.0)  # the page's event stream connected
            for _ in range(steps):
                committed, took = await step()
                publish.append(took)
                now = await rows()  # an entry may make no timeline row, or several
                if now == shown:
                    continue
                await page.wait_for_function(
                    "n => window.__seen.length >= n", arg=now - first, timeout=30_000
                )
                seen = await page.evaluate(f"() => window.__seen[{shown - first}]")
                latency.append(float(seen) / 1000 - committed)
                shown = now
        await context.close()
    finally:
        await browser.close()
        await driver.stop()
    return [
        (
            "web: live row, commit -> row in the browser p99",
            round(pct(latency, 0.99) * 1000, 1),
            "ms",
            "publish -> engine commit p99",
            round(pct(publish, 0.99) * 1000, 1),
        ),
        (
            "web: live row, commit -> row in the browser p50",
            round(pct(latency, 0.5) * 1000, 1),
            "ms",
            "publish -> engine commit p50",
            round(pct(publish, 0.5) * 1000, 1),
        ),
        ("web: live rows timed", float(len(latency)), "rows", "", None),
    ]
