"""One harvest over the nodes of its model (issue 33): the same harvest on a deployment of two
nodes behind nginx and on one node, its parts per node, its speed, and whether the two results
are the same files.

In one run, loopback only: two `vllm-acs serve` nodes of the tiny model (`tiny-llama`) and a
third of the same weights under another model id (`tiny-other`), on a private PostgreSQL
database and Redis prefix (tests/e2e/shared_nodes.py, upgraded first), all three with one files
directory (`VLLM_ACS_FILES_DIR`: nodes on one machine may share it) and one
`VLLM_ACS_URL_SECRET`; nginx round-robin over the two `tiny-llama` nodes (tests/nginx.py). One
key whose starts per minute and running slots are far above the run's (a shard holds a running
slot while it is written). After a warm-up (a few 128-token completions on each node, then a
small harvest of each model), the same harvest, one after the other, never at once:

- (a) `tiny-llama` submitted and polled through nginx: its parts on nodes 1 and 2;
- (b) `tiny-other` submitted to and polled on node 3, the one node of its model;

(a) then (b), VLLM_ACS_BENCH_HARVEST_ROUNDS times (default 3): other runs on the machine move a
single pair's figures by several times, so each round is shown and the ratio is of the medians.

The harvest: N prompts (VLLM_ACS_BENCH_HARVEST_PROMPTS, default 192) of 128 random token ids
(fixed seed), shard_size 8, every layer of the model (all 4 of the tiny model's: the heaviest
capture). The nodes keep their defaults otherwise: parts of `harvest_part_shards` (4) shards, at
most `harvest_parts_per_node` (1 now; 2 when the figures below were measured) parts at once on a
node, `harvest_prompts_in_flight` (8)
prompts in a node's engine at once whatever the part; so 192 prompts make 24 shards in 6 parts.

Each harvest: its wall time and prompt tokens/s as the harvest times itself (`result.timings`:
`wall_s` from its job starting to its merge written, `tokens`) and from the client (submit to
reading `done`, polling every POLL_S); how many parts each node ran (`SELECT owner, count(*)
FROM jobs WHERE parent_id = $1 GROUP BY owner`, owners mapped to nodes by process group as
tests/e2e/shared_nodes.py `Cluster.owner_node` does), which node ran the harvest's own job (the
one that cut it and merged it), the most parts running and nodes seen in its progress, the
usage rows it wrote (one per shard: charged once) and the machine's 1-minute load average before
it; then the speed ratio (a)/(b).

Correctness: the first round's two harvests downloaded (`vllm_acs.client.download_harvest`,
from a node's signed /downloads URLs) and compared: the same shard names (those of a one-node
harvest), the same prompts per shard, the manifest's fields equal but `job_id`, `model`,
`checkpoint` and `tokenizer`, every prompt's tokens exactly the submitted ids, every row within
a bf16 step (tests/reference.py `assert_rows_close`; vLLM's kernels are not batch-invariant,
and which prompts share a step differs between the runs), each `stats.safetensors` equal to the
statistics of its own rows taken in order within float rounding (rtol 1e-5, atol 1e-6: the
parts' were merged with Chan's formula, not added row by row), and (a)'s against (b)'s: the
counts exact, the rest within float rounding when every row is bit-identical, else within the
rows' bf16 rounding (rtol 1e-2, atol 1e-3). Every round's usage rows: one per shard, the
harvest's tokens in all (charged once). A PASS or FAIL line each; the run exits non-zero on any
FAIL.

Three nodes are started only when the machine has the memory for them (MemAvailable at least
3 x VLLM_ACS_BENCH_NODE_GIB, default 2.5, plus 4 GiB; VLLM_ACS_BENCH_NODES=2 or 3 forces it).
With two, (a) runs on a deployment of the two `tiny-llama` nodes and nginx, then (b) on a
deployment of the `tiny-other` node alone, with the same files directory and secret; the table
says which.

Run: `python -m benchmarks.harvest_deployment` (about three minutes on two cores, one to one
and a half of it starting the nodes). Every node and nginx is stopped however the run ends
(SIGTERM included).

Expected scaling, on paper. Let r be one node's harvest rate in prompt tokens/s (its engine
kept full by its gate of prompts in flight, with one part or two), S a part's tokens
(part_shards x shard_size x prompt tokens: 4 x 8 x 128 = 4,096 here), P the parts (6 here) and
T = P x S the harvest's tokens (24,576). One node: t1 = T/r + m + c, where m is the merge (it
reads each part's statistics state, 16 x layers x hidden bytes, and writes stats.safetensors and
manifest.json: milliseconds for the tiny model, about 2 MiB a part for 32 layers of 4,096, so
seconds for a few hundred parts) and c the polling (another node claims within a runner poll,
0.5 s; the harvest sees its last part end within PARTS_POLL_S, 0.5 s). On N nodes each part
runs on its own node's engine, and the busiest node runs ceil(P/N) parts: tN = ceil(P/N) x
S/r + m + c, so the speed-up approaches P / ceil(P/N) (N when N divides P) as T/r grows past
m + c. The tail: the last round has P mod N parts (when not 0), so N - (P mod N) nodes sit idle
for its S/r. Here: P = 6, N = 2: 6/3 = 2.0x; N = 3: 3.0x; N = 4: 6/2 = 3.0x (the last round's 2
parts on 4 nodes: 75% of 4x). A corpus of 10,000 such prompts in shards of 8 is 1,250 shards,
which make 250 parts of 5 (at most 256 parts): 4 nodes, 250/63 = 3.97x; 8 nodes, 250/32 =
7.8x. The spread was not always the best one with `harvest_parts_per_node` k = 2 (the default
when measured below; 1 since): a node ran up to k parts at once, which share its engine and
so end together, and it claims the next part as
soon as one of its own ends, before the other nodes' next poll. The node whose parts end first
(the first to claim, by up to a poll) therefore takes the last k parts when k or fewer are
left: P = 6, N = 2 splits 4 + 2 rather than 3 + 3, so t2 = 4 x S/r, 6/4 = 1.5x rather than
2.0x. k = 1 (VLLM_ACS_HARVEST_PARTS_PER_NODE=1; one part keeps `harvest_prompts_in_flight`
prompts in the engine by itself, less only while it writes a shard) or smaller parts
(`harvest_part_shards`) shrink both that and the tail. On this machine's two cores, two nodes'
engines share the CPU one engine had, so no speed-up can show: (a)/(b) near or below 1.0 is the
expected figure here (the second engine, nginx and the client contend for the same cores), and
the figures are noisy (other runs share the machine).

Measured here (2026-12-06; two cores, 23 GiB, so three nodes; other engineers' test runs and
benchmarks on the machine at the same time, the load average 8 to 13; 2.7 minutes in all, 89 s
of it starting the three nodes):

    192 prompts x 128 token ids (24,576 tokens), shard_size 8: 24 shards,
    6 parts; layers 'all' (4); tiny model, loopback, 2 cores; 3 nodes at a time
    on PostgreSQL + Redis, one files dir; 3 rounds of (a) then (b); 161 s in all
    harvest                      wall s  tok/s client s  tok/s  load  parts per node (harvest job)
    (a) tiny-llama via nginx #1   12.32  1,995    12.67  1,939   8.4  node 1: 4, node 2: 2 (node 2)
    (b) tiny-other, node 3 #1     14.15  1,737    14.33  1,715  10.6  node 3: 6 (node 3)
    (a) tiny-llama via nginx #2    6.91  3,559     6.98  3,523  13.1  node 1: 4, node 2: 2 (node 1)
    (b) tiny-other, node 3 #2      2.83  8,669     2.96  8,315  13.1  node 3: 6 (node 3)
    (a) tiny-llama via nginx #3    9.95  2,471    10.08  2,438  13.1  node 1: 4, node 2: 2 (node 2)
    (b) tiny-other, node 3 #3      2.20 11,186     2.27 10,817  12.6  node 3: 6 (node 3)
    (a) timings.parts 6/6/6, nodes 2/2/2; most parts running at once 4/4/4, on nodes 2/2/2;
        forward_s 36.6/18.3/34.6, write_s 4.6/5.1/2.2 (summed over its parts)
    (b) timings.parts 6/6/6, nodes 1/1/1; most parts running at once 2/2/2, on nodes 1/1/1;
        forward_s 23.8/4.4/3.4, write_s 3.1/1.1/0.9 (summed over its parts)
    (a)/(b) speed, medians: 0.29x by wall_s (rounds: 1.15/0.41/0.22), 0.29x by the client
        (2 cores: no speed-up can show; load = the 1-minute load average before)
    on paper, P=6 parts on N GPU nodes: P/ceil(P/N) = N=2 2.00x, N=3 3.00x, N=4 3.00x
        the last round's parts (P mod N) on N nodes: N=2 2 of 2, N=3 3 of 3, N=4 2 of 4
    PASS shard names: (a) 24, (b) 24, the same, a one-node harvest's (shard_00000..00023)
    PASS the same prompts in each shard (first and last)
    PASS manifest fields equal but checkpoint, job_id, model, tokenizer; complete: True
    PASS tokens: each prompt's 128 ids exact in both
    PASS rows within a bf16 step (row rel. L2 <= 0.01): worst 0; 192 of 192 prompts bit-identical
    PASS (a) stats = its rows' statistics in order, within float rounding (rtol 1e-05, atol 1e-06);
         largest |diff|: mean 1.5e-08, the other 6 exactly 0
    PASS (b) stats = its rows' statistics in order, within float rounding (rtol 1e-05, atol 1e-06);
         largest |diff|: mean 1.5e-08, the other 6 exactly 0
    PASS (a) stats = (b)'s: counts exact, the rest within float rounding (rows bit-identical);
         rtol 1e-05, atol 1e-06; largest |diff|: 8 exactly 0
    PASS (a) charged once, each round: usage rows 24/24/24 for 24 shards, prompt tokens 24,576 each
    PASS (b) charged once, each round: usage rows 24/24/24 for 24 shards, prompt tokens 24,576 each
    PASS each part ran on a node of its model: (a)'s on nodes 1-2, (b)'s on node 3

The speed figures say nothing of scaling: with the machine loaded 4 to 6 times over by other
runs, one harvest of 24,576 tokens took 2.2 s to 14 s on the same node, and the two-node
harvest lost to the one-node harvest in two rounds of three (two engines' CPU threads, nginx and
the client on two cores already oversubscribed). An earlier run (the same measurement, other
labels), at a load of 5 to 12, gave medians of 0.95x (rounds 1.27/0.78/0.56), the same PASS
lines. Both on 0c987b4 with work in progress in the tree (the harvest's job woken as soon as a
part ends on its node; batch work's share beside live traffic, none here). What does carry
over to GPU nodes: every part ran on a node of its model, both nodes of `tiny-llama` ran parts
in every round (at most 4 parts running on 2 nodes at once), and the spread was 4 + 2 in every
round, the uneven split described above (1.5x on two GPU nodes rather than 2.0x). The files are
the one-node harvest's to the bit (every row bit-identical, so the merged statistics equal too),
and each shard was charged once.
"""

