"""ForwardingMiddleware on a stand-in route, over a real model registry and Looms on SQLite, with
the other node an httpx mock: which writing POSTs go to the node of their model (the body's
`model`; for a Loom replay, the model its Node recorded), with what, and which stay here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from vllm_acs.deployment.registry import NodeRegistry
from vllm_acs.middleware.asgi import read_body
from vllm_acs.middleware.forwarding import ForwardingMiddleware
from vllm_acs.served_model import NodeModels, ServedModel
from vllm_acs.settings import Settings
from vllm_acs.storage import open_storage
from vllm_acs.storage.loom_records import Loom, LoomNode

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
OURS = ServedModel("model-a", "org/a", 2048, 20, "cpu", 0)
THEIRS = ServedModel("model-b", "org/b", 2048, 20, "cpu", 0)
OTHER_NODE = "http://node-b.test"
LOOM = "loom_1"


def _node(node_id: str, parent: str | None, origin: str, model: str | None = None) -> LoomNode:
    generation = None if model is None else {"model": model, "seed": 1, "prompt_token_ids": [1]}
    return LoomNode(
        id=node_id,
        loom_id=LOOM,
        parent_id=parent,
        position=0,
        origin=origin,
        status="ready",
        text="x",
        created_at=NOW,
        updated_at=NOW,
        generation=generation,
    )


class Deployment:
    """This node (model-a) in front of a stand-in route; node-b (model-b) answers by mock."""

    def __init__(
        self, storage, registry: NodeRegistry, refuse: type[httpx.TransportError] | None
    ) -> None:
        self.storage = storage
        self.registry = registry
        self.local: list[tuple[str, bytes]] = []  # what the route here received
        self.upstream: list[httpx.Request] = []  # what node-b received
        self.refuse = refuse

    async def route(self, scope, receive, send) -> None:
        self.local.append((scope["path"], await read_body(receive)))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"here"})

    def node_b(self, request: httpx.Request) -> httpx.Response:
        if self.refuse is not None:  # node-b cannot be reached, or cut the connection
            raise self.refuse("node-b is gone", request=request)
        self.upstream.append(request)
        # A stream, as a real answer is: the forwarder relays it as it comes.
        return httpx.Response(200, stream=httpx.ByteStream(b"node-b"))


@pytest.fixture
def deployment(tmp_path: Path):
    """(async client factory): a client of this node and its Deployment."""

    async def build(
        refuse: type[httpx.TransportError] | None = None, default_model: str | None = None
    ) -> tuple[httpx.AsyncClient, Deployment]:
        url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"
        storage = await open_storage(Settings(database_url=url, home=tmp_path))
        await storage.registry.announce("node-b", OTHER_NODE, THEIRS, NOW)
        loom = Loom(LOOM, "key_1", "acct_1", None, 0, NOW, NOW)
        nodes = [
            _node("root", None, "root"),
            _node("by_b", "root", "model", THEIRS.id),
            _node("by_a", "root", "model", OURS.id),
            _node("by_hand", "root", "human"),
        ]
        await storage.looms.create(loom, nodes, max_per_key=10, max_nodes=10)
        registry = NodeRegistry(
            storage.registry,
            "node-a",
            "http://node-a.test",
            lambda: OURS,
            heartbeat_s=0.0,  # read the table at every request
            ttl_s=3600,
            clock=lambda: NOW,
        )
        models = NodeModels()
        models.register(OURS)
        here = Deployment(storage, registry, refuse)
        upstream = httpx.AsyncClient(transport=httpx.MockTransport(here.node_b))
        app = ForwardingMiddleware(
            here.route,
            models,
            registry,
            upstream,
            storage.looms.recorded_model,
            default_model=default_model,
        )
        transport = httpx.ASGITransport(app=app)
        return httpx.AsyncClient(transport=transport, base_url="http://t"), here

    return build


def _replay(node_id: str) -> str:
    return f"/v1/looms/{LOOM}/nodes/{node_id}/replay"


def test_a_replay_of_a_node_another_nodes_model_made_is_answered_there(deployment):
    async def run() -> None:
        client, here = await deployment()
        del client.headers["accept-encoding"]  # as curl sends it: no Accept-Encoding
        headers = {"Authorization": "Bearer acs-bm-x", "X-Request-Id": "req-1"}
        answer = await client.post(_replay("by_b"), headers=headers)
        assert (answer.status_code, answer.content) == (200, b"node-b")
        assert here.local == []
        (sent,) = here.upstream
        assert str(sent.url) == OTHER_NODE + _replay("by_b")
        assert sent.method == "POST"
        # The serving node authenticates the client's key; it never forwards it again.
        assert sent.headers["authorization"] == "Bearer acs-bm-x"
        assert sent.headers["x-acs-forwarded-by"] == "node-a"
        assert sent.headers["x-request-id"] == "req-1"
        # Relayed byte for byte: only an encoding the client accepts.
        assert sent.headers["accept-encoding"] == "identity"
        gzip_ok = {**headers, "Accept-Encoding": "gzip"}
        assert (await client.post(_replay("by_b"), headers=gzip_ok)).content == b"node-b"
        assert here.upstream[-1].headers["accept-encoding"] == "gzip"
        await here.storage.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("node_id", "why"),
    [
        ("by_a", "this node's model made it"),
        ("by_hand", "no model recorded: the route's own 409"),
        ("root", "no model recorded: the route's own 409"),
        ("nowhere", "no such Node: the route's own 404"),
    ],
)
def test_a_replay_is_answered_here_when_no_other_node_is_its_models(deployment, node_id, why):
    async def run() -> None:
        client, here = await deployment()
        answer = await client.post(_replay(node_id))
        assert answer.content == b"here", why
        assert here.local == [(_replay(node_id), b"")] and here.upstream == []
        await here.storage.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    "path",
    [
        "/v1/completions",
        "/v1/completion-jobs",
        "/v1/harvest",
        f"/v1/looms/{LOOM}/nodes/root/branch",
        f"/v1/looms/{LOOM}/nodes/root/score",
    ],
)
def test_a_body_naming_another_nodes_model_is_answered_there(deployment, path):
    async def run() -> None:
        client, here = await deployment()
        theirs = json.dumps({"model": THEIRS.id, "prompt": "x"}).encode()
        assert (await client.post(path, content=theirs)).content == b"node-b"
        assert [(r.url.path, r.content) for r in here.upstream] == [(path, theirs)]
        ours = json.dumps({"model": OURS.id, "prompt": "x"}).encode()
        assert (await client.post(path, content=ours)).content == b"here"
        assert here.local == [(path, ours)]  # the body read for routing reaches the route
        await here.storage.close()

    asyncio.run(run())


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/completion-jobs", "/v1/harvest"])
def test_a_body_without_model_goes_to_the_deployments_default_model(deployment, path):
    async def run() -> None:
        no_model = json.dumps({"prompt": "x"}).encode()
        # The deployment's default is the other node's model: answered there.
        client, here = await deployment(default_model=THEIRS.id)
        assert (await client.post(path, content=no_model)).content == b"node-b"
        assert [(r.url.path, r.content) for r in here.upstream] == [(path, no_model)]
        # A `model` that is not a string is this node's 400 to give, not a default.
        bad = json.dumps({"model": 7, "prompt": "x"}).encode()
        assert (await client.post(path, content=bad)).content == b"here"
        await here.storage.close()

    asyncio.run(run())


def test_without_a_deployment_default_a_body_without_model_is_this_nodes(deployment):
    async def run() -> None:
        client, here = await deployment()
        no_model = json.dumps({"prompt": "x"}).encode()
        assert (await client.post("/v1/completions", content=no_model)).content == b"here"
        assert here.upstream == []
        await here.storage.close()

    asyncio.run(run())


def test_the_deployments_default_model_is_marked_in_its_list(deployment):
    async def run() -> None:
        _client, here = await deployment()
        # One model per node and no deployment default: each node's own is its default.
        assert {m.id: m.default for m in await here.registry.models()} == {
            OURS.id: True,
            THEIRS.id: False,
        }
        # VLLM_ACS_DEFAULT_MODEL=<theirs> on every node: this node's own model is not the
        # default (served_model_from_engine), the other's is, on every node alike.
        here.registry.model = lambda: dataclasses.replace(OURS, default=False)
        here.registry.default_model = THEIRS.id
        assert {m.id: m.default for m in await here.registry.models()} == {
            OURS.id: False,
            THEIRS.id: True,
        }
        await here.storage.close()

    asyncio.run(run())


def test_a_forwarded_replay_is_not_forwarded_again(deployment):
    async def run() -> None:
        client, here = await deployment()
        headers = {"X-Acs-Forwarded-By": "node-c"}
        assert (await client.post(_replay("by_b"), headers=headers)).content == b"here"
        assert here.upstream == []
        await here.storage.close()

    asyncio.run(run())


def test_a_replay_whose_node_refuses_the_connection_ejects_it_and_is_answered_here(deployment):
    async def run() -> None:
        client, here = await deployment(refuse=httpx.ConnectError)
        assert (await client.post(_replay("by_b"))).content == b"here"
        assert await here.registry.nodes_for(THEIRS.id) == []  # ejected at once
        await here.storage.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    "failure",
    [httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError],
)
def test_a_node_that_cannot_be_reached_or_cuts_before_answering_is_ejected(deployment, failure):
    """Refused, timed out, or the connection cut before any answer (the node died): the node is
    ejected and the request answered here (`model_not_found` in a real node), never a 500."""

    async def run() -> None:
        client, here = await deployment(refuse=failure)
        body = {"model": THEIRS.id, "prompt": "x"}
        answer = await client.post("/v1/completions", json=body)
        assert (answer.status_code, answer.content) == (200, b"here")
        ((path, sent),) = here.local
        assert (path, json.loads(sent)) == ("/v1/completions", body)
        assert await here.registry.nodes_for(THEIRS.id) == []
        await here.storage.close()

    asyncio.run(run())
