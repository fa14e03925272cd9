"""The pages in a real browser: Debian's Chromium (/usr/bin/chromium, installed by
tests/ensure-chromium) driven by Playwright through ``executable_path`` (no browser is
downloaded). Sign in, list and filter runs, open a run, expand a timeline row, open its entry;
the hostile run's markup is shown as text and no script from it runs."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, sync_playwright

from consumers.analytics import money
from consumers.render import as_of
from infra.settings import Settings
from tests.integration.web_support import (
    FLEETS,
    MARKER,
    Web,
    cli_json,
    publish_and_project,
    web_deployment,
)

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("AGENTLEDGER_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Runs before any page script: a script of the content that ran would leave its mark here.
TRAP = """
window.__ran = [];
Object.defineProperty(window, '__pwned', {
  set(v) { window.__ran.push(v); }, get() { return undefined; }
});
window.alert = (m) => window.__ran.push('alert:' + m);
"""


@pytest.fixture(scope="module")
def web(services: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    with web_deployment(services, tmp_path_factory.mktemp("web")) as found:
        yield found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: run tests/ensure-chromium")
    with sync_playwright() as p:
        found = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield found
        finally:
            found.close()


@contextmanager
def watched_page(browser: Browser) -> Iterator[Page]:
    """A fresh page whose scripts from the content (if any ran), dialogs and CSP refusals
    fail the test."""
    console: list[str] = []
    dialogs: list[str] = []
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.add_init_script(TRAP)
        page.on("console", lambda m: console.append(_line(m)))
        page.on("dialog", lambda d: _dismiss(d, dialogs))
        yield page
        assert page.evaluate("window.__ran") == []
    finally:
        context.close()
    assert dialogs == []
    # escaping kept the markup text: the CSP never had a script to refuse
    assert not [line for line in console if "Content Security Policy" in line], console


def test_a_person_signs_in_filters_opens_a_run_and_a_row(web: Web, browser: Browser) -> None:
    with watched_page(browser) as page:
        _walk(page, web)


def test_a_running_runs_page_grows_without_a_reload(web: Web, browser: Browser) -> None:
    """New rows appear on an open page of a running run as the engine commits them; when the
    run finishes its status changes, all without a reload."""
    with watched_page(browser) as page:
        page.goto(f"{web.base}/login?token={web.token_a}")
        page.goto(f"{web.base}/runs/{web.live_run}")
        assert page.locator("dd.status").inner_text() == "RUNNING"
        rows = page.locator("ol.timeline > li")
        before = rows.count()
        page.wait_for_timeout(300)  # the event stream is open
        # (a thread of its own: Playwright's sync API keeps an event loop in this one)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, publish_and_project(web.settings, web.withheld)).result()
        committed = time.monotonic()
        _until(lambda: rows.count() > before)
        latency = time.monotonic() - committed
        assert latency < 3.0  # (a guard; measured 0.10-0.29 s here, the poll is 0.25 s)
        _until(lambda: page.locator("dd.status").inner_text() != "RUNNING")
        timeline = _api_timeline(web)
        assert rows.count() == len(timeline["rows"])  # every row once, none twice
        assert page.locator("dd.status").inner_text() == timeline["status"]
        assert (
            page.locator("li.live summary .summary").last.inner_text()
            == (timeline["rows"][-1]["summary"])
        )
        # the script shows money by the pages' rule (unknown, never $0; no $0.0000 for a cent's
        # fraction)
        last_cost = timeline["rows"][-1].get("cost_so_far_usd")
        assert page.locator("li.live summary .sofar").last.inner_text() == (
            "cost so far " + ("unknown" if last_cost is None else money(last_cost))
        )
        page.locator("li.live summary").last.click()
        assert page.locator("li.live div.drill").last.is_visible()
        page.reload()
        assert rows.count() == len(timeline["rows"])
    print(f"live row latency (commit -> row in the browser): {latency:.3f} s")


def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``check`` (the page's CSP forbids the eval that ``wait_for_function`` needs)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the page did not change in time"
        time.sleep(0.02)


def _api_timeline(web: Web) -> Any:
    answer = httpx.get(
        f"{web.base}/api/v1/runs/{web.live_run}/timeline",
        params={"limit": 1000},
        headers={"Authorization": f"Bearer {web.token_a}"},
    )
    return {**answer.json(), **_api_header(web)}


def _api_header(web: Web) -> Any:
    answer = httpx.get(
        f"{web.base}/api/v1/runs/{web.live_run}",
        headers={"Authorization": f"Bearer {web.token_a}"},
    )
    return answer.json()


def _walk(page: Page, web: Web) -> None:
    page.goto(f"{web.base}/runs")
    assert "401" in page.locator("h1").inner_text()  # no token yet
    page.goto(f"{web.base}/login?token={web.token_a}")
    assert urlparse(page.url).path == "/runs"
    listed = page.locator("table.runs tbody tr")
    assert listed.count() == len(web.runs_of(FLEETS[0]))
    _shot(page, "runs")
    assert page.locator("table.runs").get_by_text(FLEETS[1]).count() == 0

    page.fill("input[name=search]", MARKER)
    page.click("button[type=submit]")
    assert parse_qs(urlparse(page.url).query)["search"] == [MARKER]  # the filter is in the URL
    assert listed.count() == 1
    task = listed.locator("td.task").inner_text()
    assert "<script>window.__pwned=1" in task and "<img src=x onerror=" in task

    page.click(f"a[href='/runs/{web.hostile_run}']")
    assert urlparse(page.url).path == f"/runs/{web.hostile_run}"
    assert page.locator("dd.status").inner_text()
    row = page.locator("ol.timeline details", has_text="IGNORE ALL PREVIOUS INSTRUCTIONS").first
    drill = row.locator("div.drill")
    assert not drill.is_visible()
    row.locator("summary").click()  # expands in place, no script needed
    assert drill.is_visible()
    row.scroll_into_view_if_needed()
    _shot(page, "run-row-open")
    assert '<svg onload="window.__pwned=3"></svg>' in drill.locator("pre.text").inner_text()
    assert page.locator("ol.timeline svg, ol.timeline img, [onload], [onerror]").count() == 0

    drill.get_by_role("link", name="Open entry").click()
    assert "/entries/" in page.url
    assert "IGNORE ALL PREVIOUS INSTRUCTIONS" in page.locator("main").inner_text()
    page.go_back()
    page.go_back()
    assert parse_qs(urlparse(page.url).query)["search"] == [MARKER]  # back to the filtered list

    # the working memory at any sequence number: the slider, then the next one
    page.goto(f"{web.base}/runs/{web.hostile_run}")
    page.click("text=working memory")
    slider = page.locator("input[name=at]")
    last = int(slider.get_attribute("max") or 0)
    assert last > 6 and slider.input_value() == str(last)  # it opens at the run's last entry
    slider.fill("5")
    page.click("form.filters button[type=submit]")
    assert parse_qs(urlparse(page.url).query)["at"] == ["5"]
    at_5 = cli_json(web.settings, "memory", web.hostile_run, "--at", "5", "--json")
    assert page.locator("p.asof").inner_text() == as_of(at_5["seq"], at_5["asked_seq"])
    assert slider.input_value() == "5"
    page.click("text=seq 6 →")
    assert parse_qs(urlparse(page.url).query)["at"] == ["6"]
    at_6 = cli_json(web.settings, "memory", web.hostile_run, "--at", "6", "--json")
    assert page.locator("p.asof").inner_text() == as_of(at_6["seq"], at_6["asked_seq"])
    goal = page.locator("dl.header dd").first.inner_text()
    assert goal == (at_6["state"].get("task_goal") or "-")

    page.goto(f"{web.base}/runs/{web.hostile_run}")
    page.click("text=compare with another run")
    other = next(r for r in web.runs_of(FLEETS[0]) if r != web.hostile_run)
    page.fill("input[name=b]", other)
    page.click("button[type=submit]")
    assert parse_qs(urlparse(page.url).query) == {"a": [web.hostile_run], "b": [other]}
    heads = page.locator("table.compare thead th a")
    assert heads.all_inner_texts() == [web.hostile_run, other]
    assert page.locator("table.timelines tbody tr").count() > 10
    _shot(page, "compare")


def _shot(page: Page, name: str) -> None:
    """A screenshot into $AGENTLEDGER_SCREENSHOTS (the README's come from here), if set."""
    folder = os.environ.get("AGENTLEDGER_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"{name}.png"))


def _line(message: ConsoleMessage) -> str:
    return f"{message.type}: {message.text}"


def _dismiss(dialog: Dialog, seen: list[str]) -> None:
    seen.append(dialog.message)
    dialog.dismiss()
