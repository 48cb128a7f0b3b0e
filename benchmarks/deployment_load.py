"""A bounded load on a deployment: nginx over two nodes against one node direct, forwarding, and
budget exactness under load.

In one run, loopback only: two `vllm-acs serve` nodes of the tiny model (`tiny-llama`) on a
private PostgreSQL database and Redis prefix (tests/e2e/shared_nodes.py, upgraded first), nginx
in front of both (tests/nginx.py: round-robin `upstream`, keepalive), and a third node of the
same weights under another model id (`tiny-other`), which only the forwarding phases use. One
key whose starts-per-minute and running slots are far above the load. Phases, each the same
fixed count of one-token completions (VLLM_ACS_BENCH_REQUESTS, default 200; max_tokens
VLLM_ACS_BENCH_MAX_TOKENS, default 1) at a fixed concurrency (VLLM_ACS_BENCH_IN_FLIGHT,
default 16), after a short warm-up of the same path:

- (a) `tiny-llama` direct to node 1;
- (b) `tiny-llama` through nginx, over nodes 1 and 2;
- (c) `tiny-other` sent to node 1, which forwards it to node 3 (the node serving it);
- (d) `tiny-other` direct to node 3: (c) - (d) is what forwarding adds on the same serving node.

Each phase: answers per second from the first send to the last answer, p50 and p99 latency of
the 200s (request sent to answer read), and the non-200 answers by status and error code.

Then budget exactness: a second key with a monthly budget of VLLM_ACS_BENCH_BUDGET tokens
(default 300), VLLM_ACS_BENCH_BUDGET_REQUESTS requests (default 64, max_tokens 8) sent at once
through nginx, so over both nodes. After every answer, the usage ledger is polled in PostgreSQL
until it holds a row per admitted request; "budget exact: spent X of K" is printed, and the run
exits non-zero when X > K (by the ledger or by the answers' usage).

Three nodes are started only when the machine has the memory for them (MemAvailable at least
3 x VLLM_ACS_BENCH_NODE_GIB, default 2.5, plus 4 GiB for everything else; VLLM_ACS_BENCH_NODES=2
or 3 forces it). With two, the run has two deployments one after the other: two `tiny-llama`
nodes for (a), (b) and the budget, then one `tiny-llama` and one `tiny-other` node for (a') (=
(a) again on that deployment), (c) and (d); the table says which.

The latency the plugin itself adds over plain vLLM is serve_overhead.py's measure (one request
at a time); here (b) - (a) is what nginx and a second node add under load.

Run: `python -m benchmarks.deployment_load` (about four minutes on two cores, most of it
starting the nodes). Every node and nginx is stopped however the run ends (SIGTERM included).

Measured here (2026-12-01; two cores, 23 GiB, so three nodes; other test runs on the machine at
the same time; about 3.5 minutes in all, 102 s of it starting the three nodes):

    phase                                     200s   req/s   p50 ms   p99 ms  non-200
    (a) direct, node 1                         200    75.5    174.2    567.1  -
    (b) nginx over nodes 1+2                   200    45.0    262.4   1008.9  -
    (c) forwarded, node 1 -> node 3            200    45.6    290.2   1065.4  -
    (d) direct, node 3 (tiny-other)            200    71.7    181.4    659.7  -
    (b)/(a) req/s: 0.596; (b) answered by node 1 / node 2: 109 / 109
    (b)-(a) p50: +88.3 ms, p99: +441.8 ms
    (c)-(a) p50 added by forwarding: +116.0 ms (p99 +498.3 ms); (c)-(d), same serving node:
      +108.7 ms (p99 +405.6 ms); (c)/(d) req/s: 0.636
    budget: 64 at once through nginx, max_tokens 8, key budget 300: 200: 25,
      429 budget_exceeded: 39; tokens by the answers 300, by the ledger 300 (64 rows), settled
      counter 300; settled by node 1 / node 2: 132 / 168
    budget exact: spent 300 of 300

No 429 (nor any other non-200) in the load phases. On two cores a second node adds no CPU: (b)
is two engines, nginx and the client sharing the cores one engine had in (a), so (b)/(a) < 1
here says what the extra hop and contention cost, not what a second GPU box would give.
Forwarding (c) puts two API servers on every request (the forwarder's and the serving node's),
which on these cores costs about 110 ms at the p50 under 16 in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks._deployment import deployment, node_count, stop_on_sigterm
from tests.harness import MODEL_ID, ServerProcess
from tests.nginx import running_nginx

REQUESTS = int(os.environ.get("VLLM_ACS_BENCH_REQUESTS", "200"))
IN_FLIGHT = int(os.environ.get("VLLM_ACS_BENCH_IN_FLIGHT", "16"))
MAX_TOKENS = int(os.environ.get("VLLM_ACS_BENCH_MAX_TOKENS", "1"))
BUDGET = int(os.environ.get("VLLM_ACS_BENCH_BUDGET", "300"))
BUDGET_REQUESTS = int(os.environ.get("VLLM_ACS_BENCH_BUDGET_REQUESTS", "64"))
BUDGET_MAX_TOKENS = 8
WARMUP = 16
NODE_ENV = {"VLLM_ACS_GPU_SHAPE": "cpu-test"}
OTHER_ID = "tiny-other"
OTHER_NODE = ({"VLLM_ACS_MODEL_ID": OTHER_ID}, ["--served-model-name", f"vllm-acs/{OTHER_ID}"])
LLAMA_NODE: tuple[dict[str, str], list[str]] = ({}, [])
# Bounds: a phase (or the wait for the ledger, or for the registry) that takes longer than this
# means something is stuck; the run stops with an error (and stops every process).
PHASE_TIMEOUT_S = 180.0
LEDGER_TIMEOUT_S = 30.0
REGISTRY_TIMEOUT_S = 30.0
NGINX_READ_TIMEOUT_S = 120.0


@dataclass
class Phase:
    name: str
    sent: int
    wall_s: float
    latencies_ms: list[float]  # of the 200s
    refused: Counter = field(default_factory=Counter)  # "status code" -> count

    @property
    def ok(self) -> int:
        return len(self.latencies_ms)

    @property
    def per_s(self) -> float:
        """200s per second, first send to last answer."""
        return self.ok / self.wall_s

    def p(self, q: int) -> float:
        samples = self.latencies_ms
        if len(samples) < 2:
            return samples[0] if samples else float("nan")
        if q == 50:
            return statistics.median(samples)
        return statistics.quantiles(samples, n=100)[q - 1]


@dataclass
class BudgetResult:
    answered: Counter
    answers_spent: int  # the 200s' usage.total_tokens
    ledger_spent: int  # the usage rows' tokens
    ledger_rows: int
    settled: int  # the key's monthly budget counter in PostgreSQL
    tokens_per_node: list[float]

    @property
    def spent(self) -> int:
        return max(self.answers_spent, self.ledger_spent, self.settled)


def _outcome(response: httpx.Response) -> str:
    """`429 budget_exceeded`; `502 -` for an answer without the error envelope (nginx's)."""
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = "-"
    return f"{response.status_code} {code}"


def _client(base_url: str, secret: str, connections: int) -> httpx.AsyncClient:
    # trust_env=False: a proxy from the environment must not sit between the client and loopback.
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {secret}"},
        timeout=120,
        trust_env=False,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def _load(name: str, base_url: str, secret: str, model: str, count: int) -> Phase:
    """`count` completions of `model`, IN_FLIGHT at a time, on IN_FLIGHT kept-alive connections."""
    latencies: list[float] = []
    refused: Counter = Counter()
    async with _client(base_url, secret, IN_FLIGHT) as client:
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def one(i: int) -> None:
            body = {
                "model": model,
                "prompt": f"Request {i}: the sky is",
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
            }
            async with gate:
                sent = time.perf_counter()
                try:
                    response = await client.post("/v1/completions", json=body)
                except httpx.HTTPError as error:
                    refused[f"error {type(error).__name__}"] += 1
                    return
                elapsed = (time.perf_counter() - sent) * 1000
            if response.status_code == 200:
                latencies.append(elapsed)
            else:
                refused[_outcome(response)] += 1

        started = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(one(i) for i in range(count))), timeout=PHASE_TIMEOUT_S
        )
        wall = time.perf_counter() - started
    return Phase(name, count, wall, latencies, refused)


