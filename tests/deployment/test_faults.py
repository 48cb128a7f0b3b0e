"""Faults of the shared services, with a real node: Redis stopped and started again empty, and
PostgreSQL unreachable for a few seconds. Meanwhile requests answer `503` with Retry-After in
bounded time, never a 500 or a hang; a request that lost its Redis lease is stopped, and
afterwards admission is exact again.

The node reaches PostgreSQL through a TCP proxy the test cuts (tests/tcp_proxy.py) and uses a
private redis-server the test stops and starts (tests/redis_server.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import ServerProcess, started, wait_until
from tests.redis_server import RedisServer
from tests.services import private_pg_database
from tests.slot_holder import holding_stream, wait_for_the_slot
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.e2e

# Renewed every 1.7 s: a lost lease is found soon; a stall of a busy machine loses none.
LEASE_MS = 5000


class Node:
    def __init__(self, server: ServerProcess, proxy: TcpProxy | None, redis: RedisServer) -> None:
        self.server, self.proxy, self.redis = server, proxy, redis


@contextlib.contextmanager
def _node(model_dir, home, *, proxied: bool) -> Iterator[Node]:
    """A node with a private redis-server, on a private PostgreSQL database reached through a
    TcpProxy (`proxied`) or directly. The Redis test takes the direct one: the proxy runs in this
    test process, and its streams' threads would slow every database read of the node."""
    redis = RedisServer(home).start()
    with private_pg_database() as database_url, contextlib.ExitStack() as stack:
        url, proxy = database_url, None
        if proxied:
            host_port = database_url.split("://", 1)[1].split("@", 1)[1].rsplit("/", 1)[0]
            host, port = host_port.split(":")
            proxy = stack.enter_context(TcpProxy(host, int(port)))
            url = database_url.replace(host_port, f"127.0.0.1:{proxy.port}")
        env = {
            "VLLM_ACS_HOME": str(home),
            "VLLM_ACS_DATABASE_URL": url,
            "VLLM_ACS_REDIS_URL": redis.url,
            "VLLM_ACS_LEASE_MS": str(LEASE_MS),
        }
        subprocess.run(
            [sys.executable, "-m", "vllm_acs.cli", "db", "upgrade"],
            env={**os.environ, **env},
            check=True,
            capture_output=True,
        )
        server = ServerProcess(model_dir=model_dir, log_path=home / "node.log", env=env)
        try:
            with started(server):
                yield Node(server, proxy, redis)
        finally:
            redis.stop()


@pytest.fixture
def db_node(tiny_model_dir, tmp_path_factory) -> Iterator[Node]:
    with _node(tiny_model_dir, tmp_path_factory.mktemp("faults-db-home"), proxied=True) as node:
        yield node


@pytest.fixture
def redis_node(tiny_model_dir, tmp_path_factory) -> Iterator[Node]:
    with _node(tiny_model_dir, tmp_path_factory.mktemp("faults-redis-home"), proxied=False) as n:
        yield n


def _timed(call) -> tuple[httpx.Response, float]:
    begun = time.monotonic()
    response = call()
    return response, time.monotonic() - begun


def test_an_unreachable_database_answers_503_then_recovers(db_node: Node):
    node = db_node
    assert node.proxy is not None
    key = node.server.create_key("faults-db")
    auth = {"Authorization": f"Bearer {key}"}
    base = node.server.base_url
    assert httpx.get(f"{base}/v1/looms", headers=auth, timeout=30).status_code == 200
    node.proxy.cut()
    try:
        for method, path, body in [
            ("GET", "/v1/looms", None),
            ("POST", "/v1/looms", {"prompt": "x"}),
            ("GET", "/v1/completion-jobs/job_none", None),
        ]:
            response, took = _timed(
                lambda m=method, p=path, b=body: httpx.request(
                    m, base + p, json=b, headers=auth, timeout=60
                )
            )
            assert response.status_code == 503, (path, response.text)
            assert response.json()["error"]["code"] == "db_pool_exhausted"
            assert int(response.headers["retry-after"]) >= 1
            assert took < 15, f"{path} took {took:.1f}s with the database unreachable"
    finally:
        node.proxy.restore()
    deadline = time.monotonic() + 30
    while httpx.get(f"{base}/v1/looms", headers=auth, timeout=30).status_code != 200:
        assert time.monotonic() < deadline, node.server.log_tail()
        time.sleep(0.5)


def test_redis_restarted_answers_503_meanwhile_then_admission_is_exact(redis_node: Node):
    node = redis_node
    limits = ("--max-running", "1", "--max-waiting", "0")
    record = node.server.create_key_record("faults-redis", *limits)
    auth = {"Authorization": f"Bearer {record['key']}"}
    base = node.server.base_url
    # The streams run until the test reads them to the end or leaves (tests/slot_holder.py), so
    # the lease is lost while the request is surely in flight, however fast the engine.
    with holding_stream(base, auth, {"prompt": "Once"}) as first:
        # Redis restarted empty while the request runs: every slot and Hold is gone.
        node.redis.stop()
        node.redis.start()  # the same port
        wait_until(lambda: node.server.metric("acs_leases_lost_total") >= 1, "the lost lease found")
        # The request that ran across the restart lost its lease: it is stopped, and its stream
        # ends with an error frame.
        rest = first.rest()
    assert "data: [DONE]" not in rest and any('"error"' in line for line in rest), rest[-3:]
    node.server.wait_for_metric("acs_running_requests", 0)
    # While Redis is down: 503 circuit_open with Retry-After, in bounded time.
    node.redis.stop()
    try:
        body = {"prompt": "x", "max_tokens": 1}
        refused, took = _timed(
            lambda: httpx.post(f"{base}/v1/completions", json=body, headers=auth, timeout=60)
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "circuit_open"
        assert "retry-after" in refused.headers and took < 30  # bounded: no hang
    finally:
        node.redis.start()
    # Admission is exact again: one running slot, no queue place.
    with holding_stream(base, auth, {"prompt": "Once"}):
        over = httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 1},
                          headers=auth, timeout=60)  # fmt: skip
        assert (over.status_code, over.json()["error"]["code"]) == (429, "queue_full")
    # The client left: its slot is given back.
    wait_for_the_slot(base, auth)
