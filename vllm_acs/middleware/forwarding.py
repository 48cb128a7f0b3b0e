"""ForwardingMiddleware: a request for a model another node serves is answered by that node.

API server process, just inside Auth and inside the body limit: no body is read before the key
is checked, and none past the route's limit. The node that serves the model authenticates again
(the client's key travels with the request), admits, runs and settles the request, once; this
node only carries bytes both ways (streams as they come, activations included) with the client's
request id. The writing POSTs that name a model are forwarded (completions, completion jobs,
harvests, a Loom branch or score: their body's `model`; a Loom replay: the model its Node
recorded, read from the shared database) when the model is not this node's and a live node of
the deployment serves it. A connection that fails before an answer ejects that node at once
and the next one is tried; with none left the request is answered here (`400 model_not_found`).
A forwarded request is never forwarded again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from ..contract.body_validation import INLINE_LIMIT_BYTES
from ..deployment.registry import NodeRegistry
from ..metrics import FORWARDED
from ..served_model import NodeModels
from .asgi import ASGIApp, Receive, Scope, Send, header, read_body, replay_body, request_id

logger = logging.getLogger(__name__)
FORWARDED_HEADER = b"x-acs-forwarded-by"
# How long an idle connection to another node is kept: shorter than the node's own keep-alive
# (uvicorn's, VLLM_HTTP_TIMEOUT_KEEP_ALIVE: 5 s), so that it is always this side that drops it;
# a request sent on a connection the node is closing that moment would fail and eject a live node.
FORWARDING_KEEPALIVE_S = 2.0
# What a send raises when the node cannot be reached, or cut the connection before any answer
# (it died): httpx's network errors (connect, read, write), a connect timeout, and a connection
# closed with no response. That node is ejected and the next one tried.
_UNREACHABLE = (httpx.NetworkError, httpx.ConnectTimeout, httpx.RemoteProtocolError)
# The POST routes whose body's `model` says which node answers.
_ROUTES = tuple(
    re.compile(p)
    for p in (
        r"/v1/completions",
        r"/v1/completion-jobs",
        r"/v1/harvest",
        r"/v1/looms/[^/]+/nodes/[^/]+/(branch|score)",
    )
)
# A replay has no body: it regenerates with the model its Node recorded (which never changes),
# so the path names the model through the Node, read from the shared database.
_REPLAY = re.compile(r"/v1/looms/(?P<loom>[^/]+)/nodes/(?P<node>[^/]+)/replay")
# (loom id, node id) -> the model the Node's generation recorded, or None.
RecordedModel = Callable[[str, str], Awaitable[str | None]]
# Headers that belong to one hop, not to the request or answer (RFC 9110 7.6.1), and the ones
# the client of the next hop sets itself.
_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"transfer-encoding",
    b"te",
    b"trailer",
    b"upgrade",
    b"host",
    b"content-length",
}
# Headers of the serving node's answer not relayed: one hop's, and those this node's server
# writes itself.
_NOT_RELAYED = _HOP | {b"date", b"server"}


def _wanted_model(body: bytes, default: str | None) -> str | None:
    """The body's `model`; `default` when the body is an object without one."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    model = data.get("model", default)
    return model if isinstance(model, str) else None


class ForwardingMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        models: NodeModels,
        registry: NodeRegistry,
        client: httpx.AsyncClient,
        recorded_model: RecordedModel,
        *,
        default_model: str | None = None,
    ) -> None:
        self.app = app
        self.models = models
        self.registry = registry
        self.client = client
        self.recorded_model = recorded_model
        # What a body without `model` means (settings.default_model; None: this node's model).
        self.default_model = default_model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        replay = _REPLAY.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and (replay is not None or any(p.fullmatch(scope["path"]) for p in _ROUTES))
            and header(scope, FORWARDED_HEADER) is None
        ):
            await self.app(scope, receive, send)
            return
        elsewhere = {
            n.model.id for n in await self.registry.live() if n.id != self.registry.node_id
        } - {m.id for m in self.models.all()}
        if not elsewhere:  # nothing to forward to: the body is not even read here
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if replay is not None:
            # Not scoped to the caller's key (it only routes): another key's Node goes to the
            # serving node, which answers 404 as this one would; a Node without a model stays.
            model = await self.recorded_model(replay["loom"], replay["node"])
        elif len(body) <= INLINE_LIMIT_BYTES:
            model = _wanted_model(body, self.default_model)
        else:  # a large body (a harvest's, up to 50 MB) is parsed off the event loop
            model = await asyncio.to_thread(_wanted_model, body, self.default_model)
        if model in elsewhere:
            for node in await self.registry.nodes_for(model):
                if await self._forward(node.address, node.id, scope, body, receive, send):
                    FORWARDED.labels(outcome="forwarded").inc()
                    return
                self.registry.eject(node.id)
                FORWARDED.labels(outcome="ejected").inc()
        await self.app(scope, replay_body(body, receive), send)

    async def _forward(
        self, address: str, node_id: str, scope: Scope, body: bytes, receive: Receive, send: Send
    ) -> bool:
        """True once an answer came from the node (whatever its status); False when it could
        not be reached (nothing was sent to the client)."""
        url = address.rstrip("/") + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() not in _HOP]
        headers.append((FORWARDED_HEADER, self.registry.node_id.encode("latin-1")))
        if header(scope, b"accept-encoding") is None:
            # The answer's bytes are relayed as they come: without this, httpx's own default
            # (gzip, ...) would bring a compressed body to a client that did not ask for one.
            headers.append((b"accept-encoding", b"identity"))
        rid = request_id(scope)
        if rid:
            headers = [(k, v) for k, v in headers if k.lower() != b"x-request-id"]
            headers.append((b"x-request-id", rid.encode("latin-1")))
        request = self.client.build_request(
            "POST",
            url,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
            content=body,
        )
        try:
            response = await self.client.send(request, stream=True)
        except _UNREACHABLE as error:
            logger.warning("forwarding to node %s (%s) failed: %r", node_id, address, error)
            return False
        try:
            await self._relay(response, receive, send)
        finally:
            await response.aclose()
        return True

    async def _relay(self, response: httpx.Response, receive: Receive, send: Send) -> None:
        kept = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in response.headers.multi_items()
            if k.lower().encode("latin-1") not in _NOT_RELAYED
        ]
        await send({"type": "http.response.start", "status": response.status_code, "headers": kept})
        streaming = response.headers.get("content-type", "").startswith("text/event-stream")
        left = asyncio.create_task(_disconnected(receive))
        try:
            async for chunk in _until(response.aiter_raw(), left):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (httpx.HTTPError, OSError) as error:
            # The serving node went away mid-answer: a stream ends with an error frame.
            logger.warning("the forwarded answer was cut: %r", error)
            if streaming:
                frame = {
                    "error": {
                        "message": "The node serving this model stopped mid-answer.",
                        "type": "server_error",
                        "code": "upstream_error",
                    }
                }
                data = b"data: " + json.dumps(frame).encode() + b"\n\n"
                await send({"type": "http.response.body", "body": data, "more_body": True})
        finally:
            left.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _until(chunks: Any, left: asyncio.Task[None]) -> Any:
    """The chunks until the client leaves (then the upstream answer is closed: its node
    aborts the request as for any client that leaves)."""
    iterator = chunks.__aiter__()
    while True:
        step = asyncio.ensure_future(iterator.__anext__())
        done, _ = await asyncio.wait({step, left}, return_when=asyncio.FIRST_COMPLETED)
        if left in done:
            step.cancel()
            with contextlib.suppress(BaseException):
                await step
            return
        try:
            yield step.result()
        except StopAsyncIteration:
            return
