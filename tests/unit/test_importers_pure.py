"""The importers' pure parts: patch line counts as git counts them, each format's double count
(on the real sample files), entry ids stable across imports."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from streams.importers import FORMATS
from streams.importers.base import patch_numstat

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "samples"

PATCH = (
    "diff --git a/app.py b/app.py\n"
    "--- a/app.py\n"
    "+++ b/app.py\n"
    "@@ -1,3 +1,4 @@\n"
    " keep\n"
    "-old\n"
    "+new\n"
    "+more\n"
    " keep\n"
    "diff --git a/gone.txt b/gone.txt\n"
    "deleted file mode 100644\n"
    "--- a/gone.txt\n"
    "+++ /dev/null\n"
    "@@ -1,2 +0,0 @@\n"
    "-a\n"
    "-b\n"
)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_patch_lines_are_counted_as_git_apply_numstat_counts_them(
    newline: str, tmp_path: Path
) -> None:
    patch = PATCH.replace("\n", newline)
    ours = patch_numstat(patch)
    assert ours == {"app.py": (2, 1), "gone.txt": (0, 2)}
    (tmp_path / "p.diff").write_bytes(patch.encode())
    git = subprocess.run(
        ["git", "apply", "--numstat", str(tmp_path / "p.diff")],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    theirs = {
        path: (int(a), int(d)) for a, d, path in (line.split("\t") for line in git.splitlines())
    }
    assert ours == theirs


def test_claude_code_counts_one_call_per_message_id_with_its_last_usage() -> None:
    _, summary = FORMATS["claude-code"].import_file(
        SAMPLES / "claude-code" / "spotter-short.jsonl", "f"
    )
    # five lines share one message.id with identical usage: one call, not five
    assert (summary.calls, summary.duplicate_reports) == (1, 4)
    assert summary.output_tokens == 13


def test_codex_repeated_totals_add_nothing() -> None:
    [path] = (SAMPLES / "codex").glob("localpush-rollout-2026-02-23T20-34-25-*.jsonl")
    _, summary = FORMATS["codex"].import_file(path, "f")
    assert (summary.calls, summary.duplicate_reports) == (6, 5)
    assert (summary.input_tokens, summary.output_tokens) == (298373, 1123)


def test_a_second_import_yields_the_same_entries() -> None:
    path = SAMPLES / "openhands" / "basic_gui_mode.json"
    first, _ = FORMATS["openhands"].import_file(path, "f")
    again, _ = FORMATS["openhands"].import_file(path, "f")
    assert [e.entry_id for e in first[0].entries] == [e.entry_id for e in again[0].entries]
    assert first[0].entries == again[0].entries
