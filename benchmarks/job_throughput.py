"""Throughput of completion jobs against the same completions sent live, on one node.

In one run: a real `vllm-acs serve` node of the tiny model (as tests/harness.py starts it) on
loopback, one key (starts per minute far above the rate, default running slots). Each round sends
the same N one-token completions (VLLM_ACS_BENCH_JOBS, default 200) two ways:

- live: `POST /v1/completions`, 16 in flight at a time; completed per second from the first send
  to the last answer;
- jobs, long-poll (the way a client waits for many jobs): all N submitted at once to
  `POST /v1/completion-jobs` (distinct Idempotency-Keys, over SUBMIT_CONNECTIONS connections),
  and each job's result read with one `GET /v1/completion-jobs/{id}/result?wait=60` as soon as
  its 202 is back; completed per second from the first submit to the last result, and the p50
  from a job's submit to its result (client-side clocks);
- jobs, polled: the same submits, then `GET /v1/completion-jobs/{id}` by a few pollers (each job
  at most every 100 ms, in the order the 202s came back, a global cap on GETs per second) until
  every job ended; the same two figures.
A job that ends in any status but `succeeded` is an error. Each side also reports the CPU time
the node's API process spent per completion (`api ms`): on two cores with a one-token completion
that process is the bound, and a job (its submit and its read are two HTTP requests, its replay a
third pass through the pipeline, four write transactions) costs it several times a live request,
which caps the ratio near live's CPU per request over a job's.

Rounds rotate the order of the three, VLLM_ACS_BENCH_ROUNDS of them (default 2);
VLLM_ACS_BENCH_MAX_TOKENS sets the tokens of each completion (default 1). Run:
`python -m benchmarks.job_throughput` (a few minutes on two cores, most of it starting the
server).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from benchmarks._node import tiny_node, unlimited_key
from tests.harness import MODEL_ID, ServerProcess

JOBS = int(os.environ.get("VLLM_ACS_BENCH_JOBS", "200"))
# Tokens per completion: 1 (the figure) puts the API's own work per item at its largest
# against the engine's; more shows the ratio where the engine does most of the work.
MAX_TOKENS = int(os.environ.get("VLLM_ACS_BENCH_MAX_TOKENS", "1"))
ROUNDS = int(os.environ.get("VLLM_ACS_BENCH_ROUNDS", "2"))
LIVE_IN_FLIGHT = 16
WARMUP = 16
JOBS_PATH = "/v1/completion-jobs"
# Polling: a bounded set of pollers, each job at most every POLL_INTERVAL_S, and at most
# POLL_RATE GETs per second in all, so the polling itself stays a small part of the server's work
# (200 jobs polled every 100 ms each would be 2000 GETs/s, far more than the completions).
POLLERS = 4
POLL_INTERVAL_S = 0.1
POLL_RATE = float(os.environ.get("VLLM_ACS_BENCH_POLL_RATE", "200"))
# The submits all start at once but share this many connections: one httpx client holding 200
# connections read the 202s late (measured: the node had written every 202 ~2 s before the client
# got the last ones), which timed the client, not the node; 32 keeps that lag to milliseconds.
SUBMIT_CONNECTIONS = 32
# A job still unfinished after this long means the node is stuck: stop with an error.
JOBS_TIMEOUT_S = 600.0
ENDED = frozenset({"succeeded", "failed", "cancelled", "expired"})


def _body(i: int) -> dict[str, object]:
    return {"model": MODEL_ID, "prompt": f"Job {i}: the sky is", "max_tokens": MAX_TOKENS}


@dataclass
class _Answer:
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


class _Client:
    """The few calls the benchmark makes, on aiohttp. Not httpx: its connection pool spent about
    20 ms of CPU per job here with 200 connections in use (4x its cost per request on the live
    side), CPU that the node on the same two cores then lacked, so the figure measured the
    client. Every side uses this one client."""

    def __init__(self, server: ServerProcess, secret: str, connections: int, reuse: bool) -> None:
        # trust_env=False: a proxy from the environment must not sit between client and loopback.
        self._session = aiohttp.ClientSession(
            base_url=server.base_url,
            headers={"Authorization": f"Bearer {secret}"},
            connector=aiohttp.TCPConnector(limit=connections, force_close=not reuse),
            timeout=aiohttp.ClientTimeout(total=120),
            trust_env=False,
        )

    async def __aenter__(self) -> _Client:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self._session.close()

    async def post(self, path: str, json: Any, headers: dict[str, str] | None = None) -> _Answer:
        async with self._session.post(path, json=json, headers=headers) as response:
            return _Answer(response.status, await response.read())

    async def get(self, path: str, params: dict[str, Any] | None = None) -> _Answer:
        async with self._session.get(path, params=params) as response:
            return _Answer(response.status, await response.read())


def _client(server: ServerProcess, secret: str, connections: int, reuse: bool = True) -> _Client:
    """`reuse=False` for long-polls: a connection idle past the server's keep-alive (5 s) can
    be closed by it just as it is reused, so each waiting read takes a fresh one."""
    return _Client(server, secret, connections, reuse)


@dataclass
class JobsResult:
    per_s: float
    p50_ms: float
    polls: int
    api_ms: float = 0.0


class _ApiCpu:
    """CPU time (user + system, all its threads) of the node's API process over a block."""

    def __init__(self, server: ServerProcess) -> None:
        assert server.process is not None
        self._process = psutil.Process(server.process.pid)
        self.seconds = 0.0

    def __enter__(self) -> _ApiCpu:
        self._start = self._now()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.seconds = self._now() - self._start

    def _now(self) -> float:
        times = self._process.cpu_times()
        return times.user + times.system

    def ms_per(self, count: int) -> float:
        return self.seconds * 1000 / count


