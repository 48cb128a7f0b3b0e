"""The node's surface: which paths a client can reach at all, and with which methods.

API server process. Default deny (shared/spec/DECISIONS.md, "The node's surface"): the public
/v1 routes, `/health`, `/openapi.json` and its UI, `/metrics` and the browser Workbench unless
the operator closes them, and the vLLM routes the operator lists. Everything else, whatever vLLM
registers now or later, is a 404; a known path with another method is a 405.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

METRICS_PATH = "/metrics"
# The metrics label of every path outside the surface: a client's path never becomes a label.
OTHER_ROUTE_LABEL = "other"


@dataclass(frozen=True)
class PublicRoute:
    template: str
    pattern: re.Pattern[str]
    methods: frozenset[str]

    def matches(self, path: str) -> bool:
        return self.pattern.fullmatch(path) is not None


def template_pattern(template: str) -> re.Pattern[str]:
    """`/v1/looms/{loom_id}` as a pattern a path fully matches: each `{name}` one segment."""
    parts = re.split(r"(\{[a-z_]+\})", template)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts))


def _route(template: str, *methods: str) -> PublicRoute:
    return PublicRoute(template, template_pattern(template), frozenset(methods))


PUBLIC_V1_ROUTES: tuple[PublicRoute, ...] = (
    _route("/v1/completions", "POST"),
    _route("/v1/chat/completions", "POST"),  # answered 400 chat_completions_unsupported
    _route("/v1/models", "GET"),
    _route("/v1/models/{model_id}", "GET"),
    _route("/v1/models/{model_id}/status", "GET"),
    _route("/v1/completion-jobs", "POST"),
    _route("/v1/completion-jobs/{job_id}", "GET", "DELETE"),
    _route("/v1/completion-jobs/{job_id}/result", "GET"),
    _route("/v1/harvest", "POST"),
    _route("/v1/harvest/{job_id}", "GET", "DELETE"),
    _route("/v1/looms", "POST", "GET"),
    # Before /v1/looms/{loom_id}: `import` is no Loom id.
    _route("/v1/looms/import", "POST"),
    _route("/v1/looms/{loom_id}", "GET", "PATCH", "DELETE"),
    _route("/v1/looms/{loom_id}/export", "GET"),
    _route("/v1/looms/{loom_id}/nodes/{node_id}", "GET", "PATCH", "DELETE"),
    _route("/v1/looms/{loom_id}/nodes/{node_id}/text", "GET"),
    _route("/v1/looms/{loom_id}/nodes/{node_id}/branch", "POST"),
    _route("/v1/looms/{loom_id}/nodes/{node_id}/split", "POST"),
    _route("/v1/looms/{loom_id}/nodes/{node_id}/children", "POST"),
    _route("/v1/looms/{loom_id}/nodes/{node_id}/siblings", "POST"),
    _route("/v1/looms/{loom_id}/nodes/{node_id}/replay", "POST"),
    _route("/v1/looms/{loom_id}/nodes/{node_id}/score", "POST"),
    _route("/v1/keys", "POST", "GET"),
    _route("/v1/keys/{key_id}", "PATCH", "DELETE"),
    _route("/v1/usage", "GET"),
    # Apply for access (issue 34): the only /v1 routes that answer without a key.
    _route("/v1/applications", "POST"),
    _route("/v1/applications/form", "GET"),
    _route("/v1/applications/claim", "POST"),
    # The operator's console (the `admin` scope).
    _route("/v1/admin/applications", "GET"),
    _route("/v1/admin/applications/{application_id}/approve", "POST"),
    _route("/v1/admin/applications/{application_id}/reject", "POST"),
    _route("/v1/admin/accounts", "GET"),
    _route("/v1/admin/accounts/{account_id}", "GET", "PATCH"),
    _route("/v1/admin/keys", "GET"),
    _route("/v1/admin/keys/{key_id}", "PATCH", "DELETE"),
    _route("/v1/admin/usage", "GET"),
    _route("/v1/admin/nodes", "GET"),
    _route("/v1/admin/audit", "GET"),
)
# Outside /v1: liveness, the API's description and its browsable UI: Swagger UI from the files
# vLLM ships (`vllm-acs serve` passes --enable-offline-docs), so the page needs no other origin.
PUBLIC_NODE_ROUTES: tuple[PublicRoute, ...] = (
    _route("/health", "GET"),
    _route("/openapi.json", "GET"),
    _route("/docs", "GET"),
    _route("/docs/swagger-init.js", "GET"),
    _route("/static/swagger-ui-bundle.js", "GET"),
    _route("/static/swagger-ui.css", "GET"),
    # A harvest's files, by signed URL: the signature is the credential, not an API key.
    _route("/downloads/{job_id}/{file_name}", "GET"),
)


# The browser Workbench (routes/workbench): its page and the files it loads, no key needed to load
# them (every API call the page makes carries one). An operator closes it with `workbench=false`.
WORKBENCH_ROUTES: tuple[PublicRoute, ...] = (
    _route("/workbench", "GET"),
    _route("/workbench/", "GET"),  # redirected to /workbench
    _route("/workbench/{asset}", "GET"),
)


def find_route(path: str, *, workbench: bool = True) -> PublicRoute | None:
    routes = (*PUBLIC_V1_ROUTES, *PUBLIC_NODE_ROUTES, *(WORKBENCH_ROUTES if workbench else ()))
    return next((r for r in routes if r.matches(path)), None)


def allowed_methods(route: PublicRoute) -> list[str]:
    """What an `Allow` header lists: the route's methods, and HEAD wherever GET is."""
    methods = set(route.methods)
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


class Surface:
    """The public routes plus what the operator exposes of vLLM's own (exact paths)."""

    def __init__(
        self,
        exposed_vllm_routes: Iterable[str] = (),
        *,
        metrics: bool = True,
        workbench: bool = True,
    ) -> None:
        exposed = set(exposed_vllm_routes)
        if metrics:
            exposed.add(METRICS_PATH)
        self.exposed: frozenset[str] = frozenset(exposed)
        self.workbench = workbench

    def find(self, path: str) -> PublicRoute | None:
        """The public route that holds `path` on this node, or None (a 404)."""
        return find_route(path, workbench=self.workbench)

    def is_exposed(self, path: str) -> bool:
        """A vLLM route the operator opened: it is served as vLLM serves it, without a key."""
        return path in self.exposed

    def route_label(self, path: str) -> str:
        """The `route` label of the plugin's metrics: a template, an exposed path, or `other`."""
        if path in self.exposed:
            return path
        route = self.find(path)
        return route.template if route is not None else OTHER_ROUTE_LABEL
