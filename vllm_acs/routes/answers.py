"""What the feature routes share: a service's answer, its HTTP response, running a service call
into one, and the caller that Auth put on the request. API server process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..auth.principal import PRINCIPAL_STATE_KEY, Principal
from ..errors import AcsError, InternalError
from .error_response import error_response


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any] | str  # a str is JSON already (a stored answer, sent byte for byte)
    headers: dict[str, str]


def principal_of(request: Request) -> Principal:
    principal = getattr(request.state, PRINCIPAL_STATE_KEY, None)
    if not isinstance(principal, Principal):
        raise InternalError()
    return principal


def response_of(answer: Answer) -> Response:
    if isinstance(answer.body, str):
        return Response(
            answer.body, answer.status, headers=answer.headers, media_type="application/json"
        )
    return JSONResponse(answer.body, answer.status, headers=answer.headers)


async def answer_of(request: Request, work: Callable[[], Awaitable[Any]]) -> Response:
    """Runs a service call: its dict as JSON (200), its Answer as it says, a Response as it is,
    its error enveloped."""
    try:
        result = await work()
    except AcsError as error:
        return error_response(request, error)
    if isinstance(result, Response):
        return result
    if isinstance(result, Answer):
        return response_of(result)
    return JSONResponse(result)
