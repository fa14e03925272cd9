"""SQL lives in the store and migration modules (issue 28): ``projectors/stores/*`` reads and
writes AgentLedger's tables, ``infra/migrate.py`` (with ``infra/migrations/*.sql``) makes them.
Any other module of the five layers holding an SQL statement fails this test, unless it is one
of the few named exceptions below, each with its reason.

Found with ``ast``: every string literal (f-string parts and ``sql.SQL(...)`` arguments included;
docstrings excluded) that starts with an SQL command word and has the shape of a statement: an
upper-case clause word (``FROM``, ``INTO``, ``TABLE``, ``SET``, ...) or a ``%s`` placeholder, or
a one-word command such as ``SELECT 1`` or ``LISTEN al_changes``. Prose ("Delete the rows ...")
does not count."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("schemas", "projectors", "streams", "consumers", "infra")
STORES = "projectors/stores/"
MIGRATIONS = "infra/migrate.py"
# Modules that hold SQL on purpose outside the stores; keep this short, one reason each.
EXCEPTIONS: dict[str, str] = {
    "infra/databases.py": "provisioning: CREATE/DROP DATABASE, the readiness probe and the smoke "
    "round trip on a TEMP table; the PostgreSQL server, none of AgentLedger's tables",
    "streams/naive.py": "the bench's naive baseline (one transaction per entry), deliberately the "
    "naive way, on its own al_naive_* tables",
    "consumers/examples/mirror.py": "an example of a user's consumer writing the user's own "
    "tables: user code, shown as a user would write it",
}

_COMMAND = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|WITH|LOCK|TRUNCATE|LISTEN|UNLISTEN"
    r"|NOTIFY|VACUUM|COPY|SET)\s",
    re.IGNORECASE,
)
# the shape of a statement: a clause word in upper case, or a placeholder
_SHAPE = re.compile(
    r"\b(FROM|INTO|TABLE|SET|WHERE|VALUES|DATABASE|INDEX|VIEW|RETURNING|CONFLICT|JOIN)\b"
    r"|%s|%\(\w+\)s"
)
# a command with one argument: SELECT 1, LISTEN al_changes, VACUUM al_runs, SELECT now()
_ONE_WORD = re.compile(
    r"^\s*(SELECT|LISTEN|UNLISTEN|NOTIFY|VACUUM|TRUNCATE|LOCK)\s+[\w.(),'%]+\s*;?\s*$"
)


def is_sql(text: str) -> bool:
    return bool(_COMMAND.match(text) and (_SHAPE.search(text) or _ONE_WORD.match(text)))


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                found.add(id(body[0].value))
    return found


def _literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every string literal's text with its line; an f-string as its parts joined, each
    interpolation standing as ``{}`` (``f"DELETE FROM {t} WHERE id = %s"``)."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield (
                node.lineno,
                "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values),
            )
        elif isinstance(node, ast.Constant) and id(node) not in skip:
            if isinstance(node.value, str):
                yield node.lineno, node.value
            elif isinstance(node.value, bytes):
                yield node.lineno, node.value.decode(errors="replace")


def sql_in(source: str, name: str = "<sample>") -> list[tuple[int, str]]:
    """(line, first line of the statement) of every SQL statement literal of ``source``."""
    found: dict[int, str] = {}
    for line, text in _literals(ast.parse(source, name)):
        if is_sql(text):  # an f-string and its first part: one statement, the longer text
            first = text.strip().splitlines()[0][:80]
            found[line] = max(found.get(line, ""), first, key=len)
    return sorted(found.items())


def _modules() -> Iterator[tuple[str, Path]]:
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path


def holding_sql() -> dict[str, list[tuple[int, str]]]:
    """Every module of the five layers that holds SQL, with where."""
    found = {}
    for rel, path in _modules():
        statements = sql_in(path.read_text(), str(path))
        if statements:
            found[rel] = statements
    return found


def allowed(module: str) -> bool:
    return module.startswith(STORES) or module == MIGRATIONS or module in EXCEPTIONS


def test_sql_only_in_the_store_and_migration_modules() -> None:
    offending = [
        f"{module}:{line}: {text}"
        for module, statements in holding_sql().items()
        if not allowed(module)
        for line, text in statements
    ]
    assert not offending, "SQL outside projectors/stores/ and infra/migrate.py:\n" + "\n".join(
        offending
    )


def test_every_exception_still_holds_sql() -> None:
    """A named exception that no longer holds SQL leaves the list (it stays honest)."""
    found = holding_sql()
    assert [m for m in EXCEPTIONS if m not in found] == []


def test_the_stores_and_migrations_are_seen() -> None:
    """The detector sees the SQL where it belongs (it is not blind to this code's style)."""
    found = holding_sql()
    assert MIGRATIONS in found
    for store in ("postgres.py", "postgres_ops.py", "outbox.py", "worker_health.py"):
        assert STORES + store in found


SAMPLE = '''
"""Select the rows FROM the ledger: a docstring, not SQL."""
from psycopg import sql

def f(conn, table):
    """DELETE FROM t WHERE id = %s (a docstring, not SQL)."""
    conn.execute("SELECT 1")
    conn.execute(
        "INSERT INTO al_x (a, b) "
        "VALUES (%s, %s)"
    )
    conn.execute(f"DELETE FROM {table} WHERE id = %s", (1,))
    conn.execute(sql.SQL("UPDATE {} SET a = 1").format(sql.Identifier(table)))
    conn.execute("""
        WITH t AS (SELECT 1) SELECT * FROM t
    """)
    conn.execute("LISTEN al_changes")
    print("Delete the rows the relay sent before it stopped")
    print("drop the oldest groups until in budget")
    print("select a projection with --projection")
'''


def test_the_detector_finds_sql_and_not_prose() -> None:
    assert [line for line, _ in sql_in(SAMPLE)] == [7, 9, 12, 13, 14, 17]


def test_the_check_can_fail(tmp_path: Path) -> None:
    """A module outside the stores holding SQL is reported with its line."""
    module = tmp_path / "streams" / "m.py"
    module.parent.mkdir()
    module.write_text('async def f(conn):\n    await conn.execute("SELECT a FROM al_runs")\n')
    found = sql_in(module.read_text())
    assert found == [(2, "SELECT a FROM al_runs")]
    assert not allowed("streams/m.py")


def test_a_readers_connect_gives_up_on_a_server_that_does_not_answer() -> None:
    """Found trying the product: the import's fleet check (and every reader) waited on a server
    that did not answer for as long as TCP does; now CONNECT_TIMEOUT_S, unless the address says."""
    from projectors.stores import postgres_ops as ops

    assert ops._timeout("postgresql://postgres@10.0.0.1:5432/x") == {
        "connect_timeout": ops.CONNECT_TIMEOUT_S
    }
    assert ops._timeout("postgresql://postgres@10.0.0.1:5432/x?connect_timeout=2") == {}
