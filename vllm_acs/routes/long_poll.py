"""The `?wait=` query parameter of long-poll reads (a harvest, a completion job), and its docs.

API server process. A read with `wait` holds its answer up to that many seconds; a node that
holds too many such reads answers at once with `X-Acs-Longpoll: declined` and `Retry-After`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ..errors import InvalidRequest

LONG_POLL_MAX_S = 60
# What a declined long-poll answers: poll again after this long.
DECLINED_RETRY_S = 3
DECLINED_HEADERS = {"x-acs-longpoll": "declined", "retry-after": str(DECLINED_RETRY_S)}


def wait_seconds(request: Request) -> int | None:
    """The read's `wait` (whole seconds, 0 to LONG_POLL_MAX_S); None when it has none."""
    raw = request.query_params.get("wait")
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) > LONG_POLL_MAX_S:
        raise InvalidRequest(
            f"wait must be a whole number of seconds from 0 to {LONG_POLL_MAX_S}.", param="wait"
        )
    return int(raw)


def wait_param(description: str) -> dict[str, Any]:
    """The OpenAPI parameter of `wait` on one read."""
    return {
        "name": "wait",
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": "integer", "minimum": 0, "maximum": LONG_POLL_MAX_S},
    }
