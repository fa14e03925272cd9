"""Importers: real agents' logs as ledger runs (``agentledger import FORMAT PATH...``).

Each format has ``discover(paths)`` (the files to read under files or folders) and
``import_file(path, fleet_id)`` (a pure mapping of one file to runs and a summary);
:mod:`streams.importers.publish` sends what the ledger does not hold yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from streams.importers import aider, claude_code, codex, openhands
from streams.importers.base import ImportedRun, Summary
from streams.importers.otel import OtelFiles
from streams.importers.swe_agent import MiniSweAgent, SweAgent


class Importer(Protocol):
    FORMAT: str

    def discover(self, paths: Iterable[Path]) -> list[Path]: ...

    def import_file(
        self, path: Path, fleet_id: str, settled: bool = False
    ) -> tuple[list[ImportedRun], Summary]:
        """``settled``: the file may still be growing; leave out what may still change."""
        ...


FORMATS: dict[str, Importer] = {
    claude_code.FORMAT: claude_code,
    codex.FORMAT: codex,
    openhands.FORMAT: openhands,
    aider.FORMAT: aider,
    MiniSweAgent.FORMAT: MiniSweAgent(),
    SweAgent.FORMAT: SweAgent(),
    OtelFiles.FORMAT: OtelFiles(),
}
