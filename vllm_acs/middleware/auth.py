"""AuthMiddleware: every `/v1/*` request needs a principal; the route's scope must be granted.
The few exact paths it is given as open (the application form's) need none.

API server process, after BodyLimit and before Forwarding and StrictValidation: it reads no body,
so a request without a valid key is answered before any of its body is read. It asks the
`acs_authenticate` hooks (the built-in key check is the last of them), stores the principal on
`scope["state"]["acs_principal"]`, and answers 401 / 403 in the spec's envelope.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

import pluggy

from ..auth.principal import PRINCIPAL_STATE_KEY, REPLAY_SCOPE_KEY, Replay
from ..errors import AcsError, ScopeDenied, Unauthorized
from ..plugins import authenticate
from .asgi import ASGIApp, Receive, Scope, Send, send_error

logger = logging.getLogger(__name__)

# Path prefix -> the scope a key needs there; /v1 paths not listed need only a valid principal.
DEFAULT_ROUTE_SCOPES: Mapping[str, str] = {
    "/v1/completions": "completions",
    "/v1/completion-jobs": "jobs",
    "/v1/harvest": "harvest",
    "/v1/looms": "looms",
    # Managing the account's keys; never a default scope. /v1/usage (about the key itself) needs
    # no scope.
    "/v1/keys": "keys",
    # The operator's console; granted only by the operator's command line.
    "/v1/admin": "admin",
}


def required_scope(path: str, route_scopes: Mapping[str, str]) -> str | None:
    for prefix, needed in route_scopes.items():
        if path == prefix or path.startswith(prefix + "/"):
            return needed
    return None


class AuthMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        plugin_manager: pluggy.PluginManager,
        *,
        protected_prefix: str = "/v1/",
        route_scopes: Mapping[str, str] = DEFAULT_ROUTE_SCOPES,
        open_paths: Collection[str] = (),
    ) -> None:
        self.app = app
        self.plugin_manager = plugin_manager
        self.protected_prefix = protected_prefix
        self.route_scopes = dict(route_scopes)
        # Exact /v1 paths that answer without a key (the application form's: issue 34).
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or not path.startswith(self.protected_prefix)
            or path in self.open_paths
        ):
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())
        }
        replay = scope.get(REPLAY_SCOPE_KEY)
        try:
            if isinstance(replay, Replay):
                # Checked by the job runner that built the scope; the `jobs` scope was checked
                # when the job was submitted, and is what a job's completion needs.
                principal = replay.principal
            else:
                principal = await authenticate(
                    self.plugin_manager, headers, scope.get("method", "GET"), path
                )
            if principal is None:
                raise Unauthorized("Invalid API key.", code="invalid_api_key")
            needed = None if isinstance(replay, Replay) else required_scope(path, self.route_scopes)
            if needed is not None and needed not in principal.scopes:
                raise ScopeDenied(f"This API key does not have the `{needed}` scope.")
        except AcsError as error:
            await send_error(scope, send, error)
            return
        scope.setdefault("state", {})[PRINCIPAL_STATE_KEY] = principal
        await self.app(scope, receive, send)
