"""Two nodes of one deployment on a private PostgreSQL database and Redis prefix, for e2e tests.

The database is upgraded first, as an operator does (`vllm-acs db upgrade`); both nodes start
at once and are stopped at the end however the module ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.harness import ServerProcess
from tests.services import REDIS_URL, private_pg_database, private_redis_prefix


@contextlib.contextmanager
def shared_nodes(
    model_dir: Path,
    home: Path,
    env: dict[str, str],
    count: int = 2,
    *,
    per_node: list[tuple[dict[str, str], list[str]]] | None = None,
) -> Iterator[tuple[list[ServerProcess], str]]:
    """(the started nodes, the database's SQLAlchemy URL). `per_node`: each node's own
    environment and serve arguments (e.g. another model id), one entry per node."""
    with private_pg_database() as database_url, private_redis_prefix() as prefix:
        env = {
            "VLLM_ACS_HOME": str(home),
            "VLLM_ACS_DATABASE_URL": database_url,
            "VLLM_ACS_REDIS_URL": REDIS_URL,
            "VLLM_ACS_REDIS_PREFIX": prefix,
            **env,
        }
        # PostgreSQL is upgraded by the operator, before any node starts.
        subprocess.run(
            [sys.executable, "-m", "vllm_acs.cli", "db", "upgrade"],
            env={**os.environ, **env},
            check=True,
            capture_output=True,
        )
        own = per_node or [({}, []) for _ in range(count)]
        servers = [
            ServerProcess(
                model_dir=model_dir,
                log_path=home / f"node-{i}.log",
                env={**env, **node_env},
                extra_args=list(node_args),
            )
            for i, (node_env, node_args) in enumerate(own)
        ]
        starters = [threading.Thread(target=s.start) for s in servers]
        for starter in starters:
            starter.start()
        for starter in starters:
            starter.join()
        try:
            for server in servers:
                assert server.process is not None, server.log_tail()
            yield servers, database_url
        finally:
            for server in servers:
                server.stop()
