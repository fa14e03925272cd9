"""Imports point one way (issue 28): ``schemas`` imports no other layer; ``projectors`` only
``schemas``; ``infra`` only ``schemas``; ``streams`` (the write side) and ``consumers`` (the read
side) those three but not each other. One composition root, ``infra/main.py``, may import every
layer, and nothing imports it. Counted with ``ast`` over every module, imports inside functions
included."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),
    "projectors": {"schemas"},
    "infra": {"schemas"},
    "streams": {"schemas", "projectors", "infra"},
    "consumers": {"schemas", "projectors", "infra"},
}
ROOT_MODULE = "infra.main"


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """Every module an import statement of ``path`` names (absolute imports; the project has no
    relative ones, which the last test checks)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
            for alias in node.names:  # `from streams import cli` imports streams.cli
                yield node.lineno, f"{node.module}.{alias.name}"


def _modules() -> Iterator[tuple[str, Path]]:
    for layer in ALLOWED:
        for path in sorted((ROOT / layer).rglob("*.py")):
            yield layer, path


def against_the_direction() -> list[str]:
    found = []
    for layer, path in _modules():
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for line, name in _imports(path):
            top = name.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{line} imports {name}"
            if name == ROOT_MODULE or name.startswith(ROOT_MODULE + "."):
                if module != ROOT_MODULE:
                    found.append(f"{where} (nothing imports the composition root)")
            elif module == ROOT_MODULE:
                continue
            elif top in ALLOWED and top != layer and top not in ALLOWED[layer]:
                found.append(where)
    return found


def test_no_import_goes_against_the_direction() -> None:
    assert against_the_direction() == []


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    """The walker finds imports at module level and inside functions (the check can fail)."""
    sample = tmp_path / "m.py"
    sample.write_text("import streams.x\ndef f():\n    from consumers import views\n")
    assert [n for _, n in _imports(sample)] == ["streams.x", "consumers", "consumers.views"]


def test_no_relative_imports() -> None:
    relative = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for _, path in _modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert relative == []