from __future__ import annotations

import math
import os
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks._deployment import deployment, node_count, stop_on_sigterm
from tests.e2e.shared_nodes import Cluster, node_logs
from tests.harness import MODEL_ID, ServerProcess
from tests.nginx import running_nginx
from tests.reference import BATCH_ROUNDING_TOLERANCE, assert_rows_close, row_errors

PROMPTS = int(os.environ.get("VLLM_ACS_BENCH_HARVEST_PROMPTS", "192"))
# (a) then (b), this many times: the machine's other load moves a single pair by several times.
ROUNDS = max(1, int(os.environ.get("VLLM_ACS_BENCH_HARVEST_ROUNDS", "3")))
PROMPT_TOKENS = 128
SHARD_SIZE = 8
LAYERS = "all"
WARMUP_PROMPTS = 2 * SHARD_SIZE * 4  # two parts of the node's default part size
WARMUP_COMPLETIONS = 4
OTHER_ID = "tiny-other"
OTHER_NODE = ({"VLLM_ACS_MODEL_ID": OTHER_ID}, ["--served-model-name", f"vllm-acs/{OTHER_ID}"])
LLAMA_NODE: tuple[dict[str, str], list[str]] = ({}, [])
# The client's poll of a running harvest (its answer is read from PostgreSQL on any node).
POLL_S = 0.1
# Bounds: a harvest (or the ledger) that takes longer than this means something is stuck; the
# run stops with an error (and stops every process).
HARVEST_TIMEOUT_S = 300.0
LEDGER_TIMEOUT_S = 30.0
NGINX_READ_TIMEOUT_S = 120.0
# Manifest fields that name the model, not the harvest's layout.
DIFFER = {"job_id", "model", "checkpoint", "tokenizer"}
FLOAT_RTOL, FLOAT_ATOL = 1e-5, 1e-6
BF16_RTOL, BF16_ATOL = 1e-2, 1e-3


