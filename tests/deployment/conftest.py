"""A failed deployment test's report carries what explains it: nginx's error log and the tail of
each node's log (a 502 from nginx, a node that went away, are read there, not guessed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    deployment = getattr(item, "funcargs", {}).get("deployment")
    if deployment is None:
        return
    proxy = getattr(deployment, "proxy", None)
    if proxy is not None:
        report.sections.append(("nginx log", proxy.log()))
    report.sections.append(("node logs", deployment.logs()))
