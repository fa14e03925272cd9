"""Shared fixtures. ``services`` gives integration tests real Kafka, PostgreSQL and Redis."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from infra.provision import provisioned
from infra.settings import Settings


@pytest.fixture(scope="session")
def services() -> Iterator[Settings]:
    with provisioned() as settings:
        yield settings


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """In CI an integration test may not be skipped: a skip there is reported as a failure."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and os.environ.get("CI") and item.get_closest_marker("integration"):
        report.outcome = "failed"
        report.longrepr = f"integration test skipped in CI: {report.longrepr}"