def _prompts(seed: int, count: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, 1000, size=PROMPT_TOKENS)] for _ in range(count)]


@dataclass
class Harvest:
    name: str
    job: dict[str, Any]  # as a node answers it once done
    client_s: float  # submit to reading `done`
    most_parts_running: int = 0
    most_nodes: int = 0
    parts_by_node: dict[str, int] = field(default_factory=dict)
    harvest_node: str = "?"
    usage_rows: int = 0
    usage_tokens: int = 0
    files: Any = None  # vllm_acs.client.HarvestFiles
    load: tuple[float, float] = (0.0, 0.0)  # the machine's 1-minute load average, before, after

    @property
    def timings(self) -> dict[str, Any]:
        return self.job["result"]["timings"]

    @property
    def node_per_s(self) -> float:
        return self.timings["tokens"] / self.timings["wall_s"]

    @property
    def client_per_s(self) -> float:
        return self.timings["tokens"] / self.client_s


@dataclass
class Place:
    """Where a harvest is sent and read, and the deployment that runs it."""

    submit_url: str  # nginx's, or the node's
    node_url: str  # a node's: the download URLs name the node that answered
    cluster: Cluster
    labels: dict[str, str]  # node base URL -> "node 1"
    model: str


def _client(base_url: str, secret: str) -> httpx.Client:
    # trust_env=False: a proxy from the environment must not sit between the client and loopback.
    return httpx.Client(
        base_url=base_url,
        headers={"Authorization": f"Bearer {secret}"},
        timeout=120,
        trust_env=False,
    )


