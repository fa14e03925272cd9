"""The pages in a real browser: Debian's Chromium (/usr/bin/chromium, installed by
tests/ensure-chromium) driven by Playwright through ``executable_path`` (no browser is
downloaded). Sign in, list and filter runs, open a run, expand a timeline row, open its entry;
the hostile run's markup is shown as text and no script from it runs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import ConsoleMessage, Dialog, Page, sync_playwright

from infra.settings import Settings
from tests.integration.web_support import FLEETS, MARKER, Web, web_deployment

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


def test_a_person_signs_in_filters_opens_a_run_and_a_row(web: Web) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: run tests/ensure-chromium")
    console: list[str] = []
    dialogs: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.add_init_script(TRAP)
            page.on("console", lambda m: console.append(_line(m)))
            page.on("dialog", lambda d: _dismiss(d, dialogs))
            _walk(page, web)
            assert page.evaluate("window.__ran") == []
        finally:
            browser.close()
    assert dialogs == []
    # escaping kept the markup text: the CSP never had an inline script to refuse
    assert not [line for line in console if "Content Security Policy" in line], console


def _walk(page: Page, web: Web) -> None:
    page.goto(f"{web.base}/runs")
    assert "401" in page.locator("h1").inner_text()  # no token yet
    page.goto(f"{web.base}/login?token={web.token_a}")
    assert urlparse(page.url).path == "/runs"
    listed = page.locator("table.runs tbody tr")
    assert listed.count() == len(web.runs_of(FLEETS[0]))
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
    assert '<svg onload="window.__pwned=3"></svg>' in drill.locator("pre.text").inner_text()
    assert page.locator("svg").count() == 0 and page.locator("ol.timeline img").count() == 0

    drill.get_by_role("link", name="Open entry").click()
    assert "/entries/" in page.url
    assert "IGNORE ALL PREVIOUS INSTRUCTIONS" in page.locator("main").inner_text()
    page.go_back()
    page.go_back()
    assert parse_qs(urlparse(page.url).query)["search"] == [MARKER]  # back to the filtered list

    page.goto(f"{web.base}/runs/{web.hostile_run}")
    page.click("text=compare with another run")
    other = next(r for r in web.runs_of(FLEETS[0]) if r != web.hostile_run)
    page.fill("input[name=b]", other)
    page.click("button[type=submit]")
    assert parse_qs(urlparse(page.url).query) == {"a": [web.hostile_run], "b": [other]}
    heads = page.locator("table.compare thead th a")
    assert heads.all_inner_texts() == [web.hostile_run, other]
    assert page.locator("table.timelines tbody tr").count() > 10


def _line(message: ConsoleMessage) -> str:
    return f"{message.type}: {message.text}"


def _dismiss(dialog: Dialog, seen: list[str]) -> None:
    seen.append(dialog.message)
    dialog.dismiss()
