"""The bench's import figure: a directory of synthetic mini-swe-agent trajectories imported
through ``agentledger import``'s own code path, beside ``agentledger publish`` of the same
entries as one JSONL file.

The trajectories are written here (never read from a sample pack): SWE-bench-like runs of
mini-swe-agent with tool calls, their lengths drawn as a real agent's SWE-bench runs are (median
~150 entries, 34-586), each step a model call (OpenAI-style usage, a provider-reported cost), the
assistant's text, a bash tool call and its output.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

from infra.settings import Settings
from schemas.json_form import to_json_text
from streams.importers.publish import FileImport, import_paths
from streams.importers.swe_agent import MiniSweAgent
from streams.publish_file import publish_file

# SWE-bench runs of a real agent: 34-586 entries, median ~150 (simulate's "real" profile, cut
# to the range a trajectory of one SWE-bench instance spans).
MEDIAN, SIGMA, SHORTEST, LONGEST = 150, 0.6, 34, 586
ENTRIES_PER_STEP = 4  # model call, assistant text, tool call, tool result
FRAME = 5  # run started, system, task, diff, run finished


def trajectory_length(index: int) -> int:
    """Entries of the ``index``-th trajectory (deterministic, low-discrepancy quantiles)."""
    q = min(max((0.5 + index * 0.6180339887498949) % 1.0, 0.0005), 0.9995)
    return max(SHORTEST, min(LONGEST, round(MEDIAN * math.exp(SIGMA * NormalDist().inv_cdf(q)))))


def trajectory(
    index: int, tag: str, rng: random.Random, began: float, longest: int = LONGEST
) -> dict[str, Any]:
    """One mini-swe-agent trajectory (``.traj.json``) of about ``trajectory_length`` entries
    (at most ``longest``)."""
    steps = max(1, (min(trajectory_length(index), longest) - FRAME) // ENTRIES_PER_STEP)
    at = began
    repo = rng.choice(["django__django", "astropy__astropy", "sympy__sympy", "psf__requests"])
    instance = f"{repo}-{tag}-{index:05d}"
    task = (
        f"<pr_description>\nFix the regression in {repo.split('__')[1]}: "
        + "the parser drops the trailing field when the input ends with a separator. " * 6
        + "\n</pr_description>"
    )
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are a helpful assistant that can interact with a "
            "computer shell to solve programming tasks. " * 8,
        },
        {"role": "user", "content": task, "extra": {"timestamp": at}},
    ]
    prompt = 3_000
    cost = 0.0
    for step in range(steps):
        at += rng.uniform(2.0, 20.0)
        prompt += rng.randint(300, 2_500)
        out = rng.randint(40, 900)
        call_cost = prompt * 3e-6 * 0.2 + out * 15e-6
        cost += call_cost
        call_id = f"call_{index}_{step}"
        command = rng.choice(
            [
                "grep -rn 'def parse' src/",
                "python -m pytest tests/test_parser.py -x -q",
                "sed -n 120,180p src/parser.py",
                "git diff",
                "ls -la src/",
            ]
        )
        messages.append(
            {
                "role": "assistant",
                "content": f"THOUGHT: step {step}: look at how the parser handles the end of "
                "the input, then run the failing test again. " * rng.randint(1, 4),
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
                    }
                ],
                "extra": {
                    "response": {
                        "id": f"chatcmpl-{tag}-{index}-{step}",
                        "created": int(at),
                        "model": "claude-sonnet-4-5-20250929",
                        "choices": [{"finish_reason": "tool_calls"}],
                        "usage": {
                            "prompt_tokens": prompt,
                            "completion_tokens": out,
                            "total_tokens": prompt + out,
                            "prompt_tokens_details": {"cached_tokens": int(prompt * 0.8)},
                        },
                    },
                    "cost": call_cost,
                    "timestamp": at,
                },
            }
        )
        at += rng.uniform(0.1, 5.0)
        output = "\n".join(
            f"src/parser.py:{rng.randint(1, 900)}: def parse_{n}(text, sep=','):"
            for n in range(rng.randint(3, 40))
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "content": f"<returncode>0</returncode>\n<output>\n{output}\n</output>",
                "extra": {"returncode": rng.choice([0, 0, 0, 1]), "timestamp": at},
            }
        )
    patch = (
        "diff --git a/src/parser.py b/src/parser.py\n--- a/src/parser.py\n+++ b/src/parser.py\n"
        "@@ -120,3 +120,4 @@\n     fields = text.split(sep)\n-    return fields[:-1]\n"
        "+    if text.endswith(sep):\n+        return fields[:-1]\n+    return fields\n"
    )
    return {
        "trajectory_format": "mini-swe-agent-1",
        "instance_id": instance,
        "info": {
            "exit_status": "Submitted",
            "submission": patch,
            "mini_version": "1.14.0",
            "model_stats": {"instance_cost": cost, "api_calls": steps},
            "config": {"model": {"model_name": "anthropic/claude-sonnet-4-5-20250929"}},
        },
        "messages": messages,
    }


def write_trajectories(
    folder: Path, files: int, tag: str, seed: int = 26, longest: int = LONGEST
) -> Path:
    """``files`` trajectories under ``folder`` (made); ``tag`` makes their run ids unique;
    ``longest`` caps their entries (a test that needs many files, not many entries)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    began = time.time() - 30 * 86_400
    for index in range(files):
        doc = trajectory(index, tag, rng, began + index * 3_600, longest)
        (folder / f"{tag}-{index:05d}.traj.json").write_text(json.dumps(doc))
    return folder


