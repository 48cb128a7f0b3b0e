"""An in-process stand-in for the server's pipeline around Auth and Admission (unit tests only).

`FakeValidation` plays StrictValidation (prompt tokens = words), `fake_engine` plays vLLM's
/v1/completions (answers what the ValidatedCompletion allows, streamed or not). The real pieces
under test are AuthMiddleware, AdmissionMiddleware, the key plugin, storage and the ledger.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from vllm_acs.auth.key_auth import KeyAuthPlugin
from vllm_acs.auth.principal import PRINCIPAL_STATE_KEY
from vllm_acs.contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from vllm_acs.middleware.admission import AdmissionMiddleware
from vllm_acs.middleware.asgi import (
    ASGIApp,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    replay_body,
)
from vllm_acs.middleware.auth import AuthMiddleware
from vllm_acs.middleware.request_id import RequestIdMiddleware
from vllm_acs.middleware.strict_validation import may_clamp_to_budget
from vllm_acs.plugins import build_plugin_manager
from vllm_acs.served_model import ServedModel
from vllm_acs.storage import Storage

T = TypeVar("T")
U = TypeVar("U")

MODEL = ServedModel(
    id="tiny",
    checkpoint="acs/tiny",
    max_model_len=2048,
    max_logprobs=20,
    gpu_shape="cpu",
    full_vocab_max_prompt_tokens=256,
)


class FakeValidation:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        data = json.loads(body)
        prompts = data["prompt"] if isinstance(data["prompt"], list) else [data["prompt"]]
        scope.setdefault("state", {})[VALIDATED_COMPLETION_KEY] = ValidatedCompletion(
            model=MODEL,
            fields={},
            prompt_count=len(prompts),
            prompt_tokens=sum(len(p.split()) for p in prompts),
            n=data.get("n", 1),
            max_tokens=data.get("max_tokens", 64),
            max_tokens_source="client" if "max_tokens" in data else "default",
            stream=data.get("stream", False),
            workload=data.get("workload"),
            may_clamp_to_budget=may_clamp_to_budget(header(scope, b"x-acs-budget-clamp")),
        )
        await self.app(scope, replay_body(body, receive), send)


class EngineControl:
    """Lets a test hold requests inside the fake engine and see the max_tokens it received."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0
        self.seen_max_tokens: list[int] = []


def fake_engine(control: EngineControl) -> Starlette:
    async def completions(request: Request) -> Response:
        data = await request.json()
        validated: ValidatedCompletion = request.scope["state"][VALIDATED_COMPLETION_KEY]
        control.entered += 1
        control.seen_max_tokens.append(validated.max_tokens)
        if data.get("block"):
            await control.release.wait()
        if data.get("fail"):
            return JSONResponse({"error": {"message": "engine died"}}, status_code=500)
        per_choice = min(data.get("generate", validated.max_tokens), validated.max_tokens)
        usage = {
            "prompt_tokens": validated.prompt_tokens,
            "completion_tokens": per_choice * validated.choices,
            "total_tokens": validated.prompt_tokens + per_choice * validated.choices,
        }
        if not validated.stream:
            choices = [{"index": i, "text": "x" * per_choice} for i in range(validated.choices)]
            return JSONResponse({"object": "text_completion", "choices": choices, "usage": usage})

        async def events() -> Any:
            for _ in range(per_choice):
                for i in range(validated.choices):
                    yield f"data: {json.dumps({'choices': [{'index': i, 'text': 'x'}]})}\n\n"
                await asyncio.sleep(data.get("delay", 0))
            if data.get("include_usage"):
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        principal = request.scope["state"].get(PRINCIPAL_STATE_KEY)
        return JSONResponse({"data": [], "principal": principal and principal.key_prefix})

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models),
        ]
    )


def access_stack(storage: Storage, control: EngineControl, *plugins: object) -> ASGIApp:
    manager = build_plugin_manager(
        *plugins, KeyAuthPlugin(storage.keys, storage.settings), load_entry_points=False
    )
    admission = AdmissionMiddleware(fake_engine(control), storage.counters, storage.ledger)
    return RequestIdMiddleware(AuthMiddleware(FakeValidation(admission), manager))


def _outcome(task: asyncio.Task[Any]) -> str:
    """What a finished task came to, in a line a failing test can show."""
    if task.cancelled():
        return "it was cancelled"
    error = task.exception()
    if error is not None:
        return f"it raised {error!r}"
    result = task.result()
    if hasattr(result, "status_code") and hasattr(result, "text"):  # an httpx.Response
        return f"it answered {result.status_code}: {result.text[:500]}"
    return f"it returned {result!r:.500}"


async def until(
    predicate: Callable[[], object],
    *,
    watch: asyncio.Task[Any] | None = None,
    timeout: float = 5.0,
) -> None:
    """Waits until `predicate()` (sync or async) is true, polling every 5 ms.

    Fails after `timeout` seconds, and at once, with its result, if the task `watch` (the request
    that should bring the condition about) finished before the condition held.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    name = getattr(predicate, "__name__", repr(predicate))
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if watch is not None and watch.done():
            raise AssertionError(f"the watched task finished before {name} held: {_outcome(watch)}")
        if loop.time() >= deadline:
            raise AssertionError(f"{name} did not hold within {timeout} s")
        await asyncio.sleep(0.005)


async def occupy_the_slot_and_queue_one(
    storage: Storage,
    control: EngineControl,
    key_id: str,
    running: Callable[[], Coroutine[Any, Any, T]],
    waiting: Callable[[], Coroutine[Any, Any, U]],
) -> tuple[asyncio.Task[T], asyncio.Task[U]]:
    """For a key with one running slot: starts `running` (a request the fake engine holds, sent
    with `block: true`) and waits until the engine has it, then starts `waiting` and waits until
    it is queued for the slot (slots `(1, 1)`). Returns both tasks, still pending.
    """
    first = asyncio.create_task(running())

    def engine_holds_the_first() -> bool:
        return control.entered >= 1

    await until(engine_holds_the_first, watch=first)
    second = asyncio.create_task(waiting())

    async def one_running_one_waiting() -> bool:
        return await storage.counters.slots(key_id) == (1, 1)

    await until(one_running_one_waiting, watch=second)
    return first, second
