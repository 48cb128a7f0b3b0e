"""The one error model: `AcsError` subclasses carry status, code and type; `error_body` writes them.

A leaf module, used in the API server process. The envelope is the spec's
`{"error": {"message", "type", "param", "code"}, "request_id": "..."}`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

# A value a client sent, repeated in an error message, is cut to this many characters: a
# 100,000-character model name or id comes back as its start and the count of what was left out.
ECHO_CHARS = 80


def echoed(value: object) -> str:
    """`value` as text for an error message, at most ECHO_CHARS of it and the count of the rest."""
    text = str(value)
    if len(text) <= ECHO_CHARS:
        return text
    return f"{text[:ECHO_CHARS]}... ({len(text) - ECHO_CHARS:,} more characters)"


class AcsError(Exception):
    """An error a client sees. Subclasses fix status, type and code; instances carry the message."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str] = "internal_error"
    # An answer a retry cannot fix says so (`x-should-retry: false`); a fixed wait, Retry-After.
    never_retry: ClassVar[bool] = False
    retry_after_s: ClassVar[int | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        # Extra fields of the error object where the spec tags some (e.g. `upstream_status`).
        self.details: dict[str, Any] = dict(details or {})
        if code is not None:
            self.code = code  # type: ignore[misc]  # per-instance refinement of the class code
        self.headers: dict[str, str] = dict(headers or {})
        if self.retry_after_s is not None:
            self.headers.setdefault("retry-after", str(self.retry_after_s))
            self.headers.setdefault("retry-after-ms", str(self.retry_after_s * 1000))
        if self.never_retry:
            self.headers.setdefault("x-should-retry", "false")


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
    never_retry = True

    def __init__(self, message: str = "The server had an internal error.", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)


class BadJson(InvalidRequest):
    code = "bad_json"


class UnknownModel(InvalidRequest):
    """A completion naming a model this deployment does not serve (400, unlike GET's 404)."""

    code = "model_not_found"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class FullVocabPromptTooLong(InvalidRequest):
    code = "full_vocab_prompt_too_long"


class ActivationPromptTooLong(InvalidRequest):
    code = "activation_prompt_too_long"


class PositionSteeringUnavailable(InvalidRequest):
    """`position_indices` with a 2-D vector: the engine would ignore the positions."""

    code = "position_steering_unavailable"


class ChatCompletionsUnsupported(InvalidRequest):
    code = "chat_completions_unsupported"


class DeadlineInfeasible(InvalidRequest):
    code = "deadline_infeasible"
    never_retry = True


class RequestTooLarge(AcsError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"
    never_retry = True


class UpstreamError(AcsError):
    """An error of the inference engine (vLLM), passed on under the spec's code for it."""

    status = 502
    type = "upstream_error"
    code = "upstream_server_error"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers["x-acs-upstream-error-kind"] = self.code
        if self.retry_after_s is None:  # an engine error without a wait is not worth retrying
            self.headers.setdefault("x-should-retry", "false")


class VllmInvalidRequest(UpstreamError):
    status = 400
    type = "invalid_request_error"
    code = "vllm_invalid_request"


class VllmContextLength(UpstreamError):
    status = 400
    type = "invalid_request_error"
    code = "vllm_context_length"


class VllmEngineDead(UpstreamError):
    code = "vllm_engine_dead"
    retry_after_s = 10


class VllmOom(UpstreamError):
    code = "vllm_oom"
    retry_after_s = 5


class UpstreamServerError(UpstreamError):
    code = "upstream_server_error"


class CaptureIncomplete(UpstreamError):
    """The workers processed fewer rows than the answer needs, or marked the capture failed."""

    code = "capture_incomplete"
    retry_after_s = 1


class CaptureRowsMissing(UpstreamError):
    """No capture at all: the workers never saw the request's payload (not retryable)."""

    code = "capture_rows_missing"


class UpstreamBusy(UpstreamServerError):
    """The engine said the request may be retried (vLLM's 503)."""

    retry_after_s = 2


class UpstreamDeadline(UpstreamError):
    """A non-streamed request that outlived the request window (`request_window_s`): the same
    request would time out again, so no Retry-After."""

    status = 504
    code = "upstream_deadline"
    never_retry = True


# Where RequestIdMiddleware keeps the request's id on `scope["state"]`: every error body carries it.
REQUEST_ID_STATE_KEY = "acs_request_id"
# `scope["state"]` key of the spec error code a request was answered with (for the metrics).
ERROR_CODE_STATE_KEY = "acs_error_code"
# A client's X-Request-Id is kept when it is whole of this (fullmatch); otherwise one is made up.
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def error_body(error: AcsError, request_id: str | None) -> dict[str, Any]:
    """The JSON body of an error answer."""
    return {
        "error": {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.code,
            **error.details,
        },
        "request_id": request_id,
    }


class Unauthorized(AcsError):
    """401: no usable credentials. `code` is one of the spec's 401 codes."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ScopeDenied(AcsError):
    status = 403
    type = "permission_error"
    code = "scope_denied"


class BudgetExceeded(AcsError):
    """429 a retry cannot fix: no Retry-After, `x-should-retry: false`; names the budget."""

    status = 429
    type = "rate_limit_error"
    code = "budget_exceeded"
    never_retry = True


class ActivationQuotaExceeded(AcsError):
    """429 a retry cannot fix this month: the key's activation requests are used up."""

    status = 429
    type = "rate_limit_error"
    code = "activation_quota_exceeded"
    never_retry = True

    def __init__(
        self,
        message: str = (
            "Monthly activation-request quota exhausted for this API key; it resets at the "
            "start of next month, UTC."
        ),
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)


class SpendCap(AcsError):
    status = 429
    type = "rate_limit_error"
    code = "spend_cap"
    never_retry = True
    retry_after_s = 3600

    def __init__(
        self, message: str = "This account is paused by the operator (spend cap).", **kwargs: Any
    ) -> None:
        super().__init__(message, **kwargs)


class TrafficLimited(AcsError):
    """429 queue_full or rate_limited: retryable after `retry_after_ms`."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_ms: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        retry_after_ms = max(1, retry_after_ms)
        self.headers.setdefault("retry-after", str(-(-retry_after_ms // 1000)))
        self.headers.setdefault("retry-after-ms", str(retry_after_ms))


class JobNotFound(NotFound):
    """A job id this key does not own (another key's job is a 404 too, never a 403)."""

    code = "job_not_found"


class JobNotCancellable(AcsError):
    """DELETE of a job that has already ended; the message names its status."""

    status = 409
    type = "invalid_request_error"
    code = "job_not_cancellable"
    never_retry = True


class JobCapacity(AcsError):
    status = 429
    type = "rate_limit_error"
    code = "job_capacity"
    never_retry = True


class IdempotencyConflict(AcsError):
    """The Idempotency-Key was used before with another body."""

    status = 409
    type = "invalid_request_error"
    code = "idempotency_conflict"
    never_retry = True


class IdempotencyRunning(AcsError):
    """The first request with this Idempotency-Key has not answered yet."""

    status = 409
    type = "invalid_request_error"
    code = "running"
    retry_after_s = 1


class IdempotencyNoAnswer(AcsError):
    """The first request with this Idempotency-Key ended without an answer to replay."""

    status = 409
    type = "invalid_request_error"
    code = "no_answer"
    never_retry = True


class JobAttemptsExhausted(AcsError):
    """A job whose every run ended with its process gone (its lease expired each time)."""

    status = 500
    type = "server_error"
    code = "job_attempts_exhausted"
    never_retry = True


class HarvestNotFound(NotFound):
    """A harvest id this key does not own (another key's harvest is a 404 too)."""

    code = "harvest_job_not_found"


class HarvestNotCancellable(AcsError):
    """DELETE of a harvest that has already ended; the message names its status."""

    status = 409
    type = "invalid_request_error"
    code = "harvest_not_cancellable"
    never_retry = True


class HarvestUnsupported(InvalidRequest):
    """The model cannot be harvested on this node (no capture hooks, or no layers to read)."""

    code = "harvest_unsupported"


class HarvestConcurrency(AcsError):
    """The key has a harvest that has not ended: one at a time per key."""

    status = 429
    type = "rate_limit_error"
    code = "harvest_concurrency_exceeded"
    retry_after_s = 30


class HarvestQuota(AcsError):
    """The key's harvests for this UTC month are used up."""

    status = 429
    type = "rate_limit_error"
    code = "harvest_quota_exceeded"
    never_retry = True


class HarvestCapacity(AcsError):
    """The deployment has as many harvests not ended as it takes."""

    status = 429
    type = "rate_limit_error"
    code = "harvest_capacity_exceeded"
    retry_after_s = 60


class DownloadRefused(AcsError):
    """A download URL that is expired, unsigned or altered."""

    status = 403
    type = "permission_error"
    code = "download_url_invalid"
    never_retry = True


class RequestedRangeInvalid(AcsError):
    """A download's Range header that is not one satisfiable range of bytes."""

    status = 416
    type = "invalid_request_error"
    code = "range_not_satisfiable"
    never_retry = True

    def __init__(self, message: str, size: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers.setdefault("content-range", f"bytes */{size}")


class LoomNotFound(NotFound):
    """A Loom id this key does not own (another key's Loom is a 404 too, never a 403)."""

    code = "loom_not_found"


class LoomNodeNotFound(NotFound):
    """A Node id that is not in the Loom."""

    code = "loom_node_not_found"


class LoomNodeConflict(AcsError):
    """An operation the Node's status (or place: the root) forbids; the message names it."""

    status = 409
    type = "invalid_request_error"
    code = "loom_node_conflict"
    never_retry = True


class LoomNodeLimit(AcsError):
    """The change would give the Loom more Nodes than the operator allows."""

    status = 409
    type = "invalid_request_error"
    code = "loom_node_limit"
    never_retry = True


class LoomCapacity(AcsError):
    """The key has as many Looms as it may have."""

    status = 429
    type = "rate_limit_error"
    code = "loom_capacity"
    never_retry = True


class LoomFileInvalid(InvalidRequest):
    """An import file that cannot become a Loom (malformed, cyclic, over a limit)."""

    code = "loom_file_invalid"


class DatabaseUnavailable(AcsError):
    """The shared database did not answer in time (unreachable, or its pool is used up)."""

    status = 503
    type = "server_error"
    code = "db_pool_exhausted"
    retry_after_s = 2


class CountersUnavailable(AcsError):
    """The shared counters (Redis) did not answer: nothing is admitted until they do, so no
    key's limits or budgets can be passed meanwhile."""

    status = 503
    type = "server_error"
    code = "circuit_open"
    retry_after_s = 2


class HarvestUnavailable(AcsError):
    """The object store of the harvest files did not answer (the spec's `harvest_unavailable`:
    the harvest side of the deployment is not reachable right now)."""

    status = 503
    type = "server_error"
    code = "harvest_unavailable"
    retry_after_s = 2


class KeyNotFound(NotFound):
    """A key id that is not of the caller's account (another account's key is a 404 too)."""

    code = "key_not_found"


class KeyNotChangeable(AcsError):
    """A change of a revoked key: revoking is for good."""

    status = 409
    type = "invalid_request_error"
    code = "key_not_changeable"
    never_retry = True


class KeyCapacity(AcsError):
    """The account has as many live keys as it may have (`max_keys_per_account`)."""

    status = 429
    type = "rate_limit_error"
    code = "key_capacity"
    never_retry = True


class AccountNotFound(NotFound):
    """An account id or name the console does not know."""

    code = "account_not_found"


class ApplicationNotFound(NotFound):
    code = "application_not_found"


class ApplicationsClosed(NotFound):
    """The node's application form is off (`applications` closed, the default)."""

    code = "applications_closed"


class ApplicationsFull(AcsError):
    """As many applications wait for review as the operator allows (`applications_pending_cap`)."""

    status = 429
    type = "rate_limit_error"
    code = "applications_full"
    never_retry = True


class ApplicationNotPending(AcsError):
    """A decision on an application already decided, claimed or expired."""

    status = 409
    type = "invalid_request_error"
    code = "application_not_pending"
    never_retry = True


class InvalidClaimCode(AcsError):
    status = 401
    type = "authentication_error"
    code = "invalid_claim_code"


class ApplicationPending(AcsError):
    """A claim before the operator decided: the same code works once it is approved."""

    status = 409
    type = "invalid_request_error"
    code = "application_pending"


class ApplicationRejected(AcsError):
    status = 403
    type = "permission_error"
    code = "application_rejected"
    never_retry = True


class ApplicationGone(AcsError):
    """`application_expired` (not claimed in time) or `claim_code_used` (claimed already)."""

    status = 410
    type = "invalid_request_error"
    code = "application_expired"
    never_retry = True
