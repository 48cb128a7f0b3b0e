"""ModelRoutingMiddleware: turns the short model id a client sends into the checkpoint vLLM serves.

API server process, just in front of vLLM's completion route (the architecture's Rewrite stage).
`model` omitted means the default model. Ids it does not know pass through unchanged; the strict
validation stage in front of it is where an unknown id becomes `400 model_not_found`.
"""

from __future__ import annotations

import json

from ..served_model import NodeModels
from .asgi import ASGIApp, Receive, Scope, Send, read_body, replay_body, with_header

ROUTED_PATHS = frozenset({"/v1/completions"})


class ModelRoutingMiddleware:
    def __init__(self, app: ASGIApp, models: NodeModels) -> None:
        self.app = app
        self.models = models

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in ROUTED_PATHS
        ):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        routed = self._route(body)
        if routed is not None:
            body = routed
            scope = with_header(scope, b"content-length", str(len(body)).encode())
        await self.app(scope, replay_body(body, receive), send)

    def _route(self, body: bytes) -> bytes | None:
        """The body with `model` set to the checkpoint, or None to leave the body untouched."""
        try:
            request = json.loads(body)
        except ValueError:
            return None
        if not isinstance(request, dict):
            return None
        wanted = request.get("model")
        if wanted is None:
            served = self.models.default()
        elif isinstance(wanted, str):
            served = self.models.get(wanted)
        else:
            return None
        if served is None:
            return None
        request["model"] = served.checkpoint
        return json.dumps(request).encode()