@dataclass
class _Pending:
    """One submitted job as the client sees it."""

    id: str
    # perf_counter when its submit started (all at once; it may then wait for a connection).
    submitted: float
    next_poll: float = 0.0
    polling: bool = False
    status: str = "queued"
    seen_ended: float | None = None
    detail: dict[str, object] = field(default_factory=dict)


async def _complete(client: _Client, i: int) -> None:
    response = await client.post("/v1/completions", json=_body(i))
    if response.status_code != 200:
        raise RuntimeError(f"/v1/completions answered {response.status_code}: {response.text}")


async def run_live(server: ServerProcess, secret: str, count: int = JOBS) -> float:
    """Completions per second, LIVE_IN_FLIGHT at a time, first send to last answer."""
    async with _client(server, secret, LIVE_IN_FLIGHT) as client:
        gate = asyncio.Semaphore(LIVE_IN_FLIGHT)

        async def one(i: int) -> None:
            async with gate:
                await _complete(client, i)

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        return count / (time.perf_counter() - started)


async def _submit(client: _Client, i: int, tag: str, pending: list[_Pending]) -> None:
    headers = {"Idempotency-Key": f"bench-{tag}-{i}"}
    sent = time.perf_counter()
    response = await client.post(JOBS_PATH, json=_body(i), headers=headers)
    if response.status_code != 202:
        raise RuntimeError(f"submit {i} answered {response.status_code}: {response.text}")
    job = _Pending(id=response.json()["id"], submitted=sent)
    job.next_poll = time.perf_counter()
    pending.append(job)


