"""A 2,000-prompt harvest keeps the API server's resident memory flat: shards are written as they
fill, so memory does not grow with the corpus. The figures are printed (`pytest -s`)."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest

from tests.harness import MODEL_ID

pytestmark = pytest.mark.e2e

N_PROMPTS = 2000
# Growth allowed from the early part of the run to its peak: a few shards' worth of buffers and
# the allocator's slack, far below what keeping the corpus's activations would take (~160 MB).
ALLOWED_GROWTH_MB = 80


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_a_2000_prompt_harvest_keeps_the_api_servers_memory_flat(acs_server):
    key = acs_server.create_key("harvest-memory")
    client = httpx.Client(
        base_url=acs_server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(3, 1000, size=80)] for _ in range(N_PROMPTS)]
    body = {"model": MODEL_ID, "prompts": prompts, "layers": "all", "shard_size": 32}
    pid = acs_server.process.pid
    samples: list[tuple[int, float]] = []  # (shards done, RSS MB)
    progress = {"shards": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((progress["shards"], _rss_mb(pid)))
            time.sleep(0.1)

    before = _rss_mb(pid)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        submitted = client.post("/v1/harvest", json=body)
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job_id"]
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            job = client.get(f"/v1/harvest/{job_id}").json()
            progress["shards"] = job["progress"]["shards_done"]
            if job["status"] not in ("pending", "running"):
                break
            time.sleep(0.2)
    finally:
        done.set()
        sampler.join()
    assert job["status"] == "done", job
    n_shards = job["result"]["n_shards"]
    assert n_shards == -(-N_PROMPTS // 32)
    # The early window: the first tenth of the shards, or the first progress the poll saw when a
    # fast engine wrote more than a tenth between two polls (still within the first third).
    seen = [shards for shards, _ in samples if shards > 0]
    first_seen = min(seen, default=n_shards)
    assert first_seen <= n_shards // 3, f"the first progress sampled was {first_seen} shards"
    early_end = max(n_shards // 10, first_seen)
    early = [rss for shards, rss in samples if 0 < shards <= early_end]
    baseline, peak = max(early), max(rss for _, rss in samples)
    written_mb = sum(
        s["bytes"] for s in httpx.get(job["result"]["manifest_url"]).json()["shards"]
    ) / (1024 * 1024)
    print(
        f"\nharvest of {N_PROMPTS} prompts, {written_mb:.0f} MB of shards: API server RSS "
        f"{before:.0f} MB before, {baseline:.0f} MB early in the run, peak {peak:.0f} MB"
    )
    assert peak - baseline < ALLOWED_GROWTH_MB, (before, baseline, peak)
