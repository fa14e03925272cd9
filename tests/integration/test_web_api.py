"""``agentledger serve`` on the real stack: published runs (publisher, Kafka, engine,
PostgreSQL) read back through the HTTP API and the pages with httpx, against the CLI's
``--json`` for the same runs; tokens, their fleets, and hostile text."""

from __future__ import annotations

import asyncio
import html
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from markupsafe import escape
from typer.testing import CliRunner

from consumers import analytics, queries
from consumers.access import create_token, revoke_token
from consumers.queries import cost_text
from infra.main import app
from infra.settings import Settings
from projectors.stores import postgres_ops as ops
from schemas.json_form import from_json, to_json
from schemas.models import LedgerEntry, ModelUsagePart
from streams.simulate import simulate, simulate_runs
from tests.integration.web_support import (
    FLEETS,
    HOSTILE_REPOSITORY,
    HOSTILE_TASK,
    HOSTILE_TOOL,
    MARKER,
    Web,
    free_port,
    publish_and_project,
    web_deployment,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def web(services: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    with web_deployment(services, tmp_path_factory.mktemp("web")) as found:
        yield found


def _cli(web: Web, *args: str) -> Any:
    env = {
        "AGENTLEDGER_PG_DSN": web.settings.pg_address,
        "AGENTLEDGER_TOPIC_PREFIX": web.settings.topic_prefix,
        "COLUMNS": "200",
    }
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _api(web: Web, path: str, token: str | None = None, **params: Any) -> Any:
    response = _get(web, path, token or web.token_a, **params)
    assert response.status_code == 200, response.text
    return response.json()


def _get(web: Web, path: str, token: str | None, **params: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(web.base + path, headers=headers, params=params, timeout=30)


def _all_rows(web: Web, run_id: str, limit: int) -> list[Any]:
    rows: list[Any] = []
    cursor = None
    while True:
        page = _api(web, f"/api/v1/runs/{run_id}/timeline", limit=limit, cursor=cursor or "")
        assert len(page["rows"]) <= limit
        rows += page["rows"]
        cursor = page["next_cursor"]
        if cursor is None:
            return rows


def test_the_cli_and_the_api_give_the_same_documents(web: Web) -> None:
    for run_id in web.runs_of(FLEETS[0]):
        timeline = _cli(web, "timeline", run_id, "--json")
        header = _api(web, f"/api/v1/runs/{run_id}")
        assert header.pop("row_count") == len(timeline["rows"])
        assert {**header, "rows": _all_rows(web, run_id, 7)} == timeline
        assert _api(web, f"/api/v1/runs/{run_id}/costs") == timeline["cost"]
        assert _api(web, f"/api/v1/runs/{run_id}/memory") == _cli(web, "memory", run_id, "--json")
        assert _api(web, f"/api/v1/runs/{run_id}/memory", at=9) == _cli(
            web, "memory", run_id, "--at", "9", "--json"
        )
        assert _api(web, f"/api/v1/runs/{run_id}/context") == _cli(web, "context", run_id, "--json")
        assert _api(web, f"/api/v1/runs/{run_id}/failure") == _cli(
            web, "failures", run_id, "--json"
        )
        call = next(r for r in timeline["rows"] if r["kind"] == "model-call")["refs"]["entry"]
        assert _api(web, f"/api/v1/runs/{run_id}/context", call=call) == _cli(
            web, "context", run_id, "--call", call, "--json"
        )
        entry = _api(web, f"/api/v1/runs/{run_id}/entries/{timeline['rows'][0]['seq']}")
        assert entry["rows"] == [r for r in timeline["rows"] if r["seq"] == entry["seq"]]
    env = {"AGENTLEDGER_PG_DSN": web.settings.pg_address, "COLUMNS": "200"}
    rendered = CliRunner().invoke(app, ["context", run_id, "--render"], env=env).stdout
    assert _api(web, f"/api/v1/runs/{run_id}/context/rendered")["text"] + "\n" == rendered
    model_row = next(r for r in timeline["rows"] if r["kind"] == "model-call")
    entry = _api(web, f"/api/v1/runs/{run_id}/entries/{model_row['seq']}")
    assert entry["manifests"][model_row["refs"]["entry"]]["items"]  # what that call saw


FILTERS: list[dict[str, str]] = [
    {},
    {"status": "RUNNING"},
    {"status": "failed"},
    {"class": "none"},
    {"search": MARKER.upper()},
    {"cost_above": "0.001"},
    {"since": "2026-11-01", "until": "2030-01-01"},
    {"sort": "cost"},
    {"sort": "entries"},
    {"sort": "id", "fleet": FLEETS[0]},
    {"model": "anthropic/claude-haiku-4-5"},
    {"model": "o4-mini", "sort": "cost"},
    {"outcome": "running"},
    {"outcome": "failed", "sort": "entries"},
    {"repository": HOSTILE_REPOSITORY},
    {"repository": "github.com/example/shop", "sort": "cost"},
]


@pytest.mark.parametrize("query", FILTERS, ids=lambda q: ",".join(q) or "none")
def test_the_runs_filters_match_the_cli(web: Web, query: dict[str, str]) -> None:
    args = [f"--{'cost-above' if k == 'cost_above' else k}={v}" for k, v in query.items()]
    if query.get("outcome"):  # the runs of that outcome and only those
        every = _api(web, "/api/v1/runs", limit=1000)["runs"]
        kept = _api(web, "/api/v1/runs", **query)["runs"]
        assert kept and {r["outcome"] for r in kept} == {query["outcome"]}
        assert len(kept) == sum(r["outcome"] == query["outcome"] for r in every)
    cli = [r for r in _cli(web, "runs", "--json", *args) if r["fleet_id"] == FLEETS[0]]
    assert _api(web, "/api/v1/runs", **query)["runs"] == cli
    if query.get("search") or query.get("repository") == HOSTILE_REPOSITORY:
        assert [r["run_id"] for r in cli] == [web.hostile_run]
    if query.get("repository") == "github.com/example/shop":  # every other run of the fleet
        assert {r["run_id"] for r in cli} == set(web.runs_of(FLEETS[0])) - {web.hostile_run}
    if query.get("model"):  # the runs that called it, as the published entries say
        used = {
            e.run_id
            for e in web.sent
            for p in e.parts
            if isinstance(p, ModelUsagePart)
            and query["model"] in (p.model, f"{p.provider}/{p.model}")
        }
        assert {r["run_id"] for r in cli} == used & set(web.runs_of(FLEETS[0])) != set()


def test_runs_pages_follow_the_cursor(web: Web) -> None:
    """Keyset cursors: for every sort, the pages add up to the whole list; a cursor is its
    sort's (test_runs_cli crosses from known to unknown costs)."""
    for sort in ("id", "last", "first", "cost", "entries"):
        whole = _api(web, "/api/v1/runs", sort=sort)
        assert whole["next_cursor"] is None
        assert len(whole["runs"]) == len(web.runs_of(FLEETS[0]))
        paged, cursor = [], ""
        while True:
            page = _api(web, "/api/v1/runs", sort=sort, limit=2, cursor=cursor)
            paged += page["runs"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert paged == whole["runs"], sort
    first = _api(web, "/api/v1/runs", sort="cost", limit=1)["next_cursor"]
    assert _get(web, "/api/v1/runs", web.token_a, sort="last", cursor=first).status_code == 400
    assert _get(web, "/api/v1/runs", web.token_a, cursor="not-a-cursor").status_code == 400
    assert _get(web, "/api/v1/runs", web.token_a, sort="cheapest").status_code == 400
    assert _get(web, "/api/v1/runs", web.token_a, outcome="won").status_code == 400


def test_the_diffs_and_the_replay_package_are_the_clis(web: Web, tmp_path: Path) -> None:
    """``/diffs`` is the diff-timelines state the timeline header sums up; ``/replay-package``
    is the folder ``agentledger replay-package RUN`` writes, as one document."""
    run_id = web.runs_of(FLEETS[0])[0]
    diffs = _api(web, f"/api/v1/runs/{run_id}/diffs")
    timeline = _cli(web, "timeline", run_id, "--json")
    assert diffs["run_id"] == run_id and diffs["summary"] == timeline["diff"]["summary"]
    assert diffs["files"] and "rows" not in diffs
    env = {
        "AGENTLEDGER_PG_DSN": web.settings.pg_address,
        "AGENTLEDGER_TOPIC_PREFIX": web.settings.topic_prefix,
    }
    out = tmp_path / "package"
    done = CliRunner().invoke(app, ["replay-package", run_id, "--out", str(out)], env=env)
    assert done.exit_code == 0, done.output
    doc = _api(web, f"/api/v1/runs/{run_id}/replay-package")
    written = json.loads((out / "package.json").read_text())
    assert doc["package"] | {"created_at": None} == written | {"created_at": None}
    lines = (out / "entries.jsonl").read_text().splitlines()
    assert doc["entries"] == [json.loads(line) for line in lines]
    assert len(doc["entries"]) == len(written["entries"]) > 0
    assert doc["schemas"] == {
        v: (out / "schemas" / f"ledger_entry.v{v}.avsc").read_text() for v in written["schemas"]
    }


def test_a_token_sees_only_its_fleets(web: Web) -> None:
    other = web.runs_of(FLEETS[1])[0]
    for path in (
        f"/api/v1/runs/{other}",
        f"/api/v1/runs/{other}/timeline",
        f"/api/v1/runs/{other}/memory",
        f"/api/v1/runs/{other}/entries/1",
        f"/api/v1/runs/{other}/diffs",
        f"/api/v1/runs/{other}/replay-package",
        f"/runs/{other}",
        f"/runs/{other}/entries/1",
        "/api/v1/runs/no-such-run",
    ):
        assert _get(web, path, web.token_a).status_code == 404, path
    assert _get(web, f"/api/v1/runs/{other}", web.token_b).status_code == 200
    assert _get(web, "/api/v1/runs", web.token_a, fleet=FLEETS[1]).status_code == 403
    assert _get(web, "/api/v1/dead-letters", web.token_a, fleet=FLEETS[1]).status_code == 403
    b_runs = _api(web, "/api/v1/runs", web.token_b)["runs"]
    assert {r["run_id"] for r in b_runs} == set(web.runs_of(FLEETS[1]))
    letters = _api(web, "/api/v1/dead-letters")["dead_letters"]
    assert [d["error_class"] for d in letters] == ["LedgerDecodeError"]
    assert _api(web, "/api/v1/dead-letters", web.token_b)["dead_letters"] == []


def test_nothing_answers_without_a_valid_token(web: Web) -> None:
    assert _get(web, "/health", None).json() == {"status": "ok"}
    for token in (None, "alt_nope", web.revoked, web.expired, web.token_a + "x"):
        for path in ("/api/v1/runs", "/api/v1/openapi.json", "/runs", "/dead-letters", "/"):
            assert _get(web, path, token).status_code == 401, (path, token)
    spec = _api(web, "/api/v1/openapi.json")
    assert "/api/v1/runs/{run_id}/timeline" in spec["paths"]
    login = httpx.get(f"{web.base}/login", params={"token": web.token_a}, follow_redirects=False)
    assert login.status_code == 303 and login.headers["location"] == "/runs"
    page = httpx.get(f"{web.base}/runs", cookies=dict(login.cookies))
    assert page.status_code == 200 and "HttpOnly" in login.headers["set-cookie"]
    assert httpx.get(f"{web.base}/login", params={"token": web.revoked}).status_code == 401


def test_tokens_are_kept_only_as_hashes(web: Web) -> None:
    made = _cli(web, "tokens", "create", "--fleet", FLEETS[1], "--expires", "2h", "--json")
    assert made["token"].startswith("alt_") and made["fleets"] == [FLEETS[1]]
    listed = {t["token_id"]: t for t in _cli(web, "tokens", "list", "--json")}
    assert made["token_id"] in listed and made["token"] not in json.dumps(listed)
    with psycopg.connect(web.settings.pg_address) as conn:
        dump = conn.execute("SELECT al_api_tokens::text FROM al_api_tokens").fetchall()
    assert not any(made["token"] in row for (row,) in dump)
    assert _get(web, "/api/v1/runs", made["token"]).status_code == 200
    env = {"AGENTLEDGER_PG_DSN": web.settings.pg_address}
    result = CliRunner().invoke(app, ["tokens", "revoke", made["token_id"]], env=env)
    assert result.exit_code == 0
    assert _get(web, "/api/v1/runs", made["token"]).status_code == 401


def test_pages_show_hostile_text_as_text(web: Web) -> None:
    cookies = {"al_session": web.token_a}
    runs = httpx.get(f"{web.base}/runs", params={"search": MARKER}, cookies=cookies)
    run = httpx.get(f"{web.base}/runs/{web.hostile_run}", cookies=cookies)
    for page in (runs, run):
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "script-src 'self';" in csp and "default-src 'none'" in csp and "unsafe" not in csp
        assert _tags(page.text) == set()
        assert "&lt;script&gt;window.__pwned=1" in page.text
    listed = httpx.get(f"{web.base}/runs", cookies=cookies).text
    for row in _api(web, "/api/v1/runs")["runs"]:  # each cost in words, as the CLI's table has it
        assert f'<td class="cost">{html.escape(cost_text(row))}</td>' in listed
    assert "IGNORE ALL PREVIOUS INSTRUCTIONS" in run.text and "&lt;svg onload=" in run.text
    assert HOSTILE_TASK not in run.text and HOSTILE_TOOL not in run.text


def _tags(html: str) -> set[str]:
    """The raw markup of the hostile strings that occurs in ``html`` (escaped text is none)."""
    raw = ("<script>window", "<img src=x", "<svg onload", 'href="javascript')
    return {t for t in raw if t in html}


def test_agentledger_serve_serves_the_app(web: Web) -> None:
    """The console command itself: ``agentledger serve --port P`` answers, and stops on
    SIGTERM."""
    port = free_port()
    env = {**os.environ, "AGENTLEDGER_PG_DSN": web.settings.pg_address}
    serve = [sys.executable, "-c", "from infra.main import main; main()", "serve"]
    server = subprocess.Popen([*serve, "--port", str(port)], env=env, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "serve did not start"
            time.sleep(0.1)
        answer = httpx.get(
            f"{base}/api/v1/runs", headers={"Authorization": f"Bearer {web.token_a}"}
        )
        assert len(answer.json()["runs"]) == len(web.runs_of(FLEETS[0]))
    finally:
        server.terminate()
        # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught
        assert server.wait(20) in (0, -signal.SIGTERM)


def test_the_memory_and_next_turn_pages_say_what_the_cli_says(web: Web) -> None:
    cookies = {"al_session": web.token_a}
    run_id = web.hostile_run
    env = {"AGENTLEDGER_PG_DSN": web.settings.pg_address, "COLUMNS": "500"}
    at_nine = httpx.get(f"{web.base}/runs/{run_id}/memory", params={"at": 9}, cookies=cookies)
    assert at_nine.status_code == 200
    memory = _cli(web, "memory", run_id, "--at", "9", "--json")
    said = f"as it stood after seq 9: last changed by seq {memory['seq']}"
    assert (said if memory["seq"] != 9 else "through seq 9") in at_nine.text
    assert escape(memory["state"]["task_goal"]) in at_nine.text
    assert 'name="at"' in at_nine.text and "?at=10" in at_nine.text  # the slider, its steps
    turn = httpx.get(f"{web.base}/runs/{run_id}/context", cookies=cookies)
    rendered = CliRunner().invoke(app, ["context", run_id, "--render"], env=env).stdout
    assert escape(rendered.rstrip("\n")) in turn.text  # escaped as the pages escape


def test_compare_puts_two_runs_side_by_side_as_the_cli_reads_them(web: Web) -> None:
    a, b = web.runs_of(FLEETS[0])[:2]
    doc = _api(web, "/api/v1/compare", a=a, b=b)
    outcomes = {r["run_id"]: r["outcome"] for r in _cli(web, "runs", "--json", "--limit", "100")}
    for run_id, shown in zip((a, b), doc["runs"], strict=True):
        keys = ("outcome", "changed_files", "changed_files_total", "row_count")
        extra = {k: shown.pop(k) for k in keys}
        assert shown == _cli(web, "timeline", run_id, "--json")
        assert extra["outcome"] == outcomes[run_id]
        memory = _cli(web, "memory", run_id, "--json")
        assert extra["changed_files"] == memory["state"]["changed_files"]
        assert extra["changed_files_total"] == memory["state"]["changed_files_total"]
    other = web.runs_of(FLEETS[1])[0]
    assert _get(web, "/api/v1/compare", web.token_a, a=a, b=other).status_code == 404
    page = httpx.get(
        f"{web.base}/compare", params={"a": a, "b": b}, cookies={"al_session": web.token_a}
    )
    assert page.status_code == 200
    assert all(escape(outcomes[r]) in page.text for r in (a, b))
    # the timelines come a page of pairs at a time (two 10,006-entry runs made a 2.25 MB page)
    pairs = max(len(_cli(web, "timeline", r, "--json")["rows"]) for r in (a, b))
    assert pairs < 200 and f"rows 1 to {pairs} of {pairs}" in page.text
    assert 'rel="next"' not in page.text and 'rel="prev"' not in page.text
    later = httpx.get(
        f"{web.base}/compare",
        params={"a": a, "b": b, "start": 5},
        cookies={"al_session": web.token_a},
    )
    assert f"rows 6 to {pairs} of {pairs}" in later.text and 'rel="prev"' in later.text
    assert '<td class="num">6</td>' in later.text and '<td class="num">5</td>' not in later.text
    past = httpx.get(
        f"{web.base}/compare",
        params={"a": a, "b": b, "start": 5000},
        cookies={"al_session": web.token_a},
    )
    assert f"rows 1 to {pairs} of {pairs}" in past.text  # past the end: the last page


def test_the_event_stream_sends_each_row_once_then_the_end(web: Web) -> None:
    run_id = web.hostile_run  # finished: the stream sends the rows past `after`, then `end`
    rows = _cli(web, "timeline", run_id, "--json")["rows"]
    bearer = {"Authorization": f"Bearer {web.token_a}"}
    events: list[tuple[str, str, str]] = []
    url = f"{web.base}/api/v1/runs/{run_id}/events"
    with httpx.stream("GET", url, params={"after": 3}, headers=bearer, timeout=30) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in answer.iter_lines():
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if "event" in fields:
                events.append((fields["event"], fields.get("id", ""), fields["data"]))
            fields = {}
    assert [json.loads(d) for e, _, d in events if e == "row"] == rows[3:]
    assert [i for e, i, _ in events if e == "row"] == [str(n) for n in range(3, len(rows))]
    assert events[-1][0] == "end" and json.loads(events[-1][2])["status"] != "RUNNING"
    resumed = {**bearer, "Last-Event-ID": str(len(rows) - 2)}
    with httpx.stream("GET", url, headers=resumed, timeout=30) as answer:
        sent = [line for line in answer.iter_lines() if line.startswith("event: ")]
    assert sent == ["event: row", "event: end"]
    other = web.runs_of(FLEETS[1])[0]
    assert _get(web, f"/api/v1/runs/{other}/events", web.token_a).status_code == 404


def test_fleet_roll_ups_are_the_clis_for_the_tokens_fleet(web: Web) -> None:
    for by in ("model", "day", "run", "purpose", "day-model"):
        cli = _cli(web, "costs", "--by", by, "--fleet", FLEETS[0], "--json")
        assert _api(web, "/api/v1/costs", by=by) == cli
        assert _api(web, "/api/v1/costs", by=by, fleet=FLEETS[0], since="2026-01-01") == _cli(
            web, "costs", "--by", by, "--fleet", FLEETS[0], "--since", "2026-01-01", "--json"
        )
    failures = _cli(web, "failures", "--fleet", FLEETS[0], "--json")
    assert _api(web, "/api/v1/failures") == failures
    assert _get(web, "/api/v1/costs", web.token_a, fleet=FLEETS[1]).status_code == 403
    assert _get(web, "/api/v1/costs", web.token_a, by="planet").status_code == 400
    both = create_token(web.settings, list(FLEETS))["token"]
    assert _get(web, "/api/v1/failures", both).status_code == 400  # which fleet?
    assert _api(web, "/api/v1/failures", both, fleet=FLEETS[1])["total"]["runs"] == len(
        web.runs_of(FLEETS[1])
    )
    page = httpx.get(f"{web.base}/fleets", cookies={"al_session": web.token_a})
    assert page.status_code == 200
    total = _api(web, "/api/v1/costs", by="day")["total"]["cost_usd"]
    assert f"total {analytics.money(total)}" in page.text and page.text.count("<rect ") >= 1
    assert f'<td class="num">{failures["total"]["runs"]}</td>' in page.text
    # the held-back run's entries are from 2026-11-01: it has been silent for over 30 minutes
    stalled = page.text.split('<table class="stalled">')[1].split("</table>")[0]
    assert f"/runs/{web.live_run}" in stalled and stalled.count("<tr>") == 2  # head + one run
    # cost by model per day: the day roll-up split by model, each a segment of the chart
    by_day = {r["key"]: r["cost_usd"] for r in _api(web, "/api/v1/costs", by="day")["rows"]}
    split = _api(web, "/api/v1/costs", by="day-model")["rows"]
    assert split and {r["key"].split(" ")[0] for r in split} == set(by_day)
    for day, cost in by_day.items():
        assert sum(Decimal(r["cost_usd"]) for r in split if r["key"].startswith(day)) == Decimal(
            cost
        )
    for r in split:
        assert f"<title>{r['key']}: {analytics.money(r['cost_usd'])}</title>" in page.text
    # failure classes over time: each run once, in its class
    days = _api(web, "/api/v1/failures/days")["days"]
    assert sum(d["runs"] for d in days) == failures["total"]["runs"]
    for row in failures["rows"]:
        in_class = [d for d in days if d["failure_class"] == row["failure_class"]]
        assert sum(d["runs"] for d in in_class) == row["runs"]
    for d in days:
        assert f"<title>{d['day']} {d['failure_class']}: {d['runs']} runs</title>" in page.text


def test_only_an_admin_redrives_and_an_undecodable_letter_stays(web: Web) -> None:
    [letter] = _api(web, "/api/v1/dead-letters")["dead_letters"]
    url = f"{web.base}/api/v1/dead-letters/redrive"

    def post(token: str) -> httpx.Response:
        return httpx.post(url, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    assert post(web.token_a).status_code == 403  # a read token
    admin_a = create_token(web.settings, [FLEETS[0]], admin=True)["token"]
    report = post(admin_a).json()
    assert (report["redriven"], report["already"]) == (0, 0)
    if letter["dismissed"]:  # the dismissal test ran first: a dismissed letter is left alone
        assert (report["dismissed"], report["still_bad"]) == (1, [])
    else:  # "<script>not avro</script>" decodes no better now
        assert report["dismissed"] == 0
        assert [b["source"] for b in report["still_bad"]] == [letter["source"]]
    cookie = {"al_session": admin_a}
    forged = httpx.post(f"{web.base}/dead-letters/redrive", cookies=cookie)
    assert forged.status_code == 403  # a cookie without this site's Origin: not our form
    ours = httpx.post(
        f"{web.base}/dead-letters/redrive", cookies=cookie, headers={"Origin": web.base}
    )
    assert ours.status_code == 200
    shown = f"still bad {len(report['still_bad'])}."
    assert shown in ours.text and '<form method="post" action="/dead-letters/redrive"' in ours.text
    [after] = _api(web, "/api/v1/dead-letters")["dead_letters"]
    assert after["redriven"] is False  # nothing was sent back


def test_only_an_admin_of_the_fleet_dismisses_a_dead_letter(web: Web) -> None:
    [letter] = _api(web, "/api/v1/dead-letters")["dead_letters"]
    url = f"{web.base}/api/v1/dead-letters/dismiss"
    body = {"source": letter["source"], "reason": "junk from a test"}

    def post(token: str, doc: Any = body) -> httpx.Response:
        return httpx.post(url, json=doc, headers={"Authorization": f"Bearer {token}"})

    assert post(web.token_a).status_code == 403  # a read token
    admin_b = create_token(web.settings, [FLEETS[1]], admin=True)["token"]
    assert post(admin_b).status_code == 404  # an admin of another fleet: no such letter
    admin_a = create_token(web.settings, [FLEETS[0]], admin=True)["token"]
    assert post(admin_a, {"source": letter["source"], "reason": " "}).status_code == 400
    cookie = {"al_session": admin_a}
    form = {"source": letter["source"], "reason": "by a form"}
    forged = httpx.post(f"{web.base}/dead-letters/dismiss", data=form, cookies=cookie)
    assert forged.status_code == 403  # a cookie without this site's Origin: not our form
    page = httpx.get(f"{web.base}/dead-letters", cookies=cookie)
    assert '<form method="post" action="/dead-letters/dismiss">' in page.text
    assert (
        "<form"
        not in httpx.get(
            f"{web.base}/dead-letters", cookies={"al_session": web.token_a}
        ).text.split("<main>")[1]
    )
    assert post(admin_a).json() == {"source": letter["source"], "dismissed": True}
    assert post(admin_a).json() == {"source": letter["source"], "dismissed": False}
    ours = httpx.post(
        f"{web.base}/dead-letters/dismiss", data=form, cookies=cookie, headers={"Origin": web.base}
    )
    assert ours.status_code == 303  # this site's form (already dismissed: the first reason stays)
    [after] = _api(web, "/api/v1/dead-letters")["dead_letters"]
    assert after["dismissed"]["reason"] == "junk from a test"
    assert _cli(web, "dlq", "list", "--fleet", FLEETS[0], "--json") == [after]


def test_builds_are_for_admins_and_are_the_clis(web: Web) -> None:
    admin = create_token(web.settings, [FLEETS[0]], admin=True)["token"]
    builds = _api(web, "/api/v1/builds", admin)
    assert builds == _cli(web, "rebuild", "list", "--json")
    assert {b["projection"] for b in builds if b["live"]} >= {"run-stats", "diff-timelines"}
    assert all(b["verified"] is None and b["behind_live"] is None for b in builds)
    live = next(b for b in builds if b["live"] and b["projection"] == "run-stats")
    with ops.connect(web.settings.pg_address) as conn:  # as a verify that found a difference
        ops.record_verdict(conn, "run-stats", live["build"], False, 3, ["run r-1: state differs"])
    page = httpx.get(f"{web.base}/builds", cookies={"al_session": admin})
    assert "DIFFERS" in page.text and "run r-1: state differs" in page.text
    assert page.text.count("never") == len(builds) - 1
    verified = next(  # (a build's name is its projection's: v2-1 may name several)
        b
        for b in _api(web, "/api/v1/builds", admin)
        if (b["projection"], b["build"]) == ("run-stats", live["build"])
    )
    assert verified["verified"]["equal"] is False and verified["verified"]["runs"] == 3
    assert _get(web, "/api/v1/builds", web.token_a).status_code == 403
    page = httpx.get(f"{web.base}/builds", cookies={"al_session": admin})
    assert page.status_code == 200 and page.text.count('<td class="live">live</td>') == len(
        [b for b in builds if b["live"]]
    )
    assert httpx.get(f"{web.base}/builds", cookies={"al_session": web.token_a}).status_code == 403


async def test_a_run_read_again_is_assembled_once_until_it_is_written(
    web: Web, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's header, its rows and its costs read one after the other are one assembly of its
    timeline (the server keeps it by the version of the rows it is made of); once another entry
    of the run is applied, the next read assembles it again and has the new rows."""
    [run] = list(simulate_runs(1, 1, seed=3131))
    assert run[0].fleet_id == FLEETS[0]
    run_id = run[0].run_id
    await publish_and_project(web.settings, run[:12])
    assembled: list[str] = []
    real = analytics.run_timeline

    def counted(settings: Settings, wanted: str) -> dict[str, Any]:
        assembled.append(wanted)
        return real(settings, wanted)

    monkeypatch.setattr(queries, "run_timeline", counted)  # the queries layer's own name
    header = _api(web, f"/api/v1/runs/{run_id}")
    rows = _all_rows(web, run_id, 5)
    costs = _api(web, f"/api/v1/runs/{run_id}/costs")
    assert assembled == [run_id]
    assert header["status"] == "RUNNING" and header["row_count"] == len(rows) > 5
    assert costs == header["cost"]
    await publish_and_project(web.settings, run[12:])
    grown = _api(web, f"/api/v1/runs/{run_id}/timeline", limit=1000)["rows"]
    assert assembled == [run_id, run_id]
    # the new rows, and the old ones as they stand now (a pending tool call has its result)
    assert len(grown) > len(rows) and grown[: len(rows)] != rows
    assert grown == _cli(web, "timeline", run_id, "--json")["rows"]
    assert _api(web, f"/api/v1/runs/{run_id}")["status"] != "RUNNING"
    assert assembled == [run_id, run_id]


# -- a trial's findings (user3): revocation, run ids in paths, prefixes, entry seqs, memory size,
# --at past the end, bidi controls ----------------------------------------------------------


def _publish(web: Web, entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """Publish and project ``entries``, and count them among the deployment's runs."""
    sent = asyncio.run(publish_and_project(web.settings, entries))
    web.sent += sent
    return sent


def _renamed(entries: list[LedgerEntry], run_id: str) -> list[LedgerEntry]:
    return [from_json({**to_json(e), "run_id": run_id}) for e in entries]


def _events(lines: Iterator[str]) -> Iterator[tuple[str, str, str]]:
    """(event, id, data) of a server-sent event stream's lines, as they come."""
    fields: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        if "event" in fields:
            yield fields["event"], fields.get("id", ""), fields["data"]
        fields = {}


def test_an_open_event_stream_ends_when_its_token_is_revoked(web: Web) -> None:
    """Before: the stream opened with a token went on sending rows (full content) after
    ``tokens revoke``. Now it sends ``denied`` and ends, and nothing published after the
    revocation reaches it."""
    entries = simulate(1, 1, seed=7101)
    run_id = entries[0].run_id
    _publish(web, entries[:15])
    shown = len(_cli(web, "timeline", run_id, "--json")["rows"])
    made = create_token(web.settings, [FLEETS[0]])
    url = f"{web.base}/api/v1/runs/{run_id}/events"
    bearer = {"Authorization": f"Bearer {made['token']}"}
    with httpx.stream("GET", url, params={"after": 0}, headers=bearer, timeout=30) as answer:
        assert answer.status_code == 200
        events = _events(answer.iter_lines())
        first = [next(events) for _ in range(shown)]
        assert [e for e, _, _ in first] == ["row"] * shown
        assert revoke_token(web.settings, made["token_id"])
        _publish(web, entries[15:])  # the rest of the run, its end among it
        started = time.monotonic()
        after = list(events)  # the stream ends (or the read times out after 30 s)
    assert [e for e, _, _ in after] == ["denied"], after
    assert time.monotonic() - started < 10
    assert len(_cli(web, "timeline", run_id, "--json")["rows"]) > shown  # there was more
    assert _get(web, f"/api/v1/runs/{run_id}/events", made["token"]).status_code == 401


SLASHED = ("team-a/run-1", "../../api/v1/builds")


def test_run_ids_with_a_slash_are_one_path_segment(web: Web) -> None:
    """Before: the runs page linked ``href="/runs/team-a/run-1"`` and
    ``href="/runs/../../api/v1/builds"`` (another endpoint), and every form of such a run was
    a 404. Now every link encodes the id as one segment and every encoded form opens it."""
    for seed, run_id in zip((7201, 7202), SLASHED, strict=True):
        _publish(web, _renamed(simulate(1, 1, seed=seed), run_id))
    cookies = {"al_session": web.token_a}
    listed = httpx.get(f"{web.base}/runs", params={"limit": 200}, cookies=cookies).text
    for run_id in SLASHED:
        enc = quote(run_id, safe="")
        assert f'href="/runs/{enc}"' in listed and f'href="/runs/{run_id}"' not in listed
        timeline = _cli(web, "timeline", run_id, "--json")
        header = _api(web, f"/api/v1/runs/{enc}")
        assert header.pop("row_count") == len(timeline["rows"]) and header["run_id"] == run_id
        assert {**header, "rows": _all_rows(web, enc, 50)} == timeline
        assert _api(web, f"/api/v1/runs/{enc}/memory") == _cli(web, "memory", run_id, "--json")
        seq = timeline["rows"][0]["seq"]
        assert _api(web, f"/api/v1/runs/{enc}/entries/{seq}")["run_id"] == run_id
        page = httpx.get(f"{web.base}/runs/{enc}", cookies=cookies)
        assert page.status_code == 200
        assert f'href="/runs/{enc}/memory"' in page.text
        assert f'href="/runs/{enc}/entries/{seq}"' in page.text
        assert f'href="/api/v1/runs/{enc}/costs"' in page.text
        for path in (f"/runs/{enc}/memory", f"/runs/{enc}/entries/{seq}", f"/runs/{enc}/context"):
            assert httpx.get(f"{web.base}{path}", cookies=cookies).status_code == 200, path
        assert _get(web, f"/api/v1/runs/{enc}", web.token_b).status_code == 404  # fleet-01's
    # the id's own slashes are never route separators: run "team-a" has no page "run-1"
    assert _get(web, "/api/v1/runs/team-a/run-1", web.token_a).status_code == 404


def test_a_unique_prefix_opens_a_run_and_never_another_fleets(web: Web) -> None:
    """Before: ``/api/v1/runs/PREFIX`` was a 404 while the CLI and MCP resolved it. Now the
    API and the pages resolve a unique prefix among the token's fleets' runs (the MCP
    server's rule, one function); an ambiguous one is a 400 naming the runs, and a prefix of
    another fleet's run is a 404."""
    for seed, run_id in zip((7301, 7302), ("ambig-run-1", "ambig-run-2"), strict=True):
        _publish(web, _renamed(simulate(1, 1, seed=seed), run_id))
    b_only = [e for e in simulate(2, 1, seed=7303) if e.fleet_id == FLEETS[1]]
    _publish(web, _renamed(b_only, "zz-fleet-b-only"))
    own = _api(web, "/api/v1/runs", limit=1000)["runs"]
    run_id = own[0]["run_id"]
    prefix = next(
        run_id[:n]
        for n in range(4, len(run_id))
        if sum(r["run_id"].startswith(run_id[:n]) for r in own) == 1
    )
    assert _api(web, f"/api/v1/runs/{prefix}")["run_id"] == run_id
    assert _api(web, f"/api/v1/runs/{prefix}/costs") == _api(web, f"/api/v1/runs/{run_id}/costs")
    cookies = {"al_session": web.token_a}
    page = httpx.get(f"{web.base}/runs/{prefix}", cookies=cookies)
    assert page.status_code == 200 and f'href="/runs/{quote(run_id, safe="")}/memory"' in page.text
    ambiguous = _get(web, "/api/v1/runs/ambig-run", web.token_a)
    assert ambiguous.status_code == 400
    assert (
        "ambig-run-1" in ambiguous.json()["detail"] and "ambig-run-2" in ambiguous.json()["detail"]
    )
    assert "zz-fleet-b-only" not in {r["run_id"] for r in own}
    for path in ("/api/v1/runs/zz-fleet", "/api/v1/runs/zz-fleet/memory", "/runs/zz-fleet"):
        assert _get(web, path, web.token_a).status_code == 404, path
    assert _api(web, "/api/v1/runs/zz-fleet", web.token_b)["run_id"] == "zz-fleet-b-only"


def test_an_entry_page_opens_for_a_tool_results_own_seq(web: Web) -> None:
    """Before: ``/runs/R/entries/10`` was a 404 when 10 is row 9's tool result. Now it shows
    the row of the call it answers, saying so."""
    run_id = web.hostile_run
    rows = _cli(web, "timeline", run_id, "--json")["rows"]
    seqs = {r["seq"] for r in rows}
    row = next(r for r in rows if r["detail"].get("result_seq") not in (None, *seqs))
    result = row["detail"]["result_seq"]
    doc = _api(web, f"/api/v1/runs/{run_id}/entries/{result}")
    assert doc["seq"] == result and doc["shown"] == "result"
    assert doc["rows"] == [r for r in rows if r["detail"].get("result_seq") == result]
    page = httpx.get(
        f"{web.base}/runs/{run_id}/entries/{result}", cookies={"al_session": web.token_a}
    )
    assert page.status_code == 200 and f"is the result of the call below (#{row['seq']})" in (
        page.text
    )
    assert _get(web, f"/api/v1/runs/{run_id}/entries/99999", web.token_a).status_code == 404


def test_the_memory_document_leaves_the_index_to_its_pages(web: Web) -> None:
    """Before: ``/memory`` and ``memory --json`` carried the whole evidence index (886 KB of
    a 10,006-entry run's 1.09 MB). Now they count its members and ``/memory/index`` (``memory
    --index``) pages through them: the pages add up to the index."""
    run_id = web.hostile_run
    full = queries.jsonable(queries.memory(web.settings, run_id))["state"]["index"]
    doc = _api(web, f"/api/v1/runs/{run_id}/memory")
    assert "index" not in doc["state"] and doc == _cli(web, "memory", run_id, "--json")
    assert doc["index"] == {part: len(full[part]) for part in queries.INDEX_PARTS}
    assert doc["index"]["entries"] > 10
    members: dict[str, Any] = {}
    offset: int | None = 0
    while offset is not None:
        page = _api(
            web, f"/api/v1/runs/{run_id}/memory/index", part="entries", offset=offset, limit=7
        )
        assert len(page["members"]) <= 7 and page["total"] == len(full["entries"])
        members.update(page["members"])
        offset = page["next_offset"]
    assert members == full["entries"]
    cli = _cli(web, "memory", run_id, "--index", "tool_calls", "--limit", "3")
    assert cli == _api(web, f"/api/v1/runs/{run_id}/memory/index", part="tool_calls", limit=3)
    assert (
        _get(web, f"/api/v1/runs/{run_id}/memory/index", web.token_a, part="x").status_code == 400
    )


def test_memory_at_past_the_runs_end_is_refused_everywhere(web: Web) -> None:
    """Before: ``memory --at 999999`` said "as it stood after seq 999999" (exit 0) and the
    page offered "seq 999998". Now the CLI (exit 2), the API and the page refuse it alike."""
    run_id = web.hostile_run
    last = _cli(web, "memory", run_id, "--json")["applied_seq"]
    env = {"AGENTLEDGER_PG_DSN": web.settings.pg_address, "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["memory", run_id, "--at", "999999"], env=env)
    assert result.exit_code == 2 and f"applied through seq {last}" in result.output
    answer = _get(web, f"/api/v1/runs/{run_id}/memory", web.token_a, at=999999)
    assert answer.status_code == 400 and f"applied through seq {last}" in answer.json()["detail"]
    page = httpx.get(
        f"{web.base}/runs/{run_id}/memory",
        params={"at": 999999},
        cookies={"al_session": web.token_a},
    )
    assert page.status_code == 400 and "seq 999998" not in page.text
    assert _get(web, f"/api/v1/runs/{run_id}/memory", web.token_a, at=last).status_code == 200


BIDI = "\u202eexe.txt \u2066isolated\u2069 \u202aembedded\u202c"


def test_pages_show_bidi_controls_as_markers_and_json_keeps_them(web: Web) -> None:
    """Before: the pages kept raw U+202E (and the other bidi controls) from untrusted text, so
    it displayed reversed. Now every page shows a visible marker; the API's JSON is the data
    as stored."""
    entries = simulate(1, 1, seed=7501)
    out = []
    for e in entries:
        if e.kind.value == "USER_TASK":
            doc = to_json(e)
            doc["parts"] = [{"type": "text", "text": f"Fix {BIDI}"}]
            e = from_json(doc)
        out.append(e)
    _publish(web, out)
    run_id = out[0].run_id
    cookies = {"al_session": web.token_a}
    pages = [
        httpx.get(f"{web.base}/runs/{run_id}", cookies=cookies),
        httpx.get(f"{web.base}/runs", params={"search": "isolated"}, cookies=cookies),
        httpx.get(f"{web.base}/runs/{run_id}/memory", cookies=cookies),
        httpx.get(f"{web.base}/runs/{run_id}/context", cookies=cookies),
    ]
    for page in pages:
        assert page.status_code == 200
        assert not any(
            chr(c) in page.text for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
        )
    assert "[U+202E]exe.txt" in pages[0].text and "[U+2066]isolated[U+2069]" in pages[0].text
    assert "[U+202E]exe.txt" in pages[1].text
    timeline = _api(web, f"/api/v1/runs/{run_id}/timeline")
    assert any(BIDI in r["text"] for r in timeline["rows"])  # the data, as stored