def run_phase(name: str, base_url: str, secret: str, model: str) -> Phase:
    """A warm-up of the same path, then the measured `REQUESTS`."""
    asyncio.run(_load(name, base_url, secret, model, WARMUP))
    phase = asyncio.run(_load(name, base_url, secret, model, REQUESTS))
    print(f"  {name}: {phase.per_s:.1f} req/s", flush=True)
    return phase


def _wait(condition: Any, what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(0.2)
    return value


def _wait_listed(node: ServerProcess, secret: str, model: str) -> None:
    """Until `node`'s /v1/models lists `model` (the other node's heartbeat reached the registry)."""

    def listed() -> bool:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            response = httpx.get(
                f"{node.base_url}/v1/models",
                headers={"Authorization": f"Bearer {secret}"},
                timeout=10,
                trust_env=False,
            )
            return model in {m["id"] for m in response.json()["data"]}
        return False

    _wait(listed, f"{model} listed on {node.base_url}", REGISTRY_TIMEOUT_S)


def _query(database_url: str, sql: str, *args: Any) -> list[Any]:
    import asyncpg

    async def run() -> list[Any]:
        conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


async def _burst(url: str, secret: str, count: int) -> list[httpx.Response | Exception]:
    body = {"model": MODEL_ID, "prompt": "The sky is", "max_tokens": BUDGET_MAX_TOKENS}
    async with _client(url, secret, count) as client:
        return await asyncio.wait_for(
            asyncio.gather(
                *(client.post("/v1/completions", json=body) for _ in range(count)),
                return_exceptions=True,
            ),
            timeout=PHASE_TIMEOUT_S,
        )


def run_budget(nodes: list[ServerProcess], proxy_url: str, database_url: str) -> BudgetResult:
    """BUDGET_REQUESTS at once through nginx against a key whose monthly budget is BUDGET."""
    key = nodes[0].create_key_record(
        "bench-budget",
        *("--monthly-tokens", str(BUDGET), "--starts-per-minute", "1000000"),
        *("--max-running", str(BUDGET_REQUESTS), "--max-waiting", str(BUDGET_REQUESTS)),
    )
    before = [node.metric("acs_tokens_settled_total") for node in nodes]
    answers = asyncio.run(_burst(proxy_url, key["key"], BUDGET_REQUESTS))
    answered: Counter = Counter()
    answers_spent = 0
    for answer in answers:
        if isinstance(answer, Exception):
            answered[f"error {type(answer).__name__}"] += 1
        elif answer.status_code == 200:
            answered["200"] += 1
            answers_spent += answer.json()["usage"]["total_tokens"]
        else:
            answered[_outcome(answer)] += 1

    # The ledger is written by each node's writer task a moment after its answers: wait for a
    # row per admitted request (a refusal may write a row too; it carries no tokens).
    def ledger() -> tuple[list[Any]] | None:
        rows = _query(
            database_url,
            "SELECT status, count(*) AS n, coalesce(sum(prompt_tokens + completion_tokens), 0)"
            " AS tokens FROM usage_rows WHERE key_id = $1 GROUP BY status",
            key["id"],
        )
        ok = sum(row["n"] for row in rows if row["status"] == 200)
        return (rows,) if ok >= answered["200"] else None

    (rows,) = _wait(ledger, "the usage rows of the admitted requests", LEDGER_TIMEOUT_S)
    settled = _query(
        database_url,
        "SELECT coalesce(sum(used), 0) AS used FROM budget_counters WHERE counter LIKE $1",
        f"key:{key['id']}:month:%",
    )[0]["used"]
    after = [node.metric("acs_tokens_settled_total") for node in nodes]
    return BudgetResult(
        answered=answered,
        answers_spent=answers_spent,
        ledger_spent=sum(int(row["tokens"]) for row in rows),
        ledger_rows=sum(int(row["n"]) for row in rows),
        settled=int(settled),
        tokens_per_node=[b - a for a, b in zip(before, after, strict=True)],
    )


def _throughput_key(node: ServerProcess) -> str:
    """Starts per minute and running slots far above the load: nothing is refused by design."""
    slots = str(4 * IN_FLIGHT)
    return node.create_key(
        "bench",
        *("--starts-per-minute", "1000000", "--max-running", slots, "--max-waiting", slots),
    )


def _requests_answered(node: ServerProcess) -> float:
    return node.metric("acs_requests_total")


@dataclass
class Run:
    nodes: int
    phases: dict[str, Phase]
    # Requests nodes 1 and 2 each answered during (b), its warm-up included (/metrics's counter).
    spread: list[float]
    budget: BudgetResult


def _balanced(
    nodes: list[ServerProcess], proxy_url: str, secret: str, phases: dict[str, Phase]
) -> list[float]:
    """(a) and (b); returns how many requests each of the two nodes answered during (b), its
    warm-up included."""
    phases["a"] = run_phase("(a) direct, node 1", nodes[0].base_url, secret, MODEL_ID)
    before = [_requests_answered(n) for n in nodes[:2]]
    phases["b"] = run_phase("(b) nginx over nodes 1+2", proxy_url, secret, MODEL_ID)
    return [_requests_answered(n) - b for n, b in zip(nodes[:2], before, strict=True)]


def _forwarded(
    llama: ServerProcess, other: ServerProcess, secret: str, phases: dict[str, Phase], tag: str
) -> None:
    """(c) and (d): `tiny-other` through `llama` (forwarded) and direct to `other`."""
    _wait_listed(llama, secret, OTHER_ID)
    phases["c"] = run_phase(f"(c) forwarded, node 1 -> {tag}", llama.base_url, secret, OTHER_ID)
    phases["d"] = run_phase(f"(d) direct, {tag} ({OTHER_ID})", other.base_url, secret, OTHER_ID)


def measure() -> Run:
    from vllm_acs.tiny_model import write_tiny_model

    count = node_count()
    phases: dict[str, Phase] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = write_tiny_model(root / "tiny-llama")
        if count == 3:
            per_node = [LLAMA_NODE, LLAMA_NODE, OTHER_NODE]
            with deployment(model_dir, root / "home", NODE_ENV, per_node) as (nodes, database_url):
                urls = [n.base_url for n in nodes[:2]]
                with running_nginx(urls, root / "nginx", NGINX_READ_TIMEOUT_S) as proxy:
                    secret = _throughput_key(nodes[0])
                    spread = _balanced(nodes, proxy.base_url, secret, phases)
                    _forwarded(nodes[0], nodes[2], secret, phases, "node 3")
                    budget = run_budget(nodes[:2], proxy.base_url, database_url)
            return Run(3, phases, spread, budget)
        # Two nodes at a time: the balanced deployment, then one node of each model.
        per_node = [LLAMA_NODE, LLAMA_NODE]
        with deployment(model_dir, root / "home", NODE_ENV, per_node) as (nodes, database_url):
            urls = [n.base_url for n in nodes]
            with running_nginx(urls, root / "nginx", NGINX_READ_TIMEOUT_S) as proxy:
                secret = _throughput_key(nodes[0])
                spread = _balanced(nodes, proxy.base_url, secret, phases)
                budget = run_budget(nodes, proxy.base_url, database_url)
        per_node = [LLAMA_NODE, OTHER_NODE]
        with deployment(model_dir, root / "home-forwarding", NODE_ENV, per_node) as (nodes, _):
            secret = _throughput_key(nodes[0])
            phases["a2"] = run_phase(
                "(a') direct, node 1 (2nd deployment)", nodes[0].base_url, secret, MODEL_ID
            )
            _forwarded(nodes[0], nodes[1], secret, phases, "node 2")
        return Run(2, phases, spread, budget)


def _refused(phase: Phase) -> str:
    return ", ".join(f"{k}: {n}" for k, n in sorted(phase.refused.items())) or "-"


def report(run: Run) -> bool:
    """Prints the table; True when the budget held (spent <= BUDGET)."""
    phases = run.phases
    print(
        f"{REQUESTS} completions per phase (max_tokens {MAX_TOKENS}, temperature 0), {IN_FLIGHT} "
        f"in flight, after {WARMUP} warm-up; tiny model, loopback, {os.cpu_count()} cores; "
        f"{run.nodes} nodes at a time on PostgreSQL + Redis."
    )
    print(f"{'phase':<40} {'200s':>5} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8}  non-200")
    for phase in phases.values():
        print(
            f"{phase.name:<40} {phase.ok:>5} {phase.per_s:7.1f} {phase.p(50):8.1f} "
            f"{phase.p(99):8.1f}  {_refused(phase)}"
        )
    a, b, c, d = phases["a"], phases["b"], phases["c"], phases["d"]
    base = phases.get("a2", a)
    base_name = "(a')" if "a2" in phases else "(a)"
    spread = " / ".join(f"{n:.0f}" for n in run.spread)
    print(f"(b)/(a) req/s: {b.per_s / a.per_s:.3f}; (b) answered by node 1 / node 2: {spread}")
    print(f"(b)-(a) p50: {b.p(50) - a.p(50):+.1f} ms, p99: {b.p(99) - a.p(99):+.1f} ms")
    print(
        f"(c)-{base_name} p50 added by forwarding: {c.p(50) - base.p(50):+.1f} ms "
        f"(p99 {c.p(99) - base.p(99):+.1f} ms); (c)-(d), same serving node: "
        f"{c.p(50) - d.p(50):+.1f} ms (p99 {c.p(99) - d.p(99):+.1f} ms); (c)/(d) req/s: "
        f"{c.per_s / d.per_s:.3f}"
    )
    budget = run.budget
    answered = ", ".join(f"{k}: {n}" for k, n in sorted(budget.answered.items()))
    per_node = " / ".join(f"{n:.0f}" for n in budget.tokens_per_node)
    print(
        f"budget: {BUDGET_REQUESTS} at once through nginx, max_tokens {BUDGET_MAX_TOKENS}, key "
        f"budget {BUDGET}: {answered}; tokens by the answers {budget.answers_spent}, by the "
        f"ledger {budget.ledger_spent} ({budget.ledger_rows} rows), settled counter "
        f"{budget.settled}; settled by node 1 / node 2: {per_node}"
    )
    exact = budget.spent <= BUDGET
    print(f"budget exact: spent {budget.spent} of {BUDGET}" + ("" if exact else " -- OVERSPENT"))
    return exact


def main() -> None:
    stop_on_sigterm()
    if not report(measure()):
        raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(main())
