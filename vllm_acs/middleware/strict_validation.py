"""StrictValidationMiddleware: POST /v1/completions bodies are checked against the contract first.

API server process. It reads the (already size-limited) body, answers the spec's 400s, and hands
the rest of the pipeline a `ValidatedCompletion` on `scope["state"]`; vLLM never receives a body
that failed here. Long prompts are tokenized off the event loop.
"""

from __future__ import annotations

import time

from ..contract.body_validation import validate_body
from ..contract.validated import VALIDATED_COMPLETION_KEY
from ..errors import AcsError, InvalidRequest
from ..metrics import VALIDATION_SECONDS
from ..served_model import NodeModels
from ..settings import Settings
from ..storage.usage import recorded_workload
from .asgi import ASGIApp, Receive, Scope, Send, header, read_body, request_id, send_error

COMPLETIONS_PATH = "/v1/completions"
BUDGET_CLAMP_HEADER = "X-Acs-Budget-Clamp"
BUDGET_CLAMP_VALUES = ("allow", "refuse")


def may_clamp_to_budget(value: str | None) -> bool:
    """`X-Acs-Budget-Clamp`: absent or `allow` lets a budget lower max_tokens; `refuse` asks for
    a 429 instead (what the Workbench sends). Anything else is a 400 naming the header."""
    if value is None or value == "allow":
        return True
    if value == "refuse":
        return False
    raise InvalidRequest(
        f"{BUDGET_CLAMP_HEADER} must be one of {', '.join(BUDGET_CLAMP_VALUES)}; got {value!r}.",
        param=BUDGET_CLAMP_HEADER,
    )


class StrictValidationMiddleware:
    def __init__(self, app: ASGIApp, models: NodeModels, settings: Settings) -> None:
        self.app = app
        self.models = models
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] == COMPLETIONS_PATH
        ):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        started = time.perf_counter()
        try:
            may_clamp = may_clamp_to_budget(header(scope, b"x-acs-budget-clamp"))
            _, validated = await validate_body(body, self.models, self.settings, request_id(scope))
        except AcsError as error:
            VALIDATION_SECONDS.observe(time.perf_counter() - started)
            await send_error(scope, send, error)
            return
        VALIDATION_SECONDS.observe(time.perf_counter() - started)
        validated.workload = recorded_workload(header(scope, b"x-acs-workload"))
        validated.may_clamp_to_budget = may_clamp
        scope.setdefault("state", {})[VALIDATED_COMPLETION_KEY] = validated
        await self.app(scope, receive, send)
