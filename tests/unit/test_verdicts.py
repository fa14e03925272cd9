"""Evaluation verdicts read from the SWE-bench harness's report layouts (samples2 README figures)
and matched to the runs they judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streams.importers.base import ImportFormatError
from streams.importers.verdicts import index_runs, match, read_report
from tests.packs import SHARED

EVAL = SHARED / "samples2" / "swebench-eval"


def test_a_report_keyed_by_instance_gives_its_verdict_and_test_counts() -> None:
    [judged] = read_report(EVAL / "pr814-django__django-13660.report.json")
    assert judged.candidates == ("django__django-13660",)
    assert judged.verdict.resolved is False  # a regression: P2P 4 success / 2 failure
    assert judged.verdict.details["tests_status"]["PASS_TO_PASS"] == {"success": 4, "failure": 2}
    [judged] = read_report(EVAL / "pr814-django__django-11039.report.json")
    assert judged.verdict.resolved is True


def test_a_flat_report_is_resolved_by_its_verdict_not_by_its_apply_flag() -> None:
    [pydantic] = read_report(EVAL / "swesmith-pydantic__pydantic.acb0f10f.pr_8316.report.json")
    assert pydantic.verdict.resolved is True  # although patch_successfully_applied is false
    assert pydantic.verdict.details["patch_successfully_applied"] is False
    assert "pydantic__pydantic.acb0f10f.pr_8316" in pydantic.candidates
    [pandas] = read_report(EVAL / "swesmith-pandas-dev__pandas.95280573.pr_53856.report.json")
    assert pandas.verdict.resolved is False


def test_a_flat_report_in_the_harness_layout_is_named_by_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "run_evaluation" / "pandas-dev__pandas.95280573.pr_53856"
    folder.mkdir(parents=True)
    source = EVAL / "swesmith-pandas-dev__pandas.95280573.pr_53856.report.json"
    (folder / "report.json").write_bytes(source.read_bytes())
    [judged] = read_report(folder / "report.json")
    assert judged.candidates[0] == "pandas-dev__pandas.95280573.pr_53856"


def test_a_run_level_report_gives_a_verdict_per_listed_instance() -> None:
    judged = read_report(EVAL / "swesmith-run-report.json")
    # README: total 53, resolved 3, unresolved 50
    assert len(judged) == 53 and sum(j.verdict.resolved for j in judged) == 3
    by_id = {j.candidates[0]: j.verdict.resolved for j in judged}
    assert by_id["pydantic__pydantic.acb0f10f.pr_8316"] is True
    assert by_id["pandas-dev__pandas.95280573.pr_53856"] is False


def test_the_harness_run_report_and_older_results_json_are_read(tmp_path: Path) -> None:
    harness = tmp_path / "gpt-4o.run1.json"
    harness.write_text(
        json.dumps({"resolved_ids": ["a__b-1"], "unresolved_ids": ["a__b-2"], "error_ids": ["c"]})
    )
    assert {j.candidates[0]: j.verdict.resolved for j in read_report(harness)} == {
        "a__b-1": True,
        "a__b-2": False,
        "c": False,
    }
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"resolved": ["x__y-1"], "generated": ["x__y-1", "x__y-2"]}))
    assert {j.candidates[0]: j.verdict.resolved for j in read_report(results)} == {
        "x__y-1": True,
        "x__y-2": False,
    }


def test_a_file_that_is_no_report_is_refused_by_content(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"hello": {"world": 1}}))
    with pytest.raises(ImportFormatError, match="not a SWE-bench report"):
        read_report(path)


RUNS = [
    "mini-django__django-13660",
    "mini-django__django-11039",
    "swe-swesmith-1.0.1-pandas-dev__pandas.95280573.pr_53856",
    "oh-output-sympy__sympy-13660",
]


@pytest.mark.parametrize(
    ("candidates", "run_id"),
    [
        (("django__django-13660",), "mini-django__django-13660"),
        (("django__django-1103",), None),  # a prefix of another id names nothing
        (("swesmith-pandas-dev__pandas.95280573.pr_53856", "pandas-dev__pandas.95280573.pr_53856"),
         "swe-swesmith-1.0.1-pandas-dev__pandas.95280573.pr_53856"),
        (("13660",), None),  # two runs end with it: ambiguous, none judged
    ],
)  # fmt: skip
def test_an_instance_names_the_one_run_ending_with_it(
    candidates: tuple[str, ...], run_id: str | None
) -> None:
    found, why = match(candidates, index_runs(RUNS))
    assert found == run_id
    assert (why == "") == (run_id is not None)
    if candidates == ("13660",):
        assert "names 2 runs" in why
