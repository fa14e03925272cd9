"""What the MCP server (``agentledger mcp``, :mod:`consumers.mcp_server`) answers, without the
protocol: each read checks the token (the API tokens of ``agentledger serve``, scoped to
fleets), waits for the projection to have applied ``min_seq`` (read-your-writes), builds its
document from the same query layer as the CLI and the API (:mod:`consumers.queries`), withholds
what is not for a model, bounds the size, says in ``meta`` where the answer stands, and counts
the read in PostgreSQL (``al_mcp_reads``).

The policy, the same for every token:

- A run of a fleet the token does not cover is "no run X", the same answer as an unknown run.
- Nothing of an entry that is not ``MODEL_VISIBLE`` is served: the working memory and the next
  turn never hold one (``projectors.trust``); the timeline rows, failure evidence and diff
  snapshots that come from one are withheld, and so are their ids in the memory's index. (The
  memory's index marks every such entry ``hidden``, without telling AUDIT_ONLY, INTERNAL_ONLY,
  REDACTED and HUMAN_VISIBLE apart, so all four are withheld.) ``meta["withheld"]`` counts what
  was left out. The run's cost figures are sums over all its model calls, hidden or not.
- Text from tools and untrusted sources is served as data: inside a JSON string, and in the
  rendered next turn inside its trust wrapper with its flags, exactly as the model gets it.
- An answer's JSON stays under :data:`MAX_CHARS`: the timeline is paged, and what does not fit
  otherwise is named in ``meta["truncated"]`` (items by their sha256 and source entry).
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

from psycopg import Connection, OperationalError
from redis import Redis
from redis.exceptions import RedisError

from consumers import queries
from consumers.access import Principal, authenticate
from infra.settings import Settings
from projectors import trust
from projectors.registry import NAMES, all_projections
from projectors.stores import mcp_audit as store
from projectors.stores import postgres_ops as ops
from projectors.stores.artifact_files import ArtifactError, read_artifact
from projectors.stores.redis import live_key, view_key
from schemas.errors import AgentLedgerError, BadArgumentError, NotFoundError
from schemas.shown import asked

MODEL_VISIBLE = "MODEL_VISIBLE"
HIDDEN = "hidden"  # the working memory index's outcome of an entry that is not MODEL_VISIBLE
MAX_CHARS = 200_000  # an answer's JSON, at most
DEFAULT_WAIT_S = 2.0  # how long a read waits for min_seq by default
MAX_WAIT_S = 10.0
POLL_S = 0.01


TIMELINE_PAGE = 200  # timeline rows per answer by default
ARTIFACT_PAGE = 100_000  # characters of an artifact per answer, at most
ARTIFACT_PREFIX = "sha256:"
OFFERED_LEVELS = frozenset(level.value for level in trust.OFFERED_LEVELS)
MAX_RUNS = 200
LAZY_COMMIT = True  # a read's transaction (its only write: the count) skips the WAL flush wait
# kept in Redis too, and every projection: as the registry has them (one list)
HOT = frozenset(p.name for p in all_projections() if p.hot)
PROJECTIONS = NAMES
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
WITHHELD = "[withheld: not model-visible]"


class Unauthorized(AgentLedgerError):
    """No token, or one that is unknown, revoked or expired."""


class Unreachable(AgentLedgerError):
    """PostgreSQL, which every read and the token's check need, is not there."""


def reach_database(settings: Settings) -> None:
    """Unreachable, in one line, when PostgreSQL does not answer a plain connection (refused
    at once; at most the connect timeout). Asked before the server keeps its pool: the pool
    retried for 30 s, logging each retry, and then said "unexpected PoolTimeout"."""
    try:
        with ops.connect(settings.pg_address):
            pass
    except OperationalError as exc:
        raise Unreachable(
            f"{away(exc)}: set AGENTLEDGER_PG_DSN, or the local stack's AGENTLEDGER_PG_PORT, in "
            "the server's environment (an MCP client passes only the environment it is "
            "given), or start the stack: agentledger infra up"
        ) from None


def away(exc: OperationalError) -> str:
    """PostgreSQL not answering (refused, gone, the pool timed out), in one line; or, for the
    other operational errors psycopg raises (a deadlock, a cancelled statement, a full disk),
    that it could not answer this read."""
    said = " ".join(str(exc).split()) or type(exc).__name__
    state = exc.sqlstate or ""
    if not state or state.startswith("08") or state in ("57P01", "57P02", "57P03"):
        return f"PostgreSQL is not reachable ({said})"  # (no state: the client's own, a pool's)
    return f"PostgreSQL could not answer this read ({said})"


@functools.cache
def server_version() -> str:
    try:
        return f"agentledger {package_version('agentledger')}"
    except PackageNotFoundError:  # pragma: no cover (run from a source tree not installed)
        return "agentledger (not installed)"