def _run_harvest(name: str, place: Place, secret: str, prompts: list[list[int]]) -> Harvest:
    """Submits the harvest at `place`, polls it there until it ends, and reads it from a node."""
    body = {"model": place.model, "prompts": prompts, "layers": LAYERS, "shard_size": SHARD_SIZE}
    most_running = most_nodes = 0
    with _client(place.submit_url, secret) as client:
        started = time.perf_counter()
        submitted = client.post("/v1/harvest", json=body)
        if submitted.status_code != 202:
            raise RuntimeError(
                f"{name}: harvest answered {submitted.status_code}: {submitted.text}"
            )
        job_id = submitted.json()["job_id"]
        deadline = time.monotonic() + HARVEST_TIMEOUT_S
        while True:
            answer = client.get(f"/v1/harvest/{job_id}")
            if answer.status_code != 200:
                raise RuntimeError(f"{name}: read answered {answer.status_code}: {answer.text}")
            job = answer.json()
            progress = job.get("progress") or {}
            most_running = max(most_running, progress.get("parts_running") or 0)
            most_nodes = max(most_nodes, progress.get("nodes") or 0)
            if job["status"] not in ("pending", "running"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name}: harvest {job_id} not ended after {HARVEST_TIMEOUT_S:.0f} s\n"
                    + node_logs(place.cluster.nodes)
                )
            time.sleep(POLL_S)
        client_s = time.perf_counter() - started
    if job["status"] != "done":
        raise RuntimeError(f"{name}: harvest ended {job['status']}: {job.get('error')}")
    with _client(place.node_url, secret) as client:
        job = client.get(f"/v1/harvest/{job_id}").json()
    return Harvest(name, job, client_s, most_running, most_nodes)


def _node_of(place: Place, owner: str | None) -> str:
    if not owner:
        return "-"
    try:
        return place.labels[place.cluster.owner_node(owner).base_url]
    except (ValueError, IndexError, KeyError):
        return f"? ({owner})"