async def run_jobs_long_poll(
    server: ServerProcess, secret: str, tag: str, count: int = JOBS
) -> JobsResult:
    """All `count` submitted at once; each result fetched with one long-poll once its 202 is
    back (a connection per waiting read: HTTP/1.1 holds one request per connection)."""
    seen: list[float] = []
    latencies: list[float] = []

    async def one(submit_client: _Client, wait_client: _Client, i: int):
        pending: list[_Pending] = []
        await _submit(submit_client, i, tag, pending)
        job = pending[0]
        response = await wait_client.get(f"{JOBS_PATH}/{job.id}/result", params={"wait": 60})
        if response.status_code != 200:
            raise RuntimeError(f"job {job.id}: result {response.status_code}: {response.text}")
        end = time.perf_counter()
        seen.append(end)
        latencies.append((end - job.submitted) * 1000)

    async with (
        _client(server, secret, min(count, SUBMIT_CONNECTIONS)) as submit_client,
        _client(server, secret, count, reuse=False) as wait_client,
    ):
        started = time.perf_counter()
        await asyncio.gather(*(one(submit_client, wait_client, i) for i in range(count)))
    return JobsResult(count / (max(seen) - started), statistics.median(latencies), count)


async def run_jobs(server: ServerProcess, secret: str, tag: str, count: int = JOBS) -> JobsResult:
    """All `count` submitted at once, then polled until every one ended; all must succeed."""
    pending: list[_Pending] = []  # in the order the submits were answered
    submitting = True
    polls = 0
    # One shared "next GET not before" time: the global POLL_RATE cap across the pollers.
    next_slot = time.perf_counter()

    async def poller(client: _Client, deadline: float) -> None:
        nonlocal polls, next_slot
        while True:
            now = time.perf_counter()
            if now > deadline:
                raise RuntimeError(f"jobs not ended after {JOBS_TIMEOUT_S}s")
            open_jobs = [job for job in pending if job.seen_ended is None]
            if not open_jobs and not submitting:
                return
            # In the order the 202s came back: the runner claims in the order the node accepted
            # the submits, which that order follows closely (the order the submits were started
            # in does not: they race through the node, so polling by it lagged ends by ~0.7 s).
            due = next((j for j in open_jobs if not j.polling and j.next_poll <= now), None)
            if due is None:
                await asyncio.sleep(0.005)
                continue
            due.polling = True
            slot = max(next_slot, now)
            next_slot = slot + 1 / POLL_RATE
            if slot > now:
                await asyncio.sleep(slot - now)
            response = await client.get(f"{JOBS_PATH}/{due.id}")
            seen = time.perf_counter()
            polls += 1
            due.polling = False
            due.next_poll = seen + POLL_INTERVAL_S
            if response.status_code != 200:
                raise RuntimeError(f"GET job {due.id} answered {response.status_code}")
            due.detail = response.json()
            due.status = str(due.detail["status"])
            if due.status in ENDED:
                due.seen_ended = seen

    async with (
        _client(server, secret, min(count, SUBMIT_CONNECTIONS)) as submit_client,
        _client(server, secret, POLLERS) as poll_client,
    ):
        started = time.perf_counter()
        # Polling starts with the first answered submit, as a client polling each job it got.
        pollers = [
            asyncio.create_task(poller(poll_client, started + JOBS_TIMEOUT_S))
            for _ in range(POLLERS)
        ]
        try:
            await asyncio.gather(*(_submit(submit_client, i, tag, pending) for i in range(count)))
            submitting = False
            await asyncio.gather(*pollers)
        finally:
            for task in pollers:
                task.cancel()
    bad = [job for job in pending if job.status != "succeeded"]
    if bad:
        raise RuntimeError(f"{len(bad)} of {count} jobs did not succeed, e.g. {bad[0].detail}")
    ends = [job.seen_ended for job in pending if job.seen_ended is not None]
    wall = max(ends) - started
    latencies = [(end - job.submitted) * 1000 for job in pending if (end := job.seen_ended)]
    return JobsResult(count / wall, statistics.median(latencies), polls)


@dataclass
class Round:
    order: str
    live_per_s: float
    live_api_ms: float
    long_poll: JobsResult
    polled: JobsResult

    @property
    def ratio(self) -> float:
        return self.long_poll.per_s / self.live_per_s

    @property
    def polled_ratio(self) -> float:
        return self.polled.per_s / self.live_per_s


