"""The crash tests' nodes (jobs, Loom branches, harvests): one node on embedded SQLite, killed
with its whole process group, then started again on the same VLLM_ACS_HOME and a new port; and
reads of that database while a node writes it."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tests.harness import ServerProcess

# The killed node's: short, so that the restarted node's reaper finds its lease expired at once
# (a node takes longer than this to start) and the test never waits out a 30 s default.
JOB_LEASE_MS = 3000
# The restarted node's, which runs the work to its end: a stall of a slow, loaded host (seconds)
# must not lose its lease, and the job then run a third time.
RESTARTED_LEASE_MS = 15000


def crash_node(
    model_dir: Path,
    home: Path,
    name: str,
    *,
    lease_ms: int = JOB_LEASE_MS,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """A node on `home` (not started), its log at `home/NAME.log`; `env`: more settings."""
    settings = {"VLLM_ACS_HOME": str(home), "VLLM_ACS_JOB_LEASE_MS": str(lease_ms), **(env or {})}
    return ServerProcess(model_dir=model_dir, log_path=home / f"{name}.log", env=settings)


def read_sqlite(home: Path, query: str, *args: Any) -> list[sqlite3.Row]:
    """`query`'s rows from the node's database, through a fresh connection per read (the server
    writes the file from another process)."""
    conn = sqlite3.connect(home / "vllm-acs.sqlite3", timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(query, args).fetchall()
    finally:
        conn.close()