@dataclass(frozen=True)
class ImportFigures:
    files: int
    entries: int
    import_s: float
    publish_s: float
    again_published: int  # a second import of the same files: entries sent (must be 0)
    again_s: float

    @property
    def import_rate(self) -> float:
        return self.entries / self.import_s

    @property
    def publish_rate(self) -> float:
        return self.entries / self.publish_s


async def measure(
    settings: Settings, folder: Path, import_fleet: str, publish_fleet: str, files: int
) -> ImportFigures:
    """Import ``files`` fresh trajectories into ``import_fleet``, then ``publish`` the same
    entries (as the importer made them, in ``publish_fleet``: an empty ledger beside it) as one
    JSONL file, timed in the same process one after the other; then the import again (nothing
    new: how long knowing that takes)."""

    tag = f"b{int(time.time() * 1000) % 10**9:x}"
    write_trajectories(folder / "trajectories", files, tag)
    paths: Sequence[Path] = MiniSweAgent.discover([folder / "trajectories"])
    jsonl = folder / "same-entries.jsonl"
    with jsonl.open("w") as out:
        for path in paths:
            runs, _ = MiniSweAgent.import_file(path, publish_fleet)
            for run in runs:
                out.writelines(to_json_text(e) + "\n" for e in run.entries)
    entries = 0

    def count(done: FileImport) -> None:
        nonlocal entries
        if done.error is not None:
            raise RuntimeError(f"bench import: {done.error}")
        entries += sum(s.sent for s in done.sent)

    started = time.perf_counter()
    await import_paths(settings, MiniSweAgent(), paths, import_fleet, count)
    import_s = time.perf_counter() - started
    started = time.perf_counter()
    report = await publish_file(jsonl, settings)
    publish_s = time.perf_counter() - started
    if report.sent != entries or report.invalid:
        raise RuntimeError(f"bench publish: {report.sent} sent of {entries}, {report.invalid}")
    imported, entries = entries, 0
    started = time.perf_counter()
    await import_paths(settings, MiniSweAgent(), paths, import_fleet, count)
    again_s = time.perf_counter() - started
    again, entries = entries, imported
    return ImportFigures(len(paths), entries, import_s, publish_s, again, again_s)
