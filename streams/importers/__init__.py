"""Importers: real agents' logs as ledger runs (``agentledger import FORMAT PATH...``).

Each format module has ``discover(paths)`` (the files to read under files or folders) and
``import_file(path, fleet_id)`` (a pure mapping of one file to runs and a summary);
:mod:`streams.importers.publish` sends what the ledger does not hold yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

from streams.importers import claude_code, codex
from streams.importers.base import ImportedRun, Summary

Discover = Callable[[Iterable[Path]], list[Path]]
ImportFile = Callable[[Path, str], tuple[list[ImportedRun], Summary]]

FORMATS: dict[str, ModuleType] = {
    claude_code.FORMAT: claude_code,
    codex.FORMAT: codex,
}
