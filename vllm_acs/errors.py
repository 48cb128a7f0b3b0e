"""The one error model: `AcsError` subclasses carry status, code and type; `error_body` writes them.

A leaf module, used in the API server process. The envelope is the spec's
`{"error": {"message", "type", "param", "code"}, "request_id": "..."}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class AcsError(Exception):
    """An error a client sees. Subclasses fix status, type and code; instances carry the message."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str] = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code  # type: ignore[misc]  # per-instance refinement of the class code
        self.headers: dict[str, str] = dict(headers or {})


class InvalidRequest(AcsError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class NotFound(AcsError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(AcsError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class InternalError(AcsError):
    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, message: str = "The server had an internal error.", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers.setdefault("x-should-retry", "false")


def error_body(error: AcsError, request_id: str | None) -> dict[str, Any]:
    """The JSON body of an error answer."""
    return {
        "error": {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.code,
        },
        "request_id": request_id,
    }
