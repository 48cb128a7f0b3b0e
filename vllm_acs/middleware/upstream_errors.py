"""Maps an error answer that did not come from the plugin (vLLM's, the framework's) to an AcsError.

API server process. vLLM answers `{"error": {"message", "type", "code": <int>}}`; the spec wants its
own codes: `vllm_invalid_request`, `vllm_context_length`, `vllm_oom`, `vllm_engine_dead`,
`upstream_server_error`.
"""

from __future__ import annotations

from typing import Any

from ..errors import (
    AcsError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    UpstreamBusy,
    UpstreamServerError,
    VllmContextLength,
    VllmEngineDead,
    VllmInvalidRequest,
    VllmOom,
    echoed,
)

_CONTEXT_WORDS = ("context length", "maximum context", "max_model_len", "model length")


def is_acs_envelope(body: Any) -> bool:
    """Whether `body` is already the spec's envelope (the plugin's own answers are)."""
    return (
        isinstance(body, dict)
        and "request_id" in body
        and isinstance(body.get("error"), dict)
        and isinstance(body["error"].get("code"), str)
    )


def foreign_message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(body.get("detail"), str):
            return body["detail"]
    return ""


def engine_error(status: int, message: str) -> AcsError:
    """An error answer of vLLM's completion route, under the spec's code for it."""
    lowered = message.lower()
    if status < 500:
        if any(word in lowered for word in _CONTEXT_WORDS):
            return VllmContextLength(message or "The engine refused the prompt's length.")
        return VllmInvalidRequest(message or f"The engine refused the request (HTTP {status}).")
    details = {"upstream_status": status}
    if "out of memory" in lowered or "oom" in lowered.split():
        return VllmOom(
            "The inference engine ran out of memory: retry later, or with a shorter prompt, a "
            "lower max_tokens or a lower n.",
            details=details,
        )
    if "engine" in lowered and ("dead" in lowered or "encountered an issue" in lowered):
        return VllmEngineDead("The inference engine has stopped.", details=details)
    if status == 503:
        return UpstreamBusy("The inference engine is busy; retry shortly.", details=details)
    return UpstreamServerError(f"The inference engine failed (HTTP {status}).", details=details)


def framework_error(status: int, message: str, method: str, path: str) -> AcsError:
    """An error answer of a non-engine route (the framework's 404/405/400s, a bare 500)."""
    if status == 404:
        return NotFound(f"Not found: {echoed(method)} {echoed(path)}.")
    if status == 405:
        return MethodNotAllowed(f"{echoed(method)} is not allowed on {echoed(path)}.")
    if 400 <= status < 500:
        return InvalidRequest(message or f"The request was refused (HTTP {status}).")
    return InternalError()
