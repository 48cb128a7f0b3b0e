"""Harvest throughput against plain prefill, and what a harvest costs interactive requests, on one
node, in one run.

A real `vllm-acs serve` node of the tiny model (as tests/harness.py starts it, but with vLLM's
default thread binding, as an operator's only node on a machine runs) on loopback, one key. The
same N prompts (VLLM_ACS_BENCH_HARVEST_PROMPTS, default 256, of PROMPT_TOKENS token ids each) go
three ways:

- plain: `POST /v1/completions`, max_tokens 1, as many in flight as a harvest keeps in the engine
  (`harvest_prompts_in_flight`: VLLM_ACS_BENCH_HARVEST_IN_FLIGHT, default 8, the node's default):
  prompt tokens per second, first send to last answer;
- harvest of the default 3 layers, and of all layers: prompt tokens per second over the run as
  the node times it (`timings.wall_s`: first capture to last shard written) and from the client
  (submit to seeing `done`), and the shard bytes written per second;
- the p50 and p95 latency of a small completion (4 tokens) sent one after another on the idle
  node and while an all-layers harvest runs, in turns (SMALL_REQUESTS in all, WINDOWS turns: each
  harvest is cancelled once its share is measured), so that the host's drifting load weighs on
  both sides alike;
- an all-layers harvest alone, then under a steady live load (small completions back to back,
  LIVE_CLIENTS at once, for the harvest's whole run): its node tokens/s and the share it keeps.

The client stands in for a researcher on another machine, so its thread runs ahead of the
node's (SCHED_FIFO, set after the node started; without the permission it runs at normal
priority and says so). On a two-core host the kernel left a normal thread runnable but off the
CPU for 0.1-2 s while a harvest ran (docs/decisions.md, "The benchmark's client waits for no
CPU"), and the small completions' p95 was then the client's own wait. The output gives the
longest time the client's thread waited for a CPU during one small completion (Linux
schedstat): near zero when the figures are the node's.

Run: `python -m benchmarks.harvest_throughput` (a few minutes on two cores).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks._node import tiny_node, unlimited_key
from tests.harness import MODEL_ID, ServerProcess

PROMPTS = int(os.environ.get("VLLM_ACS_BENCH_HARVEST_PROMPTS", "256"))
PROMPT_TOKENS = 128
# The node's harvest_prompts_in_flight (and the plain side's concurrency): the trade between a
# harvest's speed and the latency of interactive requests beside it.
IN_FLIGHT = int(os.environ.get("VLLM_ACS_BENCH_HARVEST_IN_FLIGHT", "8"))
SMALL = {"model": MODEL_ID, "prompt": "The sky is", "max_tokens": 4, "temperature": 0}
# Enough for a steady p50 on a noisy host, idle and busy alike, split into WINDOWS turns.
SMALL_REQUESTS = 100
# Turns of idle and busy small completions (idle_and_busy).
WINDOWS = 4
LIVE_CLIENTS = 1


def _expect(answer: httpx.Response, status: int, what: str) -> httpx.Response:
    """`answer` if it has `status`; otherwise a RuntimeError naming `what`, the status and body."""
    if answer.status_code != status:
        raise RuntimeError(f"{what} answered {answer.status_code}: {answer.text}")
    return answer


def _prompts(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, 1000, size=PROMPT_TOKENS)] for _ in range(PROMPTS)]


@dataclass
class HarvestRun:
    layers: str
    node_tokens_per_s: float
    client_tokens_per_s: float
    bytes_per_s: float


async def plain_prefill(client: httpx.AsyncClient, prompts: list[list[int]]) -> float:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(prompt: list[int]) -> None:
        async with gate:
            body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            _expect(await client.post("/v1/completions", json=body), 200, "completion")

    started = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    return sum(map(len, prompts)) / (time.perf_counter() - started)


async def _submit(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    """POST /v1/harvest; the harvest's id."""
    submitted = _expect(await client.post("/v1/harvest", json=body), 202, "harvest")
    return str(submitted.json()["job_id"])


