"""Two nodes (or more) of one deployment on a private PostgreSQL database and Redis prefix, for
e2e tests, and the reads of the tables they share.

The database is upgraded first, as an operator does (`vllm-acs db upgrade`); the nodes start
at once and are stopped at the end however the module ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness import ServerProcess, group_members
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


@dataclass
class Cluster:
    nodes: list[ServerProcess]
    dsn: str  # asyncpg's, for reading the tables the nodes write

    @classmethod
    def of(cls, nodes: list[ServerProcess], database_url: str) -> Cluster:
        """From `shared_nodes`' answer (its SQLAlchemy URL)."""
        return cls(nodes, database_url.replace("postgresql+asyncpg://", "postgresql://"))

    def query(self, statement: str, *args: Any) -> list[dict[str, Any]]:
        return asyncio.run(_fetch(self.dsn, statement, *args))

    def owner_node(self, owner: str) -> ServerProcess:
        """The node whose process runs under a job's `owner` (`hostname-pid-nonce`, the API
        server's pid)."""
        pid = int(owner.rsplit("-", 2)[1])
        # Matched on the process group rather than the Popen pid alone: whichever process of a
        # node hosts the runner, it is in that node's group.
        (node,) = [
            n for n in self.nodes if n.process is not None and pid in group_members(n.process.pid)
        ]
        return node

    def usage_rows(self, key_id: str, expected: int, timeout_s: float = 30) -> list[dict]:
        """The key's usage rows, once at least `expected` are written (the ledger writes from a
        queue, possibly just after a job ended)."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.query(
                "SELECT request_id, status, prompt_tokens, completion_tokens FROM usage_rows "
                "WHERE key_id = $1",
                key_id,
            )
            if len(rows) >= expected or time.monotonic() > deadline:
                return rows
            time.sleep(0.3)


def node_logs(nodes: list[ServerProcess], lines: int = 40) -> str:
    """The last lines of each node's log, for an assertion's message."""
    return "\n".join(f"--- {n.log_path.name}\n{n.log_tail(lines)}" for n in nodes)


async def _fetch(dsn: str, statement: str, *args: Any) -> list[dict[str, Any]]:
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return [dict(row) for row in await conn.fetch(statement, *args)]
    finally:
        await conn.close()
