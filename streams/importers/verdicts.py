"""Evaluation verdicts in: SWE-bench harness reports as ``VERIFIER_RESULT`` entries of the runs
they judge (``agentledger import swebench-report PATH...``).

A verdict is appended to a run that is already on the ledger (its trajectory imported first), as
the run's next entry, after ``RUN_FINISHED``: failure-classifications reclassifies the run on it
(profile ``swe-bench-eval``: resolved → class ``none``, else ``verifier``), so ``runs`` says
"submitted, evaluation passed" or "... failed". The files read (recognised by content):

* a per-instance ``report.json`` **keyed by instance id** (``{"django__django-11039": {...}}``);
* a **flat** per-instance report (SWE-smith: ``{"resolved": ..., "tests_status": ...}``), whose
  instance id is only in its folder's name (``.../<instance id>/report.json``) or its file name;
* a **run-level** report: ``resolved_ids``/``unresolved_ids``/``error_ids``/``empty_patch_ids``
  (the harness's ``<model>.<run>.json``), ``ids_resolved``/``ids_unresolved`` (SWE-smith), or
  the older ``results.json`` (lists ``resolved``, ``generated``, ``applied``: generated but not
  resolved is unresolved).

The verdict is ``resolved`` only (``patch_successfully_applied`` is not the verdict: a report
may say resolved although it is false). Matching: an instance id names the run whose id ends
with it at a word boundary (``mini-<id>``, ``swe-<id>``, ``oh-<file>-<id>``, or a renamed file
ending in it); a candidate that names no run, or two, is skipped with its reason. The same
report imported again sends nothing (its verdict's entry id is already the run's).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.importers.base import ImportFormatError, Verdict, tests_status_counts

FORMAT = "swebench-report"
HARNESS = "swe-bench"

_RUN_LEVEL_PASSED = ("resolved_ids", "ids_resolved")
_RUN_LEVEL_FAILED = ("unresolved_ids", "ids_unresolved", "error_ids", "empty_patch_ids")


@dataclass(frozen=True)
class Judged:
    """One verdict found in a report: the names its instance may go by (best first)."""

    candidates: tuple[str, ...]
    verdict: Verdict


def discover(paths: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        found.extend(sorted(path.rglob("*.json")) if path.is_dir() else [path])
    return list(dict.fromkeys(found))


def read_report(path: Path) -> list[Judged]:
    """The verdicts of one report file (see the module's list of layouts)."""
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise ImportFormatError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ImportFormatError(f"{path}: not a JSON object; not a SWE-bench report")
    if isinstance(doc.get("resolved"), bool):  # flat per-instance (SWE-smith)
        return [Judged(_names_of(path), _instance_verdict(doc))]
    if any(isinstance(doc.get(k), list) for k in (*_RUN_LEVEL_PASSED, *_RUN_LEVEL_FAILED)):
        return _run_level(doc, _RUN_LEVEL_PASSED, _RUN_LEVEL_FAILED)
    if isinstance(doc.get("resolved"), list):  # results.json of older harness runs
        return _results_json(doc)
    keyed = [
        Judged((str(k),), _instance_verdict(v))
        for k, v in doc.items()
        if isinstance(v, dict) and isinstance(v.get("resolved"), bool)
    ]
    if not keyed:
        raise ImportFormatError(
            f"{path}: no 'resolved' verdict in it; not a SWE-bench report (per instance, keyed "
            "by instance id or flat, or a run-level report with resolved/unresolved ids)"
        )
    return keyed


def _instance_verdict(report: Mapping[str, Any]) -> Verdict:
    details: dict[str, Any] = {"tests_status": tests_status_counts(dict(report))}
    for key in ("patch_exists", "patch_successfully_applied"):
        if isinstance(report.get(key), bool):
            details[key] = report[key]
    return Verdict(bool(report["resolved"]), HARNESS, details)


def _run_level(
    doc: dict[str, Any], passed: tuple[str, ...], failed: tuple[str, ...]
) -> list[Judged]:
    out: dict[str, Judged] = {}
    for keys, resolved in ((failed, False), (passed, True)):  # resolved wins over an error list
        for key in keys:
            for iid in doc.get(key) or []:
                if isinstance(iid, str) and iid:
                    out[iid] = Judged((iid,), Verdict(resolved, HARNESS, {"listed_in": key}))
    return list(out.values())


def _results_json(doc: dict[str, Any]) -> list[Judged]:
    resolved = {i for i in doc.get("resolved") or [] if isinstance(i, str)}
    judged = {i for k in ("generated", "applied") for i in doc.get(k) or [] if isinstance(i, str)}
    out = [
        Judged((i,), Verdict(True, HARNESS, {"listed_in": "resolved"})) for i in sorted(resolved)
    ]
    out += [
        Judged((i,), Verdict(False, HARNESS, {"listed_in": "generated, not resolved"}))
        for i in sorted(judged - resolved)
    ]
    return out


def _names_of(path: Path) -> tuple[str, ...]:
    """A flat report's instance id: its folder's name (the harness's layout), else its file's
    name without ``.report.json`` / ``.json``, with its shorter tails after a ``-`` (a file
    renamed with a prefix, e.g. ``swesmith-<id>.report.json``)."""
    stem = path.name.removesuffix(".json").removesuffix(".report").removesuffix("report")
    stem = stem.rstrip("._-")
    names = [path.parent.name] if path.name == "report.json" else []
    if stem:
        names.append(stem)  # its tails only where they still look like an instance id
        names += [stem[i + 1 :] for i, c in enumerate(stem) if c == "-" and "__" in stem[i + 1 :]]
    return tuple(dict.fromkeys(n for n in names if n))


_SEPARATORS = "-_./:"


def index_runs(run_ids: Iterable[str]) -> dict[str, list[str]]:
    """Every name a run id ends with at a separator (and the id itself) → the runs that do."""
    index: dict[str, list[str]] = {}
    for run_id in run_ids:
        index.setdefault(run_id, []).append(run_id)
        for i, c in enumerate(run_id):
            if c in _SEPARATORS and run_id[i + 1 :]:
                index.setdefault(run_id[i + 1 :], []).append(run_id)
    return index


def match(candidates: tuple[str, ...], index: Mapping[str, list[str]]) -> tuple[str | None, str]:
    """The one run the first candidate that names any run names (``index``: from
    :func:`index_runs`); else None and why."""
    for name in candidates:
        found = sorted(set(index.get(name, ())))
        if len(found) == 1:
            return found[0], ""
        if len(found) > 1:
            shown = ", ".join(found[:3])
            return None, f"instance {name} names {len(found)} runs ({shown}); none was judged"
    return None, f"no run on the ledger for instance {candidates[0]} (import its trajectory first)"
