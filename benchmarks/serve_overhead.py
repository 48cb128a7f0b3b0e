"""End-to-end latency the plugin adds to a 1-token /v1/completions, over HTTP, against plain vLLM.

In one run: a real `vllm-acs serve` node of the tiny model (as tests/harness.py starts it) and
plain vLLM with no plugin, same model and flags, both on loopback; then paired requests, one to
each server, order alternating. Run: `python -m benchmarks.serve_overhead` (VLLM_ACS_BENCH_PAIRS
pairs, default 300; a few minutes on two cores, most of it starting the two servers).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks._node import tiny_node, unlimited_key
from tests.harness import CHECKPOINT, MODEL_ID, ServerProcess

PAIRS = int(os.environ.get("VLLM_ACS_BENCH_PAIRS", "300"))
WARMUP = 20
PROMPT = "The sky is"
# VLLM_PLUGINS is an allowlist: a name no plugin has means vLLM loads none (unset would load all).
NO_PLUGIN = "vllm-acs-bench-none"
# What `vllm-acs serve` runs (its default arguments too), minus putting `acs` into VLLM_PLUGINS
# (the `vllm` script of the CPU build fails on its version lookup: same launcher, plugin off).
PLAIN_SERVE = (
    "import sys; from vllm_acs.launcher import run_vllm_serve; "
    "run_vllm_serve(sys.argv[1:], plugin=False)"
)


class PlainVllm(ServerProcess):
    """vLLM's own server without the plugin: ServerProcess's arguments, process group and stop()."""

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-c", PLAIN_SERVE, *self.serve_args]

    @property
    def environment(self) -> dict[str, str]:
        return {**super().environment, "VLLM_PLUGINS": NO_PLUGIN}


def _complete(client: httpx.Client, model: str) -> float:
    """Milliseconds for one whole 1-token completion: request sent, answer read."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    started = time.perf_counter()
    response = client.post("/v1/completions", json=body)
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"{client.base_url} answered {response.status_code}: {response.text}")
    return elapsed


def _client(server: ServerProcess, headers: dict[str, str]) -> httpx.Client:
    # trust_env=False: a proxy from the environment must not sit between the client and loopback.
    return httpx.Client(base_url=server.base_url, headers=headers, timeout=120, trust_env=False)


def measure() -> tuple[list[float], list[float]]:
    """(plain vLLM ms, plugin node ms), index i of each from the same pair."""
    with tempfile.TemporaryDirectory() as tmp:
        node = tiny_node(Path(tmp))
        plain: PlainVllm | None = None
        plain_ms: list[float] = []
        node_ms: list[float] = []
        try:
            # One after the other: two engines starting at once would share the machine's cores.
            node.start()
            # Made once the node listens, so free_port() cannot hand out the node's port again.
            plain = PlainVllm(model_dir=node.model_dir, log_path=Path(tmp) / "plain.log")
            plain.start()
            secret = unlimited_key(node)
            with (
                _client(plain, {}) as plain_client,
                _client(node, {"Authorization": f"Bearer {secret}"}) as node_client,
            ):
                sides = [(plain_client, CHECKPOINT), (node_client, MODEL_ID)]
                for _ in range(WARMUP):
                    for client, model in sides:
                        _complete(client, model)
                for i in range(PAIRS):
                    # Alternating who goes first, so neither side always follows the other.
                    order = [(plain_client, CHECKPOINT, plain_ms), (node_client, MODEL_ID, node_ms)]
                    for client, model, samples in order if i % 2 == 0 else order[::-1]:
                        samples.append(_complete(client, model))
        finally:
            if plain is not None:
                plain.stop()
            node.stop()
        return plain_ms, node_ms


def _p(samples: list[float], q: int) -> float:
    return statistics.median(samples) if q == 50 else statistics.quantiles(samples, n=100)[q - 1]


def main() -> None:
    plain, node = measure()
    added = [n - p for p, n in zip(plain, node, strict=True)]
    print(f"{PAIRS} request pairs, one to each server in alternating order; milliseconds each.")
    print(f'POST /v1/completions "{PROMPT}", max_tokens 1, one keep-alive connection per server.')
    print(f"{'server':<34} {'p50':>8} {'p99':>8}")
    for name, samples in (
        ("plain vLLM (no plugin)", plain),
        ("vllm-acs node", node),
        ("added per pair (node - plain)", added),
    ):
        print(f"{name:<34} {_p(samples, 50):8.3f} {_p(samples, 99):8.3f}")
    print(f"p50 ratio (node / plain): {_p(node, 50) / _p(plain, 50):.3f}")


if __name__ == "__main__":
    main()