def _describe(harvest: Harvest, place: Place) -> None:
    """Parts per node, the harvest's own node and its usage rows, from PostgreSQL."""
    job_id = harvest.job["job_id"]
    rows = place.cluster.query(
        "SELECT owner, count(*) AS n FROM jobs WHERE parent_id = $1 GROUP BY owner", job_id
    )
    for row in rows:
        node = _node_of(place, row["owner"])
        harvest.parts_by_node[node] = harvest.parts_by_node.get(node, 0) + int(row["n"])
    (own,) = place.cluster.query("SELECT owner FROM jobs WHERE id = $1", job_id)
    harvest.harvest_node = _node_of(place, own["owner"])
    # The ledger is written by each node's writer task a moment after the shard.
    n_shards = harvest.job["result"]["n_shards"]
    deadline = time.monotonic() + LEDGER_TIMEOUT_S
    while True:
        (usage,) = place.cluster.query(
            "SELECT count(*) AS n, coalesce(sum(prompt_tokens), 0) AS tokens FROM usage_rows "
            "WHERE request_id LIKE $1",
            f"{job_id}-shard-%",
        )
        if usage["n"] >= n_shards or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    harvest.usage_rows, harvest.usage_tokens = int(usage["n"]), int(usage["tokens"])


def _download(harvest: Harvest, target: Path) -> None:
    from vllm_acs.client import download_harvest

    # A transport of its own: no proxy from the environment between the client and loopback.
    harvest.files = download_harvest(harvest.job, target, transport=httpx.HTTPTransport())


def _warm_up(nodes: list[ServerProcess], places: list[Place], secret: str) -> None:
    """A few 128-token completions on each node, then a small harvest of each model."""
    prompts = _prompts(7, WARMUP_COMPLETIONS)
    for node in nodes:
        with _client(node.base_url, secret) as client:
            for prompt in prompts:
                body = {"model": _served(node), "prompt": prompt, "max_tokens": 1}
                answer = client.post("/v1/completions", json=body)
                if answer.status_code != 200:
                    raise RuntimeError(f"warm-up answered {answer.status_code}: {answer.text}")
    for place in places:
        _run_harvest(f"warm-up {place.model}", place, secret, _prompts(8, WARMUP_PROMPTS))


def _served(node: ServerProcess) -> str:
    return node.env.get("VLLM_ACS_MODEL_ID", MODEL_ID)


def _key(node: ServerProcess) -> str:
    """Starts per minute and running slots far above the run's: nothing is refused by design."""
    return node.create_key(
        "bench",
        *("--starts-per-minute", "1000000", "--max-running", "256", "--max-waiting", "256"),
    )


@dataclass
class Run:
    nodes: int
    a: list[Harvest]  # one per round; the first round's downloaded
    b: list[Harvest]
    seconds: float


def _measured(name: str, place: Place, secret: str, target: Path | None) -> Harvest:
    before = os.getloadavg()[0]
    harvest = _run_harvest(name, place, secret, _prompts(1, PROMPTS))
    harvest.load = (before, os.getloadavg()[0])
    _describe(harvest, place)
    if target is not None:
        _download(harvest, target)
    print(f"  {name}: {harvest.node_per_s:,.0f} tok/s (node), {harvest.client_s:.2f} s", flush=True)
    return harvest


def _target(root: Path, side: str, round_: int) -> Path | None:
    """Where the first round's harvest is downloaded (the checks read it); None after."""
    return root / side if round_ == 0 else None