async def _rounds(server: ServerProcess, secret: str) -> list[Round]:
    # Warm both paths (tokenizer, engine, SQLite pages) so round 1 does not pay first-use costs.
    await run_live(server, secret, WARMUP)
    await run_jobs(server, secret, "warmup", count=WARMUP)
    await run_jobs_long_poll(server, secret, "warmup-wait", count=WARMUP)
    rounds = []
    for r in range(ROUNDS):
        tag = f"{r}-{uuid.uuid4().hex[:8]}"
        sides = {
            "live": lambda: run_live(server, secret),
            "wait": lambda tag=tag: run_jobs_long_poll(server, secret, f"{tag}-wait"),
            "poll": lambda tag=tag: run_jobs(server, secret, f"{tag}-poll"),
        }
        # Rotating the order, so no side always runs after the same other side's load.
        order = list(sides)[r % 3 :] + list(sides)[: r % 3]
        got: dict[str, Any] = {}
        api_ms: dict[str, float] = {}
        for name in order:
            with _ApiCpu(server) as cpu:
                got[name] = await sides[name]()
            api_ms[name] = cpu.ms_per(JOBS)
        got["wait"].api_ms, got["poll"].api_ms = api_ms["wait"], api_ms["poll"]
        rounds.append(
            Round(", ".join(order), got["live"], api_ms["live"], got["wait"], got["poll"])
        )
    return rounds


def measure() -> list[Round]:
    with tempfile.TemporaryDirectory() as tmp:
        node = tiny_node(Path(tmp))
        try:
            node.start()
            secret = unlimited_key(node)
            return asyncio.run(_rounds(node, secret))
        finally:
            node.stop()


def main() -> None:
    rounds = measure()
    print(
        f"{JOBS} completions of {MAX_TOKENS} token(s) per side and round, one node (tiny model), "
        "loopback."
    )
    print(
        f"live: {LIVE_IN_FLIGHT} in flight; jobs: all submitted at once over {SUBMIT_CONNECTIONS} "
        "connections, then each result read with one ?wait=60 long-poll (wait), or polled by "
        f"{POLLERS} pollers (each job every >= {POLL_INTERVAL_S * 1000:.0f} ms, <= "
        f"{POLL_RATE:.0f} GET/s) (poll)."
    )
    print(
        f"{'round':<6} {'order':<16} {'live req/s':>10} {'wait jobs/s':>11} {'wait/live':>9} "
        f"{'wait p50 ms':>11} {'poll jobs/s':>11} {'poll/live':>9} {'poll p50 ms':>11} {'GETs':>6}"
    )
    for i, r in enumerate(rounds, 1):
        print(
            f"{i:<6} {r.order:<16} {r.live_per_s:10.2f} {r.long_poll.per_s:11.2f} "
            f"{r.ratio:9.3f} {r.long_poll.p50_ms:11.1f} {r.polled.per_s:11.2f} "
            f"{r.polled_ratio:9.3f} {r.polled.p50_ms:11.1f} {r.polled.polls:6d}"
        )
    print("CPU time of the node's API process per completion (ms):")
    print(f"{'round':<6} {'live':>8} {'wait':>8} {'poll':>8} {'live/wait':>9}")
    for i, r in enumerate(rounds, 1):
        print(
            f"{i:<6} {r.live_api_ms:8.2f} {r.long_poll.api_ms:8.2f} {r.polled.api_ms:8.2f} "
            f"{r.live_api_ms / r.long_poll.api_ms:9.3f}"
        )
    ratio = statistics.median(r.ratio for r in rounds)
    polled = statistics.median(r.polled_ratio for r in rounds)
    print(f"median ratio jobs/live: {ratio:.3f} long-poll, {polled:.3f} polled (target >= 0.9)")


if __name__ == "__main__":
    main()
