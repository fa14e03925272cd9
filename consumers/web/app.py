"""``agentledger serve``: the JSON API (``/api/v1``) and the server-rendered pages over the live
builds. Read-only: every answer comes from :mod:`consumers.queries` (the CLI's documents); it
never writes a projection. Every route but ``/health`` needs a token (``Authorization: Bearer``
or the session cookie that ``/login?token=`` sets), and a token sees only its fleets' runs: a
run of another fleet is a 404, as if it did not exist.

The pages hold no inline script: one file of our own, ``static/live.js`` (a running run's new
rows, added as text), and the Content-Security-Policy allows no other, so a string from an agent
or a tool that slipped past escaping still could not run."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from itertools import zip_longest
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlparse

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup
from starlette.types import ASGIApp, Receive, Scope, Send

from consumers import queries
from consumers.access import Principal, authenticate
from consumers.analytics import money
from consumers.render import as_of, changed_files, memory_sections
from consumers.render_analytics import figure
from consumers.web.charts import HEIGHT, WIDTH, bars, cost_line, stacked
from infra.cli_support import bounded
from infra.settings import Settings
from schemas.errors import AmbiguousRunError, BadArgumentError, NotFoundError
from schemas.shown import neutral_bidi

DeadLetters = Callable[[Sequence[str]], list[dict[str, Any]]]
# (fleets, source, reason) -> newly dismissed; BadArgumentError: no such dead letter of those
Dismiss = Callable[[Sequence[str], str, str], bool]
Builds = Callable[[], list[dict[str, Any]]]
# fleets -> {"redriven", "already", "dismissed", "still_bad": [{"source", "reason"}]}
Redrive = Callable[[Sequence[str]], dict[str, Any]]
# a run's replay package as one JSON document (streams.replay_package.package_doc)
ReplayPackage = Callable[[str], dict[str, Any]]

COOKIE = "al_session"
HERE = Path(__file__).parent
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
ROWS_PER_PAGE = 100
COMPARE_PAIRS = 200  # timeline rows side by side on one compare page
STALLED_AFTER_MIN = 30.0  # as `agentledger failures --stalled-after` by default
POLL_S = 0.25  # how often a live stream looks for new rows
STREAM_S = 600.0  # a live stream ends after this long; the browser reconnects where it was
TOKEN_CHECK_S = 1.0  # an open stream re-checks its token at least this often (and before rows)


class HttpError(Exception):
    """An answer other than 200: its status and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _principal(request: Request) -> Principal:
    """The request's token (the Authorization header's, else the session cookie's), valid."""
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else None
    given = token or request.cookies.get(COOKIE)
    found = authenticate(request.app.state.settings, given)
    if found is None:
        raise HttpError(401, "a valid token is needed: Authorization: Bearer, or /login?token=")
    request.state.token = given  # an open stream checks it again while it runs
    return found


def seg(value: Any) -> str:
    """``value`` as one URL path segment: every character but letters, digits and ``-._~``
    percent-encoded, ``/`` included (Jinja's ``urlencode`` leaves ``/`` as it is, so a run id
    ``team-a/run-1`` or ``../../api/v1/builds`` made a link to another path). ``.`` and
    ``..`` alone are encoded too (``%2E``), though browsers still read those as dot segments."""
    text = quote(str(value), safe="")
    return {".": "%2E", "..": "%2E%2E"}.get(text, text)


def _finalize(value: Any) -> Any:
    """What every ``{{ ... }}`` of the pages prints: text with its bidi controls shown as
    markers (schemas.shown.neutral_bidi), so untrusted text cannot display reversed."""
    if isinstance(value, Markup):
        return Markup(neutral_bidi(str(value)))
    if isinstance(value, str):
        return neutral_bidi(value)
    return value


_KEPT_ESCAPES = re.compile(r"%(2[fF]|25)")


