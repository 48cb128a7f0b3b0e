"""StrictValidationMiddleware: POST /v1/completions bodies are checked against the contract first.

API server process. It reads the (already size-limited) body, answers the spec's 400s, and hands
the rest of the pipeline a `ValidatedCompletion` on `scope["state"]`; vLLM never receives a body
that failed here. Long prompts are tokenized off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import time

from ..contract.completion_rules import validate_completion
from ..contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from ..errors import AcsError, BadJson
from ..metrics import VALIDATION_SECONDS
from ..served_model import NodeModels
from ..settings import Settings
from .asgi import ASGIApp, Receive, Scope, Send, header, read_body, request_id, send_error

COMPLETIONS_PATH = "/v1/completions"
# Bodies above this are parsed and validated in a worker thread: parsing and tokenizing them
# would stall other requests.
_INLINE_LIMIT_BYTES = 16 * 1024


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
            validated = await self._validate(body, request_id(scope))
        except AcsError as error:
            VALIDATION_SECONDS.observe(time.perf_counter() - started)
            await send_error(scope, send, error)
            return
        VALIDATION_SECONDS.observe(time.perf_counter() - started)
        validated.workload = header(scope, b"x-acs-workload")
        scope.setdefault("state", {})[VALIDATED_COMPLETION_KEY] = validated
        await self.app(scope, receive, send)

    async def _validate(self, body: bytes, rid: str | None) -> ValidatedCompletion:
        if len(body) <= _INLINE_LIMIT_BYTES:
            return self._parse_and_validate(body, rid)
        return await asyncio.to_thread(self._parse_and_validate, body, rid)

    def _parse_and_validate(self, body: bytes, rid: str | None) -> ValidatedCompletion:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise BadJson("The request body is not valid JSON.") from None
        return validate_completion(data, self.models, self.settings, rid)
