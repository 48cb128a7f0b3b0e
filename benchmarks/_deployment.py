"""What the deployment benchmarks share: how many nodes the machine's memory allows, a deployment
of nodes started on a private PostgreSQL database and Redis prefix, and SIGTERM unwinding like
Ctrl-C so every node and nginx is stopped.

Not a benchmark itself (`make bench` skips modules starting with `_`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.e2e.shared_nodes import shared_nodes
from tests.harness import ServerProcess

NODE_GIB = float(os.environ.get("VLLM_ACS_BENCH_NODE_GIB", "2.5"))
# What the rest of the machine (the services, other test runs) is left at least.
HEADROOM_GIB = 4.0


def meminfo_gib(field_name: str = "MemAvailable") -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def node_count() -> int:
    """3 nodes when the memory allows (VLLM_ACS_BENCH_NODES=2 or 3 forces it), else 2."""
    forced = os.environ.get("VLLM_ACS_BENCH_NODES", "")
    if forced in ("2", "3"):
        return int(forced)
    return 3 if meminfo_gib() >= 3 * NODE_GIB + HEADROOM_GIB else 2


@contextlib.contextmanager
def deployment(
    model_dir: Path, home: Path, env: dict[str, str], per_node: list[Any]
) -> Iterator[tuple[list[ServerProcess], str]]:
    """The started nodes and the database's SQLAlchemy URL; stopped however the block ends."""
    home.mkdir(parents=True)
    started = time.monotonic()
    with shared_nodes(model_dir, home, env, per_node=per_node) as (nodes, database_url):
        print(f"  {len(nodes)} node(s) up in {time.monotonic() - started:.0f} s", flush=True)
        yield nodes, database_url


def stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every `finally` stops its nodes and nginx."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)
