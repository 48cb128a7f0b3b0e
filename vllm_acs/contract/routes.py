"""The public /v1 surface: which paths exist and which methods each takes.

API server process. Anything else under /v1 is a 404 and a known path with another method a 405,
so none of vLLM's other /v1 routes (chat, responses, embeddings...) is reachable unvalidated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PublicRoute:
    pattern: re.Pattern[str]
    methods: frozenset[str]

    def matches(self, path: str) -> bool:
        return self.pattern.fullmatch(path) is not None


def _route(template: str, *methods: str) -> PublicRoute:
    regex = re.sub(r"\{[a-z_]+\}", r"[^/]+", template)
    return PublicRoute(re.compile(regex), frozenset(methods))


PUBLIC_V1_ROUTES: tuple[PublicRoute, ...] = (
    _route("/v1/completions", "POST"),
    _route("/v1/chat/completions", "POST"),  # answered 400 chat_completions_unsupported
    _route("/v1/models", "GET"),
    _route("/v1/models/{model_id}", "GET"),
)


def find_route(path: str) -> PublicRoute | None:
    return next((r for r in PUBLIC_V1_ROUTES if r.matches(path)), None)


def allowed_methods(route: PublicRoute) -> list[str]:
    """What an `Allow` header lists: the route's methods, and HEAD wherever GET is."""
    methods = set(route.methods)
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)