async def harvest(
    client: httpx.AsyncClient, prompts: list[list[int]], layers: Any
) -> tuple[HarvestRun, dict[str, Any]]:
    body: dict[str, Any] = {"model": MODEL_ID, "prompts": prompts, "shard_size": 32}
    if layers is not None:
        body["layers"] = layers
    started = time.perf_counter()
    job_id = await _submit(client, body)
    while True:
        # A long poll (the spec's `?wait=`): a tight poll would load the node's API process
        # beside the small completions measured.
        answer = await client.get(f"/v1/harvest/{job_id}", params={"wait": 30})
        _expect(answer, 200, "harvest poll")
        job = answer.json()
        if job["status"] not in ("pending", "running"):
            break
        if answer.headers.get("x-acs-longpoll") == "declined":  # the node's waits are taken
            await asyncio.sleep(float(answer.headers.get("retry-after", "3")))
    seen = time.perf_counter() - started
    if job["status"] != "done":
        raise RuntimeError(f"harvest ended {job['status']}: {job.get('error')}")
    timings = job["result"]["timings"]
    manifest = _expect(await client.get(job["result"]["manifest_url"]), 200, "manifest").json()
    written = sum(shard["bytes"] for shard in manifest["shards"])
    tokens = timings["tokens"]
    run = HarvestRun(
        "default (3)" if layers is None else str(layers),
        tokens / timings["wall_s"],
        tokens / seen,
        written / timings["wall_s"],
    )
    return run, job


def _cpu_wait_ms() -> float:
    """How long this thread has been runnable but off the CPU, in all (Linux schedstat)."""
    with open("/proc/thread-self/schedstat") as stat:
        return int(stat.read().split()[1]) / 1e6


# The client's longest wait for a CPU during one small completion (the module docstring).
client_waits_ms: list[float] = []


async def small_latencies(client: httpx.AsyncClient, count: int = SMALL_REQUESTS) -> list[float]:
    latencies = []
    for _ in range(count):
        waited = _cpu_wait_ms()
        started = time.perf_counter()
        _expect(await client.post("/v1/completions", json=SMALL), 200, "small completion")
        latencies.append((time.perf_counter() - started) * 1000)
        client_waits_ms.append(_cpu_wait_ms() - waited)
    return latencies


async def idle_and_busy(client: httpx.AsyncClient) -> tuple[list[float], list[float]]:
    """Small completions on the idle node and during an all-layers harvest, in WINDOWS turns
    (idle, then a harvest that is cancelled once its share is measured), so that the host's
    load drifting over the run weighs on both sides alike."""
    idle: list[float] = []
    busy: list[float] = []
    each = SMALL_REQUESTS // WINDOWS
    # Enough prompts that the harvest outlasts its window, at its speed on a bound node.
    body = {"model": MODEL_ID, "prompts": _prompts(2) * 4, "shard_size": 32, "layers": "all"}
    for _ in range(WINDOWS):
        idle += await small_latencies(client, each)
        job_id = await _submit(client, body)
        await asyncio.sleep(0.5)  # its parts claimed and its prompts in the engine
        busy += await small_latencies(client, each)
        cancelled = await client.delete(f"/v1/harvest/{job_id}")
        if cancelled.status_code != 200:
            raise RuntimeError(f"the harvest ended before its window did: {cancelled.text}")
        await asyncio.sleep(0.5)  # its prompts aborted in the engine
    return idle, busy


def p95(values: list[float]) -> float:
    return float(np.percentile(values, 95))


async def under_live_load(
    client: httpx.AsyncClient, prompts: list[list[int]]
) -> tuple[HarvestRun, list[float]]:
    """An all-layers harvest while LIVE_CLIENTS send small completions back to back."""
    done = asyncio.Event()
    latencies: list[float] = []

    async def live() -> None:
        while not done.is_set():
            latencies.extend(await small_latencies(client, 1))

    loads = [asyncio.create_task(live()) for _ in range(LIVE_CLIENTS)]
    await asyncio.sleep(0.5)
    try:
        run, _ = await harvest(client, prompts, "all")
    finally:
        done.set()
        await asyncio.gather(*loads)
    return run, latencies


