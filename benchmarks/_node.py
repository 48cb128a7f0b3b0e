"""A vllm-acs node of the tiny model for benchmarks, in a temporary home, and a key for it.

Not a benchmark itself (`make bench` skips modules starting with `_`).
"""

from __future__ import annotations

from pathlib import Path

from tests.harness import ServerProcess


def tiny_node(tmp: Path) -> ServerProcess:
    """A node (not started yet) of the tiny model written under `tmp`, with its own home."""
    from vllm_acs.tiny_model import write_tiny_model

    model_dir = write_tiny_model(tmp / "tiny-llama")
    home = tmp / "acs-home"
    home.mkdir()
    return ServerProcess(
        model_dir=model_dir,
        log_path=home / "server.log",
        env={"VLLM_ACS_HOME": str(home), "VLLM_ACS_GPU_SHAPE": "cpu-test"},
    )


def unlimited_key(node: ServerProcess) -> str:
    """A key whose starts-per-minute limit is far above any benchmark's rate."""
    return node.create_key("bench", "--starts-per-minute", "1000000")
