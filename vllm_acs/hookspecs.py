"""The operator's extension points (pluggy hook specifications), one docstring each.

Imported in the API server process. Operators implement them in a package registered under the
`vllm_acs` entry-point group, marking functions with `vllm_acs.hookspecs.hookimpl`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING

import pluggy

from .auth.principal import Principal

if TYPE_CHECKING:
    from .storage.usage import UsageRow

PROJECT = "vllm_acs"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def acs_authenticate(
    headers: Mapping[str, str], method: str, path: str
) -> Principal | Awaitable[Principal | None] | None:
    """Decide who a request to a `/v1/*` route runs as.

    `headers` has lower-case names. Return a `Principal` to accept the request, None to let the next
    implementation decide, or raise a `vllm_acs.errors.AcsError` (e.g. `Unauthorized` with
    `code="invalid_api_key"`) to refuse it. May be an `async def`. The built-in API key check is
    registered with `trylast=True`, so an operator's implementation (SSO, another key store) runs
    before it; the principal's `key_id` names the counters its budgets and slots live under.
    """


@hookspec
def acs_usage_recorded(row: UsageRow) -> None:
    """Called once per usage row after it is written to the database (for billing export).

    The row holds metadata only: key prefix, account, route, model, token counts, status,
    latency, request id and workload tag; never a prompt, a completion or a key secret. Runs on the
    API server's event loop: hand slow work to a queue of your own. An exception is logged and the
    row stays written.
    """
