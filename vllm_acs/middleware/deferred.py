"""DeferredMiddleware: a middleware whose parts exist only once the engine is up (storage).

API server process. vLLM attaches middleware before the engine is ready and initializes the
plugin's state after; this builds the real middleware on the first request, from a factory that
reads what `init_state` opened. Without it a middleware would need a half-built object.
"""

from __future__ import annotations

from collections.abc import Callable

from .asgi import ASGIApp, Receive, Scope, Send


class DeferredMiddleware:
    def __init__(self, app: ASGIApp, build: Callable[[ASGIApp], ASGIApp]) -> None:
        self.app = app
        self.build = build
        self._inner: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._inner is None:
            # Not on lifespan events: they may come before the engine state is there.
            if scope["type"] not in ("http", "websocket"):
                await self.app(scope, receive, send)
                return
            self._inner = self.build(self.app)
        await self._inner(scope, receive, send)