def measure(root: Path) -> Run:
    """Both harvests, downloaded under `root` (read by `check` before it is removed)."""
    from vllm_acs.tiny_model import write_tiny_model

    count = node_count()
    began = time.monotonic()
    model_dir = write_tiny_model(root / "tiny-llama")
    files_dir = root / "files"
    files_dir.mkdir()
    env = {
        "VLLM_ACS_GPU_SHAPE": "cpu-test",
        "VLLM_ACS_FILES_DIR": str(files_dir),
        # One secret for every node, as docs/deployment.md says.
        "VLLM_ACS_URL_SECRET": secrets.token_urlsafe(32),
    }
    name_a = "(a) tiny-llama via nginx"
    name_b = "(b) tiny-other, node 3"
    if count == 3:
        per_node = [LLAMA_NODE, LLAMA_NODE, OTHER_NODE]
        with deployment(model_dir, root / "home", env, per_node) as (nodes, database_url):
            cluster = Cluster.of(nodes, database_url)
            labels = {n.base_url: f"node {i + 1}" for i, n in enumerate(nodes)}
            with running_nginx(
                [n.base_url for n in nodes[:2]], root / "nginx", NGINX_READ_TIMEOUT_S
            ) as proxy:
                secret = _key(nodes[0])
                llama = Place(proxy.base_url, nodes[0].base_url, cluster, labels, MODEL_ID)
                other = Place(nodes[2].base_url, nodes[2].base_url, cluster, labels, OTHER_ID)
                _warm_up(nodes, [llama, other], secret)
                a, b = [], []
                for n in range(ROUNDS):
                    a.append(_measured(f"{name_a} #{n + 1}", llama, secret, _target(root, "a", n)))
                    b.append(_measured(f"{name_b} #{n + 1}", other, secret, _target(root, "b", n)))
        return Run(3, a, b, time.monotonic() - began)
    # Two nodes at a time: the two tiny-llama nodes, then the tiny-other node alone.
    per_node = [LLAMA_NODE, LLAMA_NODE]
    with deployment(model_dir, root / "home", env, per_node) as (nodes, database_url):
        cluster = Cluster.of(nodes, database_url)
        labels = {n.base_url: f"node {i + 1}" for i, n in enumerate(nodes)}
        with running_nginx(
            [n.base_url for n in nodes], root / "nginx", NGINX_READ_TIMEOUT_S
        ) as proxy:
            secret = _key(nodes[0])
            llama = Place(proxy.base_url, nodes[0].base_url, cluster, labels, MODEL_ID)
            _warm_up(nodes, [llama], secret)
            a = [
                _measured(f"{name_a} #{n + 1}", llama, secret, _target(root, "a", n))
                for n in range(ROUNDS)
            ]
    with deployment(model_dir, root / "home-other", env, [OTHER_NODE]) as (nodes, db_url):
        cluster = Cluster.of(nodes, db_url)
        labels = {nodes[0].base_url: "node 3"}
        secret = _key(nodes[0])
        other = Place(nodes[0].base_url, nodes[0].base_url, cluster, labels, OTHER_ID)
        _warm_up(nodes, [other], secret)
        b = [
            _measured(f"(b) tiny-other, 2nd dep #{n + 1}", other, secret, _target(root, "b", n))
            for n in range(ROUNDS)
        ]
    return Run(2, a, b, time.monotonic() - began)


def _stats_numpy(files: Any) -> dict[str, np.ndarray]:
    return {name: tensor.numpy() for name, tensor in files.stats().items()}


def _direct_stats(files: Any) -> dict[str, np.ndarray]:
    """The statistics of the harvest's rows taken in order, as one LayerStats adds them."""
    from vllm_acs.harvest.stats import LayerStats

    stats = LayerStats(len(files.layer_indices), files.hidden_size)
    for _index, rows, tokens in files.prompts():
        exact = rows.float().numpy()
        if files.bos_token_id is not None and int(tokens[0]) == files.bos_token_id:
            stats.add(exact[:, 1:], exact[:, :1])
        else:
            stats.add(exact)
    return stats.final()


