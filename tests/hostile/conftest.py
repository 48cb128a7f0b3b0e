"""Fixtures of the hostile-input tests: one node on PostgreSQL (and Redis), started on first use
and shared by every module that needs a finding that only PostgreSQL shows (it checks lengths
that SQLite ignores). A server start costs about a minute of the suite, so there is one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.shared_nodes import Cluster, shared_nodes


@pytest.fixture(scope="session")
def pg_node(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One node of a deployment on a private PostgreSQL database; `.nodes[0]` is the server,
    `.query()` reads its tables."""
    home = tmp_path_factory.mktemp("hostile-pg-home")
    with shared_nodes(tiny_model_dir, home, {}, count=1) as (servers, database_url):
        yield Cluster.of(servers, database_url)