@dataclass
class Answer:
    """One read's document (JSON-ready, as the CLI's ``--json`` prints it, less what is
    withheld), what the answer says of itself (``meta``) and, for the next turn, the text the
    model gets."""

    doc: Any
    meta: dict[str, Any]
    text: str | None = None

    def json(self) -> str:
        """The document as served (a tool's text block, a resource's contents): the compact
        JSON its size bound (:data:`MAX_CHARS`) is measured on. (Indented, a bounded answer
        was ~1.5x the bound, and the indentation was tokens a model paid for.)"""
        return json.dumps(self.doc)


@dataclass(frozen=True)
class Waited:
    min_seq: int | None
    reached: bool
    waited_ms: float
    applied_seq: int | None  # the run's applied sequence number in that projection, when known


class Ledger:
    """Reads for one token (re-checked at every read, so a revocation takes effect at once)."""

    def __init__(self, settings: Settings, token: str | None, root: Ledger | None = None) -> None:
        self.settings = settings
        self.token = token
        self._root = root  # whose Redis client and connections this one shares
        self._redis: Redis | None = None
        self._pooled = False  # whether this (root) ledger asked ops.connect to keep connections

    def for_token(self, token: str | None) -> Ledger:
        """The same reads for another token (HTTP: each request's own), sharing the clients."""
        return Ledger(self.settings, token, self._root or self)

    def _keep_connections(self) -> None:
        """From the first read on, every PostgreSQL connection of this process's reads (the
        server's own statements and the query layer's) is lent from a pool: opening one costs
        more than a read's queries."""
        if self._root is not None:
            self._root._keep_connections()
        elif not self._pooled:
            ops.keep_connections(self.settings.pg_address)
            self._pooled = True

    @contextmanager
    def _conn(self) -> Iterator[Connection[Any]]:
        """A pooled connection for the server's own statements (access, where the run stands,
        the audit); the documents come through the query layer, as the CLI's do."""
        self._keep_connections()
        with ops.connect(self.settings.pg_address) as conn:
            yield conn

    def _redis_client(self) -> Redis:
        if self._root is not None:
            return self._root._redis_client()
        if self._redis is None:
            self._redis = Redis.from_url(
                self.settings.redis_address, socket_timeout=1, socket_connect_timeout=1
            )
        return self._redis

    # -- access ------------------------------------------------------------------------------

    def principal(self) -> Principal:
        self._keep_connections()
        found = authenticate(self.settings, self.token)
        if found is None:
            raise Unauthorized(
                "a valid API token is needed (AGENTLEDGER_TOKEN; make one with "
                "`agentledger tokens create --fleet F`): this one is missing, unknown, revoked "
                "or expired"
            )
        return found

    def run_of(self, run_id: str) -> str:
        """The run ``run_id`` is (or the only one of the token's fleets it is the start of) if
        the token may read it (NotFoundError: unknown or another fleet's)."""
        return self._run_of(self.principal(), run_id)

    def _run_of(self, who: Principal, run_id: str) -> str:
        """The run id ``run_id`` is, or the only one of the token's fleets it is the start of
        (as the CLI resolves a prefix); NotFoundError: none of the token's runs (an unknown
        run and another fleet's alike), AmbiguousRunError: several."""
        with self._conn() as conn:
            return ops.run_of_fleets(conn, run_id, who.fleets)

    # -- read-your-writes --------------------------------------------------------------------

    @staticmethod
    def _timeout(min_seq: int | None, timeout_s: float | None) -> float:
        """How long a read may wait for ``min_seq`` (BadArgumentError: out of bounds)."""
        if min_seq is not None and min_seq < 0:
            raise BadArgumentError("min_seq: a sequence number, 0 or more")
        timeout = DEFAULT_WAIT_S if timeout_s is None else timeout_s
        if not 0 <= timeout <= MAX_WAIT_S:
            raise BadArgumentError(f"timeout_s: from 0 to {MAX_WAIT_S:g} seconds")
        return timeout

    def _run_appears(
        self, who: Principal, run_id: str, deadline: float, projection: str = "run-stats"
    ) -> str | None:
        """The run, once it is one the token may read, if before ``deadline``: the first
        entries of a new run, just published, are not projected yet. (A run of another fleet
        is waited out the same as an unknown one: the answer's time tells nothing.) Every
        :data:`POLL_S` it looks at the run's Redis view of ``projection`` (one round trip to
        Redis); PostgreSQL, which decides, only once that view exists, and every 10th look
        anyway (a run id prefix, or a projection without a Redis view): two queries every
        10 ms for each read waiting on a new run weighed on PostgreSQL and on every other
        read."""
        looks = 0
        while time.monotonic() < deadline:
            time.sleep(POLL_S)
            looks += 1
            if looks % 10 and self._hot_seq(projection, run_id) is None:
                continue
            try:
                return self._run_of(who, run_id)
            except NotFoundError:
                continue
        return None

    def wait(
        self,
        projection: str,
        run_id: str,
        min_seq: int | None,
        timeout_s: float | None,
        start: float | None = None,
    ) -> Waited:
        """Wait until ``projection``'s live build has applied ``min_seq`` of the run (polling
        its Redis view when it has one, else its PostgreSQL row), at most ``timeout_s`` from
        ``start`` (a ``time.monotonic()``; default now)."""
        start = time.monotonic() if start is None else start
        if min_seq is None:
            return Waited(None, True, 0.0, None)
        deadline = start + self._timeout(min_seq, timeout_s)
        seq = None
        polls = 0
        while True:
            seq = self.applied_hot(projection, run_id)
            # PostgreSQL confirms what Redis says; it is also asked every 10th poll, for a Redis
            # view left behind (e.g. written by no worker since a refill)
            if seq is None or seq >= min_seq or polls % 10 == 9:
                seq = self.applied_pg(projection, run_id)
            polls += 1
            if seq is not None and seq >= min_seq:
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        reached = seq is not None and seq >= min_seq
        return Waited(min_seq, reached, round((time.monotonic() - start) * 1000, 1), seq)

    def applied_pg(self, projection: str, run_id: str) -> int | None:
        with self._conn() as conn:
            return store.run_applied(conn, [projection], run_id).get(projection)

    def _hot_seq(self, projection: str, run_id: str) -> int | None:
        return self.applied_hot(projection if projection in HOT else "run-stats", run_id)

    def applied_hot(self, projection: str, run_id: str) -> int | None:
        """The run's applied sequence number in the projection's Redis view (None: not a hot
        projection, no view, or Redis unreachable)."""
        if projection not in HOT:
            return None
        try:
            client = self._redis_client()
            prefix = self.settings.redis_prefix
            build = client.get(live_key(prefix, projection))
            if build is None:
                return None
            name = build.decode() if isinstance(build, bytes) else str(build)
            seq = client.hget(view_key(prefix, projection, name, run_id), "seq")
        except RedisError:
            return None
        return None if seq is None else int(seq)

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        if self._pooled:
            ops.drop_connections(self.settings.pg_address)
            self._pooled = False

    # -- the reads ---------------------------------------------------------------------------

    def working_memory(
        self,
        run_id: str,
        min_seq: int | None = None,
        at_seq: int | None = None,
        timeout_s: float | None = None,
        via: str = "get_working_memory",
    ) -> Answer:
        """The run's working memory now (``agentledger memory RUN --json``), or as it stood
        after ``at_seq`` (``--at``)."""

        def build(
            run_id: str, hidden: set[str], memory: dict[str, Any] | None
        ) -> tuple[Any, dict[str, Any]]:
            if at_seq is None and memory is None:
                raise NotFoundError(f"no working-memory for run {run_id} in the live build")
            found = memory if at_seq is None else queries.memory(self.settings, run_id, at_seq)
            doc = queries.jsonable(found)
            withheld = _drop_hidden_index(doc, hidden)
            meta: dict[str, Any] = {"withheld": {"index_entries": withheld}}
            if len(json.dumps(doc)) > MAX_CHARS and "index" in doc.get("state", {}):
                doc["state"].pop("index")
                meta["truncated"] = ["state.index"]
            return doc, meta

        return self._read(via, run_id, "working-memory", min_seq, timeout_s, build)

    def next_turn(
        self,
        run_id: str,
        min_seq: int | None = None,
        call: str | None = None,
        timeout_s: float | None = None,
        via: str = "get_next_turn",
        item_from: int = 0,
    ) -> Answer:
        """The run's next-turn context manifest (``agentledger context RUN --json``) or what
        model call ``call`` saw (``--call``), and its text as the model gets it, trust
        wrappers included (``--render``); from item ``item_from`` on, as many items as fit
        the size bound (``_meta.items_page`` says which, when not all)."""
        if item_from < 0:
            raise BadArgumentError("item_from: 0 or more")
        rendered: list[str] = []

        def build(
            run_id: str, hidden: set[str], memory: dict[str, Any] | None
        ) -> tuple[Any, dict[str, Any]]:
            if call is not None and call in hidden:  # (a call not MODEL_VISIBLE: not served)
                raise NotFoundError(f"no manifest of call {call} in run {run_id}")
            found = queries.manifest(self.settings, run_id, call)
            if found is None:
                raise NotFoundError(f"run {run_id} has no next-turn manifest yet")
            doc = queries.jsonable(found)
            kept = [i for i in doc["items"] if i["visibility"] == MODEL_VISIBLE]
            withheld = len(doc["items"]) - len(kept)
            if item_from and item_from >= len(kept):
                raise BadArgumentError(
                    f"item_from: 0 to {len(kept) - 1}, the items this next turn serves"
                    if kept
                    else "item_from: this next turn serves no items"
                )
            doc["items"] = kept[item_from:]
            whole = [dict(i) for i in doc["items"]]  # (cutting replaces an item's text)
            truncated = _fit_items(doc)  # the render holds no more text than the JSON
            page = _page_items(doc, item_from, len(kept))
            if page is not None:  # which next turn: a running run's moves on between pages
                mark = {k: doc.get(k) for k in ("manifest_id", "as_of_sequence_no")}
                page = {**mark, **page}
            if page is not None and len(doc["items"]) < len(whole):
                # a page of the items: their texts whole again, cut only as far as it needs
                doc["items"] = whole[: len(doc["items"])]
                truncated = _fit_items(doc)
            meta: dict[str, Any] = {
                "withheld": {"items": withheld},
                "items": [_item_meta(item_from + n, i) for n, i in enumerate(doc["items"])],
            }
            if page is not None:
                meta["items_page"] = page
            truncated = [{**t, "index": item_from + t["index"]} for t in truncated]
            if truncated:
                meta["truncated"] = truncated
            # as the model gets it, less the ids of hidden entries (the last sweep's rule)
            text, scrubbed = scrub_ids(queries.render_manifest(doc), hidden)
            rendered.append(text)
            if scrubbed:
                meta["withheld"]["ids_in_text"] = scrubbed
            return doc, meta

        answer = self._read(via, run_id, "context-manifests", min_seq, timeout_s, build)
        answer.text = rendered[0] if rendered else None
        return answer

    def timeline(
        self,
        run_id: str,
        min_seq: int | None = None,
        offset: int = 0,
        limit: int = TIMELINE_PAGE,
        timeout_s: float | None = None,
        via: str = "get_timeline",
    ) -> Answer:
        """The run's header and timeline rows (``agentledger timeline RUN --json``), rows
        ``offset`` to ``offset + limit`` of those served."""
        if offset < 0 or not 1 <= limit <= 1000:
            raise BadArgumentError("offset: 0 or more; limit: 1 to 1000")

        def build(
            run_id: str, hidden: set[str], memory: dict[str, Any] | None
        ) -> tuple[Any, dict[str, Any]]:
            doc = queries.jsonable(queries.timeline(self.settings, run_id))
            rows = [r for r in doc["rows"] if not _hidden_refs(r, hidden)]
            withheld = len(doc["rows"]) - len(rows)
            evidence = _drop_hidden_evidence(doc.get("failure"), hidden)
            page = rows[offset : offset + limit]
            while page and len(json.dumps({**doc, "rows": page})) > MAX_CHARS:
                page = page[: len(page) // 2]
            doc["rows"] = page
            known = self._known_items(run_id)
            end = offset + len(page)
            meta: dict[str, Any] = {
                "withheld": {"rows": withheld, "evidence": evidence},
                "rows_total": len(rows),
                "offset": offset,
                "next_offset": end if end < len(rows) else None,
                "items": [
                    {"seq": r["seq"], "kind": r["kind"], **known[r["refs"]["entry"]]}
                    for r in page
                    if r.get("refs", {}).get("entry") in known
                ],
            }
            return doc, meta

        return self._read(via, run_id, "diff-timelines", min_seq, timeout_s, build)

    def costs(
        self,
        run_id: str,
        min_seq: int | None = None,
        timeout_s: float | None = None,
        via: str = "get_costs",
    ) -> Answer:
        """The run's cost header: calls, tokens, cost (unknown as null, never 0), budget
        (``timeline --json``'s ``cost``; ``GET /api/v1/runs/RUN/costs``)."""

        def build(
            run_id: str, hidden: set[str], memory: dict[str, Any] | None
        ) -> tuple[Any, dict[str, Any]]:
            doc = queries.jsonable(queries.timeline(self.settings, run_id))["cost"]
            return doc, {}

        return self._read(via, run_id, "cost-metrics", min_seq, timeout_s, build)

    def failure(
        self,
        run_id: str,
        min_seq: int | None = None,
        stalled_after_minutes: float = 30.0,
        timeout_s: float | None = None,
        via: str = "explain_failure",
    ) -> Answer:
        """Why the run failed: class, rule, explanation, evidence (``agentledger failures RUN
        --json``)."""

        def build(
            run_id: str, hidden: set[str], memory: dict[str, Any] | None
        ) -> tuple[Any, dict[str, Any]]:
            doc = queries.jsonable(queries.failure(self.settings, run_id, stalled_after_minutes))
            withheld = _drop_hidden_evidence(doc, hidden)
            return doc, {"withheld": {"evidence": withheld}}

        return self._read(via, run_id, "failure-classifications", min_seq, timeout_s, build)

    def diff(
        self,
        run_id: str,
        min_seq: int | None = None,
        timeout_s: float | None = None,
        via: str = "get_diff",
    ) -> Answer:
        """The run's diff: changed files, totals, flags, snapshots (the diff-timelines
        projection's state without its rows, which ``get_timeline`` serves)."""

        def build(
            run_id: str, hidden: set[str], memory: dict[str, Any] | None
        ) -> tuple[Any, dict[str, Any]]:
            doc = queries.diff(self.settings, run_id)
            snapshots = doc.get("snapshots") or []
            kept = [s for s in snapshots if not _hidden_refs(s, hidden)]
            doc["snapshots"] = kept
            return doc, {"withheld": {"snapshots": len(snapshots) - len(kept)}}

        return self._read(via, run_id, "diff-timelines", min_seq, timeout_s, build)

    def artifact(
        self,
        run_id: str,
        artifact: str,
        offset: int = 0,
        limit: int = ARTIFACT_PAGE,
        call: str | None = None,
        min_seq: int | None = None,
        timeout_s: float | None = None,
        via: str = "get_artifact",
    ) -> Answer:
        """Content an answer names by its handle (``sha256:<hex>``), ``limit`` characters from
        ``offset``: the text of an item of the run's next turn (or of model call ``call``'s
        manifest) that an answer cut for size, or an artifact such an item carries, read from
        the artifact store. Only what a next turn offers the model: its items are
        MODEL_VISIBLE, and an artifact only at a redaction level a model may be offered (a
        RESTRICTED one held a secret, replaced before it was stored: it is refused)."""
        if offset < 0 or not 1 <= limit <= ARTIFACT_PAGE:
            raise BadArgumentError(f"offset: 0 or more; limit: 1 to {ARTIFACT_PAGE}")
        sha = artifact_sha(artifact)
        handle = f"{ARTIFACT_PREFIX}{sha}"

        def build(
            run_id: str, hidden: set[str], memory: dict[str, Any] | None
        ) -> tuple[Any, dict[str, Any]]:
            if call is not None and call in hidden:  # (a call not MODEL_VISIBLE: not served)
                raise NotFoundError(f"no manifest of call {call} in run {run_id}")
            found = queries.manifest(self.settings, run_id, call)
            items = [
                i
                for i in queries.jsonable((found or {}).get("items") or [])
                if i.get("visibility") == MODEL_VISIBLE
            ]
            source = artifact_source(items, sha)
            where = f"the manifest of call {call}" if call else "its next turn"
            if source is None:
                raise NotFoundError(f"no artifact {handle} in {where} of run {run_id}")
            item, ref = source
            if ref is None:
                text, content_type, kind = str(item["text"]), "text/plain", "item"
            else:
                level = str(ref.get("redaction_level"))
                if level not in OFFERED_LEVELS:
                    raise NotFoundError(
                        f"artifact {handle} of run {run_id} is withheld ({level}): not for a model"
                    )
                try:
                    data = read_artifact(self.settings.resolved_artifact_dir, sha)
                except ArtifactError as exc:
                    raise NotFoundError(f"artifact {handle} of run {run_id}: {exc}") from None
                text = data.decode("utf-8", errors="replace")
                content_type, kind = str(ref.get("content_type")), "artifact"
            doc = _artifact_page(run_id, handle, kind, content_type, text, offset, limit)
            index = items.index(item)
            return doc, {"items": [_item_meta(index, item)], "withheld": {}}

        return self._read(via, run_id, "context-manifests", min_seq, timeout_s, build)

    def find_runs(
        self,
        fleet: str | None = None,
        status: str | None = None,
        failure_class: str | None = None,
        search: str | None = None,
        sort: str | None = None,
        limit: int = 50,
        via: str = "find_runs",
        run_id: str | None = None,
        min_seq: int | None = None,
        timeout_s: float | None = None,
    ) -> Answer:
        """Runs of the token's fleets, filtered and sorted as ``agentledger runs --json``
        does; with ``run_id`` and ``min_seq``, once every projection the list is read from has
        applied that sequence number of that run (read-your-writes: a sequence number is a
        run's). One transaction (with ``min_seq``, none is held while waiting)."""
        within = nullcontext() if min_seq is not None else self._one_transaction()
        with within:
            return self._find_runs(
                fleet=fleet,
                status=status,
                failure_class=failure_class,
                search=search,
                sort=sort,
                limit=limit,
                via=via,
                run_id=run_id,
                min_seq=min_seq,
                timeout_s=timeout_s,
            )

    def _find_runs(
        self,
        fleet: str | None = None,
        status: str | None = None,
        failure_class: str | None = None,
        search: str | None = None,
        sort: str | None = None,
        limit: int = 50,
        via: str = "find_runs",
        run_id: str | None = None,
        min_seq: int | None = None,
        timeout_s: float | None = None,
    ) -> Answer:
        start = time.monotonic()
        who = self.principal()
        if not 1 <= limit <= MAX_RUNS:
            raise BadArgumentError(f"limit: 1 to {MAX_RUNS}")
        if (run_id is None) != (min_seq is None):
            raise BadArgumentError("run_id and min_seq: both or neither (a seq is a run's)")
        timeout = self._timeout(min_seq, timeout_s)
        waited: list[Waited] = []
        if run_id is not None:
            try:
                run_id = self._run_of(who, run_id)
            except NotFoundError:
                appeared = self._run_appears(who, run_id, start + timeout)
                if appeared is None:
                    self._count(who, via, run_id, None, refused=True)
                    raise
                run_id = appeared
            waited = [
                self.wait(p, run_id, min_seq, timeout, start) for p in ops.RUN_LIST_PROJECTIONS
            ]
        filters = queries.parse_run_filters(
            fleet=fleet, status=status, failure_class=failure_class, search=search, sort=sort
        )
        if filters.fleet is not None and filters.fleet not in who.fleets:
            self._count(who, via, "", None, refused=True)
            raise NotFoundError(f"this token does not cover fleet {filters.fleet}")
        found = queries.runs(self.settings, filters, limit, None, who.fleets)
        doc = {"runs": queries.jsonable(found)}
        while len(json.dumps(doc)) > MAX_CHARS and len(doc["runs"]) > 1:
            doc["runs"] = doc["runs"][: len(doc["runs"]) // 2]
        meta: dict[str, Any] = {
            "server": server_version(),
            "fleets": list(who.fleets),
            "count": len(doc["runs"]),
            "truncated": ["runs"] if len(doc["runs"]) < len(found) else [],
        }
        seq = None
        if waited:
            behind = list(zip(ops.RUN_LIST_PROJECTIONS, waited, strict=True))
            seqs = [w.applied_seq for _, w in behind]
            seq = None if None in seqs else min(s for s in seqs if s is not None)
            meta |= {
                "run_id": run_id,
                "min_seq": min_seq,
                "reached": all(w.reached for w in waited),
                "waited_ms": round((time.monotonic() - start) * 1000, 1),
                "applied_seqs": {p: w.applied_seq for p, w in behind},
            }
            late = [p for p, w in behind if not w.reached]
            if late:
                meta["note"] = (
                    f"not yet: {', '.join(late)} of run {run_id} have not applied seq "
                    f"{min_seq} after {meta['waited_ms']:.0f} ms; this list is as of older seqs"
                )
        self._count(who, via, run_id or "", seq)
        return Answer(doc, meta)

    # -- shared ------------------------------------------------------------------------------

    @contextmanager
    def _one_transaction(self) -> Iterator[None]:
        """A read's statements (the server's and the query layer's) on one pooled connection,
        in one transaction; a refusal (an AgentLedgerError) still commits its count."""
        self._keep_connections()
        with ops.one_connection(self.settings.pg_address, commit_on=(AgentLedgerError,)):
            yield

    def _read(
        self,
        via: str,
        run_id: str,
        projection: str,
        min_seq: int | None,
        timeout_s: float | None,
        build: Callable[[str, set[str], dict[str, Any] | None], tuple[Any, dict[str, Any]]],
    ) -> Answer:
        """A read in one transaction on one pooled connection; with ``min_seq``, the wait for
        it comes first and holds no connection (the pool's connections are for reading: a
        read waiting seconds for the worker must not keep the next read waiting for a
        connection)."""
        if min_seq is None:
            with self._one_transaction():
                who, run_id, waited = self._arrive(via, run_id, projection, None, timeout_s)
                return self._read_one(who, via, run_id, projection, waited, build)
        who, run_id, waited = self._arrive(via, run_id, projection, min_seq, timeout_s)
        with self._one_transaction():
            return self._read_one(who, via, run_id, projection, waited, build)

    def _arrive(
        self,
        via: str,
        run_id: str,
        projection: str,
        min_seq: int | None,
        timeout_s: float | None,
    ) -> tuple[Principal, str, Waited]:
        """The token, the run (waited for when it is new), and the wait for ``min_seq``."""
        start = time.monotonic()
        who = self.principal()
        timeout = self._timeout(min_seq, timeout_s)
        try:
            run_id = self._run_of(who, run_id)
        except NotFoundError:
            # read-your-writes of a new run: its first entries may not be projected yet
            found = (
                None
                if min_seq is None
                else self._run_appears(who, run_id, start + timeout, projection)
            )
            if found is None:
                self._count(who, via, run_id, None, refused=True)
                raise
            run_id = found
        return who, run_id, self.wait(projection, run_id, min_seq, timeout, start)

    def _read_one(
        self,
        who: Principal,
        via: str,
        run_id: str,
        projection: str,
        waited: Waited,
        build: Callable[[str, set[str], dict[str, Any] | None], tuple[Any, dict[str, Any]]],
    ) -> Answer:
        memory = self._memory_view(run_id)
        hidden = _hidden_of(memory)
        doc, extra = build(run_id, hidden, memory)
        swept = _sweep(doc, hidden)  # whatever named a hidden entry and was not left out above
        if swept:
            extra.setdefault("withheld", {})["other"] = swept
        with self._conn() as conn:
            applied = store.run_applied(conn, PROJECTIONS, run_id)
            builds = store.live_builds(conn, PROJECTIONS)
        seq = applied.get(projection)
        meta: dict[str, Any] = {
            "run_id": run_id,
            "projection": projection,
            "applied_seq": seq,
            "min_seq": waited.min_seq,
            "reached": waited.reached,
            "waited_ms": waited.waited_ms,
            "applied_seqs": applied,
            "build": builds.get(projection),
            "builds": builds,
            "server": server_version(),
            **extra,
        }
        if not waited.reached:
            meta["note"] = (
                f"not yet: {projection} has applied seq {waited.applied_seq or 0} of run "
                f"{run_id}, not {waited.min_seq}, after {waited.waited_ms:.0f} ms; this answer "
                "is as of the older seq"
            )
        self._count(who, via, run_id, seq)
        return Answer(doc, meta)

    def _memory_view(self, run_id: str) -> dict[str, Any] | None:
        """The run's working memory now (``queries.memory`` without ``at``), whose index says
        which entries are not MODEL_VISIBLE; None: none yet."""
        try:
            return queries.memory(self.settings, run_id)
        except NotFoundError:
            return None

    def _known_items(self, run_id: str) -> dict[str, dict[str, Any]]:
        """Trust, visibility and sha256 of the run's entries its next turn holds, by entry id."""
        try:
            found = queries.manifest(self.settings, run_id)
        except NotFoundError:
            return {}
        items = (found or {}).get("items") or []
        return {
            i["source_entry_id"]: {
                "entry_id": i["source_entry_id"],
                "trust_level": str(i["trust_level"]),
                "visibility": str(i["visibility"]),
                "sha256": i["sha256"],
                "flags": list(i.get("flags") or []),
            }
            for i in queries.jsonable(items)
            if i.get("source_entry_id")
        }

    def _count(
        self, who: Principal, via: str, run_id: str, seq: int | None, refused: bool = False
    ) -> None:
        with self._conn() as conn:
            if LAZY_COMMIT:
                store.commit_without_flush(conn)
            store.record_read(conn, who.token_id, via, audit_key(run_id), seq, refused)


def audit_key(run_id: str) -> str:
    """The run a read is counted under: the id asked for, or, when it can be no run's id (a NUL
    PostgreSQL refuses, a megabyte past the index's row size), what an error says back of it
    (such a read is refused, and was not counted at all)."""
    return run_id if not run_id or ops.ID_RE.fullmatch(run_id) else asked(run_id)


def audit(
    settings: Settings, token_id: str | None = None, run_id: str | None = None
) -> list[dict[str, Any]]:
    """The MCP read counts (``agentledger mcp-audit``)."""
    with ops.connect(settings.pg_address) as conn:
        return store.read_counts(conn, token_id, run_id)


def _hidden_of(memory: dict[str, Any] | None) -> set[str]:
    """The entries a working memory's index marks hidden (not MODEL_VISIBLE)."""
    index = ((memory or {}).get("state") or {}).get("index") or {}
    return {k for k, v in (index.get("entries") or {}).items() if v == HIDDEN}


def _item_meta(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": index,
        "section": item.get("section"),
        "item_kind": item.get("item_kind"),
        "source_entry_id": item.get("source_entry_id"),
        "sequence_no": item.get("sequence_no"),
        "trust_level": item.get("trust_level"),
        "visibility": item.get("visibility"),
        "sha256": item.get("sha256"),
        "flags": list(item.get("flags") or []),
        "tokens": item.get("tokens"),
    }


def cut_text(chars: int, sha256: str | None) -> str:
    """What stands in an answer for an item's text cut to bound its size: the handle that
    ``get_artifact`` reads it back by."""
    return (
        f"[cut for size: {chars:,} characters; read them with get_artifact, "
        f"artifact={ARTIFACT_PREFIX}{sha256}]"
    )


def _page_items(
    doc: dict[str, Any], item_from: int, total: int, limit: int = MAX_CHARS
) -> dict[str, Any] | None:
    """Keep the longest run of ``doc``'s items (those from ``item_from`` of ``total``) whose
    JSON fits ``limit``, at least one; which were served, and where the next page begins
    (None: the last), or None when every item from the first was served. A next turn of many
    small items was over the bound after its texts were cut: the items' own fields (trust,
    visibility, sha256, source entry) are never cut, so its items are paged, as the
    timeline's rows are."""
    items = doc["items"]
    if len(json.dumps(doc)) > limit:
        fits, over = 1, len(items)  # the longest prefix that fits, by halves
        while fits + 1 < over:
            middle = (fits + over) // 2
            if len(json.dumps({**doc, "items": items[:middle]})) <= limit:
                fits = middle
            else:
                over = middle
        doc["items"] = items = items[:fits]
    if item_from == 0 and len(items) == total:
        return None
    end = item_from + len(items)
    return {
        "from": item_from,
        "served": len(items),
        "of": total,
        "next_item_from": end if end < total else None,
    }


def _fit_items(doc: dict[str, Any], limit: int = MAX_CHARS) -> list[dict[str, Any]]:
    """Cut the texts of the biggest items until the manifest fits ``limit``, each replaced by
    its handle (:func:`cut_text`); what was cut (each item by index, sha256, source entry and
    the handle ``get_artifact`` takes)."""
    truncated: list[dict[str, Any]] = []
    size = len(json.dumps(doc))
    by_size = sorted(
        range(len(doc["items"])), key=lambda n: -len(doc["items"][n].get("text") or "")
    )
    for n in by_size:
        if size <= limit:
            break
        item = doc["items"][n]
        text = item.get("text")
        if not text:
            break
        handle = cut_text(len(text), item.get("sha256"))
        if len(handle) >= len(text):
            break
        size -= len(json.dumps(text)) - len(json.dumps(handle))
        item["text"] = handle
        truncated.append(
            {
                "index": n,
                "sha256": item.get("sha256"),
                "source_entry_id": item.get("source_entry_id"),
                "chars": len(text),
                "artifact": f"{ARTIFACT_PREFIX}{item.get('sha256')}",
            }
        )
    return truncated


def artifact_sha(handle: str) -> str:
    """The sha256 an artifact handle names (``sha256:<hex>`` or the 64 hex digits);
    BadArgumentError if it is neither."""
    sha = handle.strip().lower().removeprefix(ARTIFACT_PREFIX)
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise BadArgumentError("artifact: sha256:<64 hex digits>, as an answer's handle names it")
    return sha


def artifact_source(
    items: list[dict[str, Any]], sha: str
) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """Where a next turn offers the content ``sha`` names, among its (MODEL_VISIBLE) items:
    (the item, None) when it is an item's own text (what an answer cut for size), (the item,
    its artifact ref) when an item carries the artifact by its handle; None: not offered."""
    for item in items:
        if item.get("sha256") == sha and item.get("text") is not None:
            return item, None
    for item in items:
        for ref in item.get("artifact_refs") or ():
            if ref.get("sha256") == sha:
                return item, ref
    return None


def _artifact_page(
    run_id: str, handle: str, kind: str, content_type: str, text: str, offset: int, limit: int
) -> dict[str, Any]:
    """A page of an artifact's text, at most ``limit`` characters and :data:`MAX_CHARS` of
    JSON (a page halves until it fits)."""
    page = text[offset : offset + limit]
    while True:
        end = offset + len(page)
        doc = {
            "run_id": run_id,
            "artifact": handle,
            "kind": kind,  # "item": an item's text an answer cut; "artifact": from the store
            "content_type": content_type,
            "chars": len(text),
            "offset": offset,
            "next_offset": end if end < len(text) else None,
            "text": page,
        }
        if len(json.dumps(doc)) <= MAX_CHARS or len(page) <= 1:
            return doc
        page = page[: len(page) // 2]


def _refs(doc: Any) -> Iterable[str]:
    """The entry ids a row, snapshot or piece of evidence names."""
    if not isinstance(doc, dict):
        return
    for key in ("entry_id", "entry"):
        value = doc.get(key)
        if isinstance(value, str):
            yield value
    refs = doc.get("refs")
    if isinstance(refs, dict):
        yield from (v for v in refs.values() if isinstance(v, str))


def _hidden_refs(doc: Any, hidden: set[str]) -> bool:
    return any(ref in hidden for ref in _refs(doc))


def _drop_hidden_evidence(doc: Any, hidden: set[str]) -> int:
    """Leave out the failure evidence that comes from hidden entries; how many."""
    if not isinstance(doc, dict):
        return 0
    inner = doc.get("classification")
    holder: dict[str, Any] = inner if isinstance(inner, dict) else doc
    evidence = holder.get("evidence")
    if not isinstance(evidence, list):
        return 0
    kept = [e for e in evidence if not _hidden_refs(e, hidden)]
    holder["evidence"] = kept
    return len(evidence) - len(kept)


def _drop_hidden_index(doc: dict[str, Any], hidden: set[str]) -> int:
    """Leave the hidden entries out of the memory's index; how many."""
    index = doc.get("state", {}).get("index")
    if not isinstance(index, dict) or not isinstance(index.get("entries"), dict):
        return 0
    entries = index["entries"]
    kept = {k: v for k, v in entries.items() if v != HIDDEN and k not in hidden}
    index["entries"] = kept
    return len(entries) - len(kept)


def scrub_ids(text: str, hidden: set[str]) -> tuple[str, int]:
    """``text`` with every hidden entry's id in it replaced by :data:`WITHHELD` (a string that
    is one such id becomes :data:`WITHHELD`), and how many were."""
    if text in hidden:
        return WITHHELD, 1
    count = 0

    def one(found: re.Match[str]) -> str:
        nonlocal count
        if found[0] not in hidden:
            return found[0]
        count += 1
        return WITHHELD

    return _UUID.sub(one, text), count


def _sweep(doc: Any, hidden: set[str]) -> int:
    """The policy's last line: in ``doc`` (changed in place), leave out each object in a list
    that names a hidden entry (``entry_id``, ``entry``, ``refs``), and replace a hidden
    entry's id in any other string with :data:`WITHHELD` (the rest of the string stays: a
    visible entry's text that cites a hidden one by id keeps its words); how many."""
    if not hidden:
        return 0
    count = 0

    def walk(node: Any) -> Any:
        nonlocal count
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str):
                    node[key], n = scrub_ids(value, hidden)
                    count += n
                else:
                    walk(value)
        elif isinstance(node, list):
            kept = []
            for value in node:
                if isinstance(value, dict) and _hidden_refs(value, hidden):
                    count += 1
                    continue
                if isinstance(value, str):
                    value, n = scrub_ids(value, hidden)
                    count += n
                kept.append(walk(value))
            node[:] = kept
        return node

    walk(doc)
    return count