def _worst(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> str:
    """The largest absolute difference of each statistic of `want`, those not 0 by name."""
    parts, zero = [], 0
    for name in sorted(want):
        if name not in got:
            parts.append(f"{name} missing")
            continue
        diff = float(np.abs(got[name].astype(np.float64) - want[name].astype(np.float64)).max())
        if diff:
            parts.append(f"{name} {diff:.2g}")
        else:
            zero += 1
    return ", ".join([*parts, f"{'the other ' if parts else ''}{zero} exactly 0"])


def _close(
    got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float, atol: float
) -> bool:
    """Every statistic of `want` in `got`: the integer ones (count, layer_indices) exact."""
    for name, value in want.items():
        if name not in got:
            return False
        if np.issubdtype(value.dtype, np.integer):
            if not np.array_equal(got[name], value):
                return False
        elif not np.allclose(got[name], value, rtol=rtol, atol=atol):
            return False
    return True


def check(run: Run, prompts: list[list[int]]) -> list[tuple[bool, str]]:
    """(passed, text) of each correctness check of (a) against (b)."""
    a, b = run.a[0].files, run.b[0].files
    checks: list[tuple[bool, str]] = []
    n_shards = math.ceil(PROMPTS / SHARD_SIZE)
    names_a = [p.name for p in a.shard_paths]
    names_b = [p.name for p in b.shard_paths]
    expected = [f"shard_{n:05d}.safetensors" for n in range(n_shards)]
    checks.append(
        (
            names_a == names_b == expected,
            f"shard names: (a) {len(names_a)}, (b) {len(names_b)}, the same, a one-node "
            f"harvest's (shard_00000..{n_shards - 1:05d})",
        )
    )
    ranges_a = [(s["first_prompt"], s["last_prompt"]) for s in a.manifest["shards"]]
    ranges_b = [(s["first_prompt"], s["last_prompt"]) for s in b.manifest["shards"]]
    checks.append((ranges_a == ranges_b, "the same prompts in each shard (first and last)"))
    fields_a = {k: v for k, v in a.manifest.items() if k not in DIFFER}
    fields_b = {k: v for k, v in b.manifest.items() if k not in DIFFER}
    differing = sorted(
        k for k in fields_a.keys() | fields_b.keys() if fields_a.get(k) != fields_b.get(k)
    )
    checks.append(
        (
            not differing and a.manifest.get("complete") is True,
            f"manifest fields equal but {', '.join(sorted(DIFFER))}"
            + (f" (differ: {', '.join(differing)})" if differing else "")
            + f"; complete: {a.manifest.get('complete')}",
        )
    )
    ours = {index: (rows, tokens) for index, rows, tokens in a.prompts()}
    theirs = {index: (rows, tokens) for index, rows, tokens in b.prompts()}
    tokens_ok = sorted(ours) == sorted(theirs) == list(range(PROMPTS)) and all(
        ours[i][1].tolist() == theirs[i][1].tolist() == prompts[i] for i in range(PROMPTS)
    )
    checks.append((tokens_ok, f"tokens: each prompt's {PROMPT_TOKENS} ids exact in both"))
    identical, worst, rows_ok = 0, 0.0, tokens_ok
    if tokens_ok:
        for index in range(PROMPTS):
            got, want = ours[index][0], theirs[index][0]
            if got.shape == want.shape and bool((got == want).all()):
                identical += 1
            got32, want32 = got.float().numpy(), want.float().numpy()
            try:
                assert_rows_close(got32, want32, f"prompt {index}")
                worst = max(worst, float(row_errors(got32, want32).max()))
            except AssertionError as error:
                rows_ok = False
                print(f"  {error}")
    checks.append(
        (
            rows_ok,
            f"rows within a bf16 step (row rel. L2 <= {BATCH_ROUNDING_TOLERANCE}): worst "
            f"{worst:.2g}; {identical} of {PROMPTS} prompts bit-identical",
        )
    )
    stats_a, stats_b = _stats_numpy(a), _stats_numpy(b)
    for label, files, stats in (("(a)", a, stats_a), ("(b)", b, stats_b)):
        direct = _direct_stats(files)
        checks.append(
            (
                _close(stats, direct, FLOAT_RTOL, FLOAT_ATOL),
                f"{label} stats = its rows' statistics in order, within float rounding (rtol "
                f"{FLOAT_RTOL:g}, atol {FLOAT_ATOL:g});\n     largest |diff|: "
                f"{_worst(stats, direct)}",
            )
        )
    same_rows = identical == PROMPTS
    rtol, atol = (FLOAT_RTOL, FLOAT_ATOL) if same_rows else (BF16_RTOL, BF16_ATOL)
    within = "float rounding (rows bit-identical)" if same_rows else "the rows' bf16 rounding"
    checks.append(
        (
            _close(stats_a, stats_b, rtol, atol),
            f"(a) stats = (b)'s: counts exact, the rest within {within};\n     rtol {rtol:g}, "
            f"atol {atol:g}; largest |diff|: {_worst(stats_a, stats_b)}",
        )
    )
    tokens = PROMPTS * PROMPT_TOKENS
    for side, harvests in (("(a)", run.a), ("(b)", run.b)):
        rows = [h.usage_rows for h in harvests]
        charged = [h.usage_tokens for h in harvests]
        spent = (
            f"{tokens:,} each"
            if set(charged) == {tokens}
            else "/".join(f"{t:,}" for t in charged) + f" of {tokens:,}"
        )
        checks.append(
            (
                set(rows) == {n_shards} and set(charged) == {tokens},
                f"{side} charged once, each round: usage rows {'/'.join(map(str, rows))} for "
                f"{n_shards} shards, prompt tokens {spent}",
            )
        )
    on_a = {node for h in run.a for node in h.parts_by_node}
    on_b = {node for h in run.b for node in h.parts_by_node}
    checks.append(
        (
            bool(on_a) and on_a <= {"node 1", "node 2"} and on_b == {"node 3"},
            "each part ran on a node of its model: (a)'s on nodes 1-2, (b)'s on node 3",
        )
    )
    return checks


def _spread(parts: dict[str, int]) -> str:
    return ", ".join(f"{node}: {n}" for node, n in sorted(parts.items()))


def report(run: Run) -> bool:
    """Prints the figures and the checks; True when every check passed."""
    first = run.a[0]
    parts, n_shards = first.timings["parts"], first.job["result"]["n_shards"]
    cores = os.cpu_count()
    print(
        f"{PROMPTS} prompts x {PROMPT_TOKENS} token ids ({PROMPTS * PROMPT_TOKENS:,} tokens), "
        f"shard_size {SHARD_SIZE}: {n_shards} shards,\n{parts} parts; layers {LAYERS!r} "
        f"({len(first.job['result']['layer_indices'])}); tiny model, loopback, {cores} cores; "
        f"{run.nodes} nodes at a time\non PostgreSQL + Redis, one files dir; {ROUNDS} rounds of "
        f"(a) then (b); {run.seconds:.0f} s in all"
    )
    print(
        f"{'harvest':<28}{'wall s':>7}{'tok/s':>7}{'client s':>9}{'tok/s':>7} {'load':>5}  "
        "parts per node (harvest job)"
    )
    for h in (h for pair in zip(run.a, run.b, strict=True) for h in pair):
        print(
            f"{h.name:<28}{h.timings['wall_s']:7.2f}{h.node_per_s:7,.0f}{h.client_s:9.2f}"
            f"{h.client_per_s:7,.0f} {h.load[0]:5.1f}  {_spread(h.parts_by_node)} "
            f"({h.harvest_node})"
        )
    for side, harvests in (("(a)", run.a), ("(b)", run.b)):
        t = [h.timings for h in harvests]
        forward = "/".join(f"{x['forward_s']:.1f}" for x in t)
        write = "/".join(f"{x['write_s']:.1f}" for x in t)
        print(
            f"{side} timings.parts {'/'.join(str(x['parts']) for x in t)}, nodes "
            f"{'/'.join(str(x['nodes']) for x in t)}; most parts running at once "
            f"{'/'.join(str(h.most_parts_running) for h in harvests)}, on nodes "
            f"{'/'.join(str(h.most_nodes) for h in harvests)};\n    forward_s {forward}, "
            f"write_s {write} (summed over its parts)"
        )
    node_a = statistics.median(h.node_per_s for h in run.a)
    node_b = statistics.median(h.node_per_s for h in run.b)
    client_a = statistics.median(h.client_per_s for h in run.a)
    client_b = statistics.median(h.client_per_s for h in run.b)
    each = "/".join(f"{a.node_per_s / b.node_per_s:.2f}" for a, b in zip(run.a, run.b, strict=True))
    print(
        f"(a)/(b) speed, medians: {node_a / node_b:.2f}x by wall_s (rounds: {each}), "
        f"{client_a / client_b:.2f}x by the client"
    )
    print(f"    ({cores} cores: no speed-up can show; load = the 1-minute load average before)")
    ratios = ", ".join(f"N={n} {parts / math.ceil(parts / n):.2f}x" for n in (2, 3, 4))
    tails = ", ".join(f"N={n} {parts % n or n} of {n}" for n in (2, 3, 4))
    print(f"on paper, P={parts} parts on N GPU nodes: P/ceil(P/N) = {ratios}")
    print(f"    the last round's parts (P mod N) on N nodes: {tails}")
    passed = True
    for ok, line in check(run, _prompts(1, PROMPTS)):
        print(("PASS " if ok else "FAIL ") + line)
        passed = passed and ok
    return passed


def main() -> None:
    stop_on_sigterm()
    with tempfile.TemporaryDirectory() as tmp:
        passed = report(measure(Path(tmp)))
    if not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(main())