class EncodedSlashes:
    """Routes on the path as sent (``raw_path``), decoding every escape but ``%2F`` and
    ``%25``: a run id with a ``/`` (``team-a%2Frun-1``) stays one path segment, so it can
    never be read as a route's separator (``/runs/a%2Fmemory`` is run ``a/memory``, not run
    ``a``'s memory page), and :func:`path_id` turns the segment back into the id. (Starlette
    routes on the decoded path, where ``%2F`` is a ``/``: every form of such a run was a
    404.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] in ("http", "websocket") else None
        if raw and b"%" in raw:
            text = raw.decode("latin-1").split("?", 1)[0]
            pieces = _KEPT_ESCAPES.split(text)  # text, kept code, text, kept code, ...
            path = "".join(
                unquote(piece) if n % 2 == 0 else f"%{piece.upper()}"
                for n, piece in enumerate(pieces)
            )
            scope = {**scope, "path": path}
        await self.app(scope, receive, send)


def path_id(value: str) -> str:
    """An id from a path segment (:class:`EncodedSlashes` left ``%2F`` and ``%25`` in it).
    An id holds no ``%`` (schemas.models.ID_PATTERN), so an id given decoded, in a query
    string, is unchanged."""
    return unquote(value)


Who = Annotated[Principal, Depends(_principal)]


def create_app(
    settings: Settings,
    dead_letters: DeadLetters | None = None,
    dismiss: Dismiss | None = None,
    builds: Builds | None = None,
    redrive: Redrive | None = None,
    replay_package: ReplayPackage | None = None,
) -> FastAPI:
    """The app; ``dead_letters``, ``dismiss``, ``builds``, ``redrive`` and ``replay_package``
    come from the write side (``streams.dlq``, ``streams.rebuild``,
    ``streams.replay_package``, composed by ``infra.main``): without them those routes answer
    501."""
    app = FastAPI(
        title="AgentLedger",
        version="1",
        description="Read-only API over the live builds of AgentLedger's projections.",
        openapi_url=None,  # served below, behind a token
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    pages = Environment(
        loader=FileSystemLoader(HERE / "templates"), autoescape=True, finalize=_finalize
    )
    pages.filters["seg"] = seg
    pages.filters["usd"] = _usd
    pages.filters["changed_files"] = changed_files  # (a memory's, or a compared run's)
    pages.filters["figure"] = _figure
    pages.filters["pretty"] = lambda doc: json.dumps(doc, indent=2, default=str)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_middleware(EncodedSlashes)

    @app.middleware("http")
    async def _headers(request: Request, call_next: Callable[[Request], Any]) -> Response:
        response: Response = await call_next(request)
        response.headers.update(HEADERS)
        return response

    @app.exception_handler(HttpError)
    async def _error(request: Request, exc: HttpError) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": exc.reason}, status_code=exc.status)
        html = pages.get_template("error.html").render(status=exc.status, reason=exc.reason)
        return HTMLResponse(html, status_code=exc.status)

    def run_of(who: Principal, run_id: str) -> str:
        """The run of the token's fleets ``run_id`` names (a path segment's or a query's):
        that run, or the only one of them it is the start of (``queries.run_for``, the CLI's
        and the MCP server's rule); 404 when none of theirs (whoever has it), 400 naming the
        runs of theirs when several start with it."""
        try:
            return queries.run_for(settings, path_id(run_id), who.fleets)
        except NotFoundError as exc:
            raise HttpError(404, str(exc)) from None
        except AmbiguousRunError as exc:
            raise HttpError(400, f"run id prefix: {exc}") from None

    def found(read: Callable[[], Any]) -> Any:
        try:
            return read()
        except NotFoundError as exc:
            raise HttpError(404, str(exc)) from None
        except BadArgumentError as exc:
            raise HttpError(400, str(exc)) from None

    def runs_page(
        who: Principal, params: Mapping[str, str | None], cursor: str | None, limit: int
    ) -> Any:
        filters = found(lambda: queries.parse_run_filters(**params))
        if filters.fleet is not None and filters.fleet not in who.fleets:
            raise HttpError(403, f"this token does not cover fleet {filters.fleet}")
        after = found(lambda: run_cursor_key(filters.sort, cursor))
        rows = queries.runs(settings, filters, limit + 1, after, who.fleets)
        more = len(rows) > limit
        return rows[:limit], (run_cursor(filters.sort, rows[limit - 1]) if more else None)

    # -- API ---------------------------------------------------------------------------------

    @app.get("/health")
    def health() -> dict[str, str]:
        """Whether the server is up (no token needed)."""
        return {"status": "ok"}

    @app.get("/api/v1/openapi.json", include_in_schema=False)
    def openapi(who: Who) -> dict[str, Any]:
        return app.openapi()

    @app.get("/api/v1/runs")
    def api_runs(
        who: Who,
        fleet: str | None = None,
        status: str | None = None,
        failure_class: Annotated[str | None, Query(alias="class")] = None,
        since: str | None = None,
        until: str | None = None,
        cost_above: str | None = None,
        search: str | None = None,
        model: str | None = None,
        outcome: str | None = None,
        repository: str | None = None,
        sort: str | None = None,
        cursor: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> Any:
        """Runs of the token's fleets, with the filters and sorts of ``agentledger runs``; the
        next page is ``?cursor=next_cursor`` with the same filters."""
        params = dict(
            fleet=fleet,
            status=status,
            failure_class=failure_class,
            since=since,
            until=until,
            cost_above=cost_above,
            search=search,
            sort=sort,
            model=model,
            outcome=outcome,
            repository=repository,
        )
        rows, next_cursor = runs_page(who, params, cursor, limit)
        return queries.jsonable({"runs": rows, "next_cursor": next_cursor})

    @app.get("/api/v1/runs/{run_id}")
    def api_run(who: Who, run_id: str) -> Any:
        """The run's header (``agentledger timeline --json`` without its rows) and row count."""
        doc = found(lambda: queries.timeline(settings, run_of(who, run_id)))
        rows = doc.pop("rows")
        return queries.jsonable({**doc, "row_count": len(rows)})

    @app.get("/api/v1/runs/{run_id}/timeline")
    def api_timeline(
        who: Who,
        run_id: str,
        cursor: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = ROWS_PER_PAGE,
    ) -> Any:
        """The run's timeline rows, a page at a time (``next_cursor``)."""
        rows = found(lambda: queries.timeline(settings, run_of(who, run_id)))["rows"]
        start = _offset(cursor)
        more = len(rows) > start + limit
        return queries.jsonable(
            {
                "rows": rows[start : start + limit],
                "next_cursor": cursor_at(start + limit) if more else None,
            }
        )

    @app.get("/api/v1/runs/{run_id}/entries/{seq}")
    def api_entry(who: Who, run_id: str, seq: int) -> Any:
        """One row's drill-down: the rows of that sequence number, and for a model call the
        manifest of what it saw."""
        return queries.jsonable(found(lambda: queries.entry(settings, run_of(who, run_id), seq)))

    @app.get("/api/v1/runs/{run_id}/memory")
    def api_memory(who: Who, run_id: str, at: int | None = None) -> Any:
        """The working memory now, or as it stood after sequence number ``at`` (400 past the
        run's last applied one); the evidence index left out of ``state``, its members
        counted in ``index`` (``/memory/index`` pages through them)."""
        rid = run_of(who, run_id)
        return queries.jsonable(found(lambda: queries.memory_doc(settings, rid, at)))

    @app.get("/api/v1/runs/{run_id}/memory/index")
    def api_memory_index(
        who: Who,
        run_id: str,
        part: str = "entries",
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=10 * queries.INDEX_PAGE)] = queries.INDEX_PAGE,
    ) -> Any:
        """A page of the current working memory's evidence index: ``part`` (one of
        ``queries.INDEX_PARTS``) from ``offset``, with ``total`` and ``next_offset``
        (``agentledger memory RUN --index PART``)."""
        rid = run_of(who, run_id)
        return queries.jsonable(
            found(lambda: queries.memory_index(settings, rid, part, offset, limit))
        )

    @app.get("/api/v1/runs/{run_id}/context")
    def api_context(who: Who, run_id: str, call: str | None = None) -> Any:
        """The next-turn context manifest, or what model call ``call`` (an entry id) saw."""
        rid = run_of(who, run_id)
        doc = found(lambda: queries.manifest(settings, rid, call))
        if doc is None:
            raise HttpError(404, f"run {rid} has no next-turn manifest yet")
        return queries.jsonable(doc)

    @app.get("/api/v1/runs/{run_id}/context/rendered")
    def api_context_rendered(who: Who, run_id: str, call: str | None = None) -> Any:
        """``{"text": ...}``: the next turn (or what ``call`` saw) as the model gets it,
        sectioned, trust wrappers included (``agentledger context --render``)."""
        rid = run_of(who, run_id)
        doc = found(lambda: queries.manifest(settings, rid, call))
        if doc is None:
            raise HttpError(404, f"run {rid} has no next-turn manifest yet")
        return {"text": queries.render_manifest(doc)}

    @app.get("/api/v1/runs/{run_id}/costs")
    def api_costs(who: Who, run_id: str) -> Any:
        """The run's cost header: calls, tokens, cost (unknown as null, never 0), budget."""
        doc = found(lambda: queries.timeline(settings, run_of(who, run_id)))
        return queries.jsonable(doc["cost"])

    @app.get("/api/v1/runs/{run_id}/failure")
    def api_failure(who: Who, run_id: str, stalled_after: float = 30.0) -> Any:
        """Why the run failed: class, rule, explanation, evidence."""
        return queries.jsonable(
            found(lambda: queries.failure(settings, run_of(who, run_id), stalled_after))
        )

    @app.get("/api/v1/runs/{run_id}/diffs")
    def api_diffs(who: Who, run_id: str) -> Any:
        """The run's diff: changed files, totals, flags, snapshots, the failing check (the
        diff-timelines state without its rows)."""
        return found(lambda: queries.diff(settings, run_of(who, run_id)))

    @app.get("/api/v1/runs/{run_id}/replay-package")
    def api_replay_package(who: Who, run_id: str) -> Any:
        """The run's replay package as ``agentledger replay-package RUN`` writes it, in one
        document: ``package`` (package.json), ``entries`` (entries.jsonl) and ``schemas``."""
        if replay_package is None:
            raise HttpError(501, "this server has no access to the topics")
        return found(lambda: replay_package(run_of(who, run_id)))

    @app.get("/api/v1/compare")
    def api_compare(who: Who, a: str, b: str) -> Any:
        """Two runs side by side: header, outcome, cost, changed files, timeline rows."""
        return queries.jsonable(
            found(lambda: queries.compare(settings, [run_of(who, a), run_of(who, b)]))
        )

    @app.get("/api/v1/runs/{run_id}/events")
    async def api_events(request: Request, who: Who, run_id: str, after: int = 0) -> Response:
        """Server-sent events: ``row`` (a timeline row as ``/timeline`` has it, its index as
        the event id) for each row past the first ``after`` as it lands, then ``end`` (with
        the run's final ``status``) when the run has finished. A reconnecting browser's
        ``Last-Event-ID`` takes over from ``after``."""
        rid = await asyncio.to_thread(run_of, who, run_id)
        last = request.headers.get("last-event-id", "")
        start = int(last) + 1 if last.isdigit() else max(after, 0)
        return StreamingResponse(
            _live_rows(request, settings, rid, start, request.state.token),
            media_type="text/event-stream",
            headers={"X-Accel-Buffering": "no"},
        )

    def one_fleet(who: Principal, fleet: str | None) -> str:
        """The fleet a roll-up is of: the one asked for (403 if the token does not cover it),
        or the token's only fleet."""
        if fleet:
            if fleet not in who.fleets:
                raise HttpError(403, f"this token does not cover fleet {fleet}")
            return fleet
        if len(who.fleets) > 1:
            raise HttpError(400, "fleet: this token covers several fleets; give one")
        return who.fleets[0]

    @app.get("/api/v1/costs")
    def api_costs_rollup(
        who: Who, by: str = "model", fleet: str | None = None, since: str | None = None
    ) -> Any:
        """One fleet's model calls rolled up by run, model, purpose or day, with a total
        (``agentledger costs --by BY --fleet F --json``)."""
        chosen = one_fleet(who, fleet)
        return queries.jsonable(
            found(lambda: queries.costs(settings, by, chosen, queries.moment("since", since)))
        )

    @app.get("/api/v1/failures")
    def api_failures(
        who: Who, fleet: str | None = None, since: str | None = None, stalled_after: float = 30.0
    ) -> Any:
        """One fleet's runs by failure class: final, provisional, stalled
        (``agentledger failures --fleet F --json``)."""
        chosen = one_fleet(who, fleet)
        when = found(lambda: queries.moment("since", since))
        return queries.jsonable(queries.failures(settings, chosen, when, stalled_after))

    @app.get("/api/v1/failures/days")
    def api_failure_days(who: Who, fleet: str | None = None, since: str | None = None) -> Any:
        """Failure classes over time: one fleet's runs by the day of their last entry (UTC)
        and failure class, ``{"days": [{"day", "failure_class", "runs"}], "runs_left_out"}``
        (runs whose times are unknown have no day)."""
        chosen = one_fleet(who, fleet)
        when = found(lambda: queries.moment("since", since))
        return queries.failures_by_day(settings, chosen, when)

    @app.get("/api/v1/dead-letters")
    def api_dead_letters(who: Who, fleet: str | None = None) -> Any:
        """Dead letters of the token's fleets (``agentledger dlq list --json``)."""
        return {"dead_letters": letters(who, fleet)}

    @app.post("/api/v1/dead-letters/dismiss")
    async def api_dismiss(request: Request, who: Who) -> Any:
        """Mark a dead letter of the token's fleets handled, with a reason kept for audit
        (``agentledger dlq dismiss``); an admin token only. Body: ``{"source", "reason"}``."""
        try:
            body = json.loads(await request.body())
            source, reason = str(body["source"]), str(body["reason"])
        except (ValueError, KeyError, TypeError, RecursionError):
            raise HttpError(400, 'a JSON body {"source": ..., "reason": ...}') from None
        done = await asyncio.to_thread(dismissed, request, who, source, reason)
        return {"source": source, "dismissed": done}

    def dismissed(request: Request, who: Principal, source: str, reason: str) -> bool:
        if not who.admin:
            raise HttpError(403, "dismissing a dead letter needs an admin token")
        if "authorization" not in request.headers and not _same_origin(request):
            raise HttpError(403, "a form of this site only (the Origin header differs)")
        if dismiss is None:
            raise HttpError(501, "this server was started without a dead-letter store")
        if not reason.strip():
            raise HttpError(400, "reason: kept with the dismissal for audit; give one")
        try:
            return dismiss(who.fleets, source, reason)
        except BadArgumentError as exc:
            raise HttpError(404, str(exc)) from None

    @app.post("/api/v1/dead-letters/redrive")
    async def api_redrive(request: Request, who: Who, fleet: str | None = None) -> Any:
        """Send the dead letters of the token's fleets (or of ``fleet``) that decode now back
        to their topics, each at most once (``agentledger dlq redrive``); an admin token only.
        ``{"redriven", "already", "dismissed", "still_bad": [{"source", "reason"}]}``."""
        return await asyncio.to_thread(redriven, request, who, fleet)

    def redriven(request: Request, who: Principal, fleet: str | None) -> dict[str, Any]:
        if not who.admin:
            raise HttpError(403, "redriving dead letters needs an admin token")
        if "authorization" not in request.headers and not _same_origin(request):
            raise HttpError(403, "a form of this site only (the Origin header differs)")
        if fleet and fleet not in who.fleets:
            raise HttpError(403, f"this token does not cover fleet {fleet}")
        if redrive is None:
            raise HttpError(501, "this server was started without a dead-letter store")
        return redrive([fleet] if fleet else list(who.fleets))

    @app.get("/api/v1/builds")
    def api_builds(who: Who) -> Any:
        """Every build of every projection (``agentledger rebuild list --json``): live or not,
        code and data versions, start, runs, offsets. Admin tokens only (builds span every
        fleet)."""
        return queries.jsonable(all_builds(who))

    def all_builds(who: Principal) -> list[dict[str, Any]]:
        if not who.admin:
            raise HttpError(403, "builds span every fleet: an admin token is needed")
        if builds is None:
            raise HttpError(501, "this server was started without a build reader")
        return builds()

    def letters(who: Principal, fleet: str | None) -> list[dict[str, Any]]:
        if fleet and fleet not in who.fleets:
            raise HttpError(403, f"this token does not cover fleet {fleet}")
        if dead_letters is None:
            raise HttpError(501, "this server was started without a dead-letter reader")
        return dead_letters([fleet] if fleet else list(who.fleets))

    # -- pages -------------------------------------------------------------------------------

    def page(name: str, who: Principal, **values: Any) -> HTMLResponse:
        return HTMLResponse(pages.get_template(name).render(who=who, **values))

    @app.get("/login", include_in_schema=False)
    def login(token: str = "") -> Response:
        who = authenticate(settings, token)
        if who is None:
            raise HttpError(401, "this token is not valid (unknown, revoked or expired)")
        response = RedirectResponse("/runs", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="lax", path="/")
        return response

    @app.get("/logout", include_in_schema=False)
    def logout() -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @app.get("/", include_in_schema=False)
    def home(who: Who) -> Response:
        return RedirectResponse("/runs", status_code=303)

    @app.get("/runs", include_in_schema=False)
    def runs_html(request: Request, who: Who, cursor: str | None = None) -> HTMLResponse:
        q = request.query_params
        names = (
            "fleet",
            "status",
            "class",
            "since",
            "until",
            "cost_above",
            "search",
            "model",
            "outcome",
            "repository",
            "sort",
        )
        given = {name: q.get(name) or "" for name in names}
        params = {("failure_class" if k == "class" else k): v for k, v in given.items()}
        rows, next_cursor = runs_page(who, params, cursor, 50)
        kept = {k: v for k, v in given.items() if v}
        return page(
            "runs.html",
            who,
            runs=[{**r, "cost_text": queries.cost_text(r)} for r in rows],
            given=given,
            statuses=queries.RUN_STATUSES,
            outcomes=queries.OUTCOMES,
            sorts=("last", "first", "cost", "entries", "id"),
            next_url=f"/runs?{urlencode({**kept, 'cursor': next_cursor})}" if next_cursor else None,
        )

    @app.get("/runs/{run_id}", include_in_schema=False)
    def run_html(who: Who, run_id: str, cursor: str | None = None) -> HTMLResponse:
        run_id = run_of(who, run_id)
        doc = found(lambda: queries.timeline(settings, run_id))
        start = _offset(cursor)
        rows = doc["rows"][start : start + ROWS_PER_PAGE]
        more = len(doc["rows"]) > start + ROWS_PER_PAGE
        return page(
            "run.html",
            who,
            run=doc,
            cost_line=cost_line(doc["rows"]),
            chart=(WIDTH, HEIGHT),
            rows=rows,
            first=start + 1,
            total=len(doc["rows"]),
            next_url=f"/runs/{seg(run_id)}?cursor={cursor_at(start + ROWS_PER_PAGE)}"
            if more
            else None,
            live=doc["status"] == "RUNNING" and not more,
            prev_url=f"/runs/{seg(run_id)}?cursor={cursor_at(max(0, start - ROWS_PER_PAGE))}"
            if start
            else None,
        )

    @app.get("/runs/{run_id}/entries/{seq}", include_in_schema=False)
    def entry_html(who: Who, run_id: str, seq: int) -> HTMLResponse:
        doc = found(lambda: queries.entry(settings, run_of(who, run_id), seq))
        return page("entry.html", who, entry=doc)

    @app.get("/runs/{run_id}/memory", include_in_schema=False)
    def memory_html(who: Who, run_id: str, at: int | None = None) -> HTMLResponse:
        run_id = run_of(who, run_id)
        now = found(lambda: queries.memory_doc(settings, run_id))
        view = now if at is None else found(lambda: queries.memory_doc(settings, run_id, at))
        where = view.get("applied_seq", view.get("seq"))
        return page(
            "memory.html",
            who,
            run_id=run_id,
            view=view,
            memory=view["state"],
            sections=memory_sections(view["state"]),
            as_of=as_of(where, view.get("asked_seq")),
            last=now["applied_seq"],
            at=at if at is not None else now["applied_seq"],
        )

    @app.get("/runs/{run_id}/context", include_in_schema=False)
    def context_html(who: Who, run_id: str, call: str | None = None) -> HTMLResponse:
        run_id = run_of(who, run_id)
        doc = found(lambda: queries.manifest(settings, run_id, call))
        if doc is None:
            raise HttpError(404, f"run {run_id} has no next-turn manifest yet")
        return page(
            "context.html",
            who,
            run_id=run_id,
            call=call,
            manifest=doc,
            text=queries.render_manifest(doc),
        )

    @app.get("/compare", include_in_schema=False)
    def compare_html(
        who: Who, a: str = "", b: str = "", start: Annotated[int, Query(ge=0)] = 0
    ) -> HTMLResponse:
        if not a or not b:
            return page("compare.html", who, a=a, b=b, runs=None, pairs=[], start=0)
        a, b = run_of(who, a), run_of(who, b)
        doc = found(lambda: queries.compare(settings, [a, b]))
        left, right = doc["runs"]
        # the timelines a page of pairs at a time (found trying the product: two 10,006-entry
        # runs made a 2.25 MB page)
        pairs = list(zip_longest(left["rows"], right["rows"]))
        if start >= len(pairs):  # past the end: the last page
            start = max(0, (len(pairs) - 1) // COMPARE_PAIRS * COMPARE_PAIRS)
        shown = pairs[start : start + COMPARE_PAIRS]
        here = f"/compare?a={seg(a)}&b={seg(b)}&start="
        after = start + COMPARE_PAIRS
        return page(
            "compare.html",
            who,
            a=a,
            b=b,
            runs=doc["runs"],
            pairs=shown,
            start=start,
            pair_count=len(pairs),
            prev_url=f"{here}{max(0, start - COMPARE_PAIRS)}" if start else None,
            next_url=f"{here}{after}" if after < len(pairs) else None,
        )

    @app.get("/fleets", include_in_schema=False)
    def fleets_html(who: Who, fleet: str | None = None, since: str = "") -> HTMLResponse:
        chosen = one_fleet(who, fleet or who.fleets[0])
        when = found(lambda: queries.moment("since", since))
        by_day = queries.costs(settings, "day", chosen, when)
        by_run = queries.costs(settings, "run", chosen, when)
        by_day_model = queries.costs(settings, "day-model", chosen, when)
        class_days = queries.failures_by_day(settings, chosen, when)
        running = queries.runs(settings, queries.RunFilters(fleet=chosen, status="RUNNING"), 500)
        silent_since = datetime.now(UTC) - timedelta(minutes=STALLED_AFTER_MIN)
        stalled = [r for r in running if r["last_at"] is not None and r["last_at"] < silent_since]
        return page(
            "fleets.html",
            who,
            fleet=chosen,
            since=since,
            by_day=by_day,
            day_bars=bars([(r["key"], r["cost_usd"]) for r in by_day["rows"]]),
            model_days=stacked(
                [(*r["key"].split(" ", 1), r["cost_usd"]) for r in by_day_model["rows"]]
            ),
            class_days=stacked(
                [(r["day"], r["failure_class"], r["runs"]) for r in class_days["days"]], "count"
            ),
            class_day_rows=class_days["days"],
            class_days_left_out=class_days["runs_left_out"],
            by_model=queries.costs(settings, "model", chosen, when),
            failures=queries.failures(settings, chosen, when),
            over_budget=[r for r in by_run["rows"] if r["over_budget"]],
            stalled=[{**r, "cost_text": queries.cost_text(r)} for r in stalled],
            chart=(WIDTH, HEIGHT),
        )

    @app.get("/dead-letters", include_in_schema=False)
    def dead_letters_html(who: Who) -> HTMLResponse:
        return page("dead_letters.html", who, letters=letters(who, None))

    @app.get("/builds", include_in_schema=False)
    def builds_html(who: Who) -> HTMLResponse:
        found = all_builds(who)
        # the records the live build of each projection has read (a progress bar's whole)
        whole = {
            b["projection"]: sum(o + 1 for o in b["offsets"].values()) for b in found if b["live"]
        }
        shown = [{**b, "live_records": whole.get(b["projection"], 0)} for b in found]
        behind = any(b["behind_live"] for b in found)
        return page("builds.html", who, builds=shown, rebuilding=behind)

    @app.post("/dead-letters/redrive", include_in_schema=False)
    def redrive_html(request: Request, who: Who) -> HTMLResponse:
        report = redriven(request, who, None)
        return page("dead_letters.html", who, letters=letters(who, None), redrive_report=report)

    @app.post("/dead-letters/dismiss", include_in_schema=False)
    async def dismiss_html(request: Request, who: Who) -> Response:
        form = parse_qs((await request.body()).decode(errors="replace"))
        source = (form.get("source") or [""])[0]
        reason = (form.get("reason") or [""])[0]
        await asyncio.to_thread(dismissed, request, who, source, reason)
        return RedirectResponse("/dead-letters", status_code=303)

    return app


async def _live_rows(
    request: Request, settings: Settings, run_id: str, seen: int, token: str | None
) -> AsyncIterator[str]:
    """The event stream of :func:`api_events`: it looks for new rows only when the run's
    applied sequence numbers have moved (:func:`consumers.queries.applied`). Its token is
    checked again before any row is sent and at least every :data:`TOKEN_CHECK_S`: once it
    is revoked or expired the stream sends ``denied`` and ends (a reconnect gets 401)."""
    yield "retry: 1000\n\n"
    version, deadline = None, time.monotonic() + STREAM_S
    checked = time.monotonic()
    while time.monotonic() < deadline and not await request.is_disconnected():
        if time.monotonic() - checked >= TOKEN_CHECK_S:
            if await asyncio.to_thread(authenticate, settings, token) is None:
                yield _denied()
                return
            checked = time.monotonic()
        now = await asyncio.to_thread(queries.applied, settings, run_id)
        if now != version:
            doc = await asyncio.to_thread(queries.timeline, settings, run_id)
            if doc["rows"][seen:] or doc["status"] != "RUNNING":  # about to send: still valid?
                if await asyncio.to_thread(authenticate, settings, token) is None:
                    yield _denied()
                    return
                checked = time.monotonic()
            version = now
            for index, row in enumerate(doc["rows"][seen:], start=seen):
                yield f"id: {index}\nevent: row\ndata: {json.dumps(queries.jsonable(row))}\n\n"
            seen = max(seen, len(doc["rows"]))
            if doc["status"] != "RUNNING":
                yield f"event: end\ndata: {json.dumps({'status': doc['status']})}\n\n"
                return
        await asyncio.sleep(POLL_S)


def _denied() -> str:
    reason = "the token is no longer valid (revoked or expired): the stream ends"
    return f"event: denied\ndata: {json.dumps({'detail': reason})}\n\n"


def _same_origin(request: Request) -> bool:
    """Whether a cookie-carrying write comes from a page of this server (its Origin header,
    which browsers send with every POST, names this host): the guard against cross-site
    forms."""
    origin = request.headers.get("origin")
    return origin is not None and urlparse(origin).netloc == request.url.netloc


def cursor_at(offset: int) -> str:
    """An opaque cursor: where the next page starts."""
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def run_cursor(sort: str, run: dict[str, Any]) -> str:
    """An opaque keyset cursor of the runs list: the next page starts right after ``run`` (its
    sort value and run id), whatever arrived before it since."""
    value, run_id = queries.run_key(sort, run)
    text = (
        value.isoformat() if isinstance(value, datetime) else None if value is None else str(value)
    )
    doc = {"s": sort, "v": text, "r": run_id}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


def run_cursor_key(sort: str, cursor: str | None) -> tuple[Any, str] | None:
    """The (sort value, run id) a :func:`run_cursor` of the same sort carries (None: the first
    page); BadArgumentError when it is no such cursor."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        doc = json.loads(raw)
        given, value, run_id = doc["s"], doc["v"], doc["r"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise BadArgumentError("cursor: not a cursor this server gave") from None
    if given != sort or not isinstance(run_id, str) or not isinstance(value, str | None):
        raise BadArgumentError("cursor: not a cursor this server gave (for this sort)")
    return queries.key_from_text(sort, value, run_id)


def _offset(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        offset = json.loads(raw)["o"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise HttpError(400, "cursor: not a cursor this server gave") from None
    if not isinstance(offset, int) or offset < 0:
        raise HttpError(400, "cursor: not a cursor this server gave")
    return offset


def _figure(doc: dict[str, Any], name: str) -> str:
    """A figure of a cost row or total as shown: "unknown" when None, never 0; ">= " before a
    lower bound (consumers.render_analytics.figure, the CLI's rule)."""
    return figure(doc, name, money if name.endswith("_usd") else "{:,}".format)


def _usd(value: Any) -> str:
    """A USD figure as shown: ``unknown`` when there is none, never $0."""
    return bounded(value, money)