async def _measure(server: ServerProcess, secret: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {secret}"}
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=headers, timeout=600, trust_env=False
    ) as client:
        await plain_prefill(client, _prompts(0)[:16])  # warm up
        await small_latencies(client, 5)
        prompts = _prompts(1)
        plain = await plain_prefill(client, prompts)
        three, _ = await harvest(client, prompts, None)
        every, _ = await harvest(client, prompts, "all")
        idle, busy = await idle_and_busy(client)
        loaded, live = await under_live_load(client, prompts)
    return {
        "plain": plain,
        "runs": [three, every],
        "idle": idle,
        "busy": busy,
        "loaded": loaded,
        "live": live,
    }


def client_first() -> str:
    """This thread ahead of the node's (the module docstring); the policy it runs under. The
    node started before keeps its own, and a child of this process would not inherit it."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
    except OSError as error:
        return f"normal priority (SCHED_FIFO refused: {error.strerror})"
    return "SCHED_FIFO"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        node = tiny_node(Path(tmp))
        node.env["VLLM_ACS_HARVEST_PROMPTS_IN_FLIGHT"] = str(IN_FLIGHT)
        # vLLM's default binding, as `vllm-acs serve` runs it (the module docstring), over the
        # harness's `nobind`, which is for several nodes on one machine.
        node.env["VLLM_CPU_OMP_THREADS_BIND"] = "auto"
        try:
            node.start()
            secret = unlimited_key(node)
            policy = client_first()
            result = asyncio.run(_measure(node, secret))
        finally:
            node.stop()
    plain = result["plain"]
    print(f"{PROMPTS} prompts of {PROMPT_TOKENS} token ids, one node (tiny model), loopback.")
    print(
        f"client thread: {policy}; its longest wait for a CPU during one small completion "
        f"{max(client_waits_ms):.1f} ms"
    )
    print(f"plain 1-token completions, {IN_FLIGHT} in flight: {plain:,.0f} prompt tokens/s")
    print(f"{'layers':<12} {'node tok/s':>11} {'x plain':>8} {'client tok/s':>13} {'MB/s':>7}")
    for run in result["runs"]:
        print(
            f"{run.layers:<12} {run.node_tokens_per_s:11,.0f} {run.node_tokens_per_s / plain:8.2f} "
            f"{run.client_tokens_per_s:13,.0f} {run.bytes_per_s / 1e6:7.2f}"
        )
    idle, busy = statistics.median(result["idle"]), statistics.median(result["busy"])
    idle95, busy95 = p95(result["idle"]), p95(result["busy"])
    print(
        f"small completion p50: idle {idle:.1f} ms, during an all-layers harvest {busy:.1f} ms "
        f"({busy / idle:.2f}x; target <= 1.3x)"
    )
    print(
        f"small completion p95: idle {idle95:.1f} ms, during an all-layers harvest "
        f"{busy95:.1f} ms ({busy95 / idle:.2f}x idle p50, {busy95 / idle95:.2f}x idle p95; "
        "target <= 2x)"
    )
    alone, loaded = result["runs"][1], result["loaded"]
    print(
        f"all-layers harvest alone {alone.node_tokens_per_s:,.0f} tok/s "
        f"({alone.node_tokens_per_s / plain:.2f}x plain; target >= 0.9x), under a steady live "
        f"load ({LIVE_CLIENTS} client(s) back to back, {len(result['live'])} answered, p50 "
        f"{statistics.median(result['live']):.1f} ms) {loaded.node_tokens_per_s:,.0f} tok/s "
        f"({loaded.node_tokens_per_s / alone.node_tokens_per_s:.2f}x alone; target >= 0.25x)"
    )


if __name__ == "__main__":
    main()
