"""ModelRoutingMiddleware: short id → checkpoint in the body that reaches vLLM."""

from __future__ import annotations

import asyncio
import json

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from vllm_acs.middleware.model_routing import ModelRoutingMiddleware
from vllm_acs.served_model import NodeModels, ServedModel


async def _echo_body(request: Request) -> JSONResponse:
    raw = await request.body()
    return JSONResponse(
        {"body": raw.decode(), "length": request.headers.get("content-length"), "raw": len(raw)}
    )


def _post(path: str, content: bytes) -> dict:
    models = NodeModels()
    models.register(
        ServedModel(
            id="tiny",
            checkpoint="org/tiny-ckpt",
            max_model_len=2048,
            max_logprobs=100,
            gpu_shape="cpu",
            full_vocab_max_prompt_tokens=256,
        )
    )
    app = Starlette(routes=[Route(path, _echo_body, methods=["POST"])])
    transport = httpx.ASGITransport(app=ModelRoutingMiddleware(app, models=models))

    async def call() -> dict:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.post(path, content=content)).json()

    return asyncio.run(call())


def test_short_id_becomes_the_checkpoint():
    out = _post("/v1/completions", b'{"model": "tiny", "prompt": "x"}')
    assert json.loads(out["body"]) == {"model": "org/tiny-ckpt", "prompt": "x"}
    assert int(out["length"]) == out["raw"]


def test_omitted_model_becomes_the_default():
    out = _post("/v1/completions", b'{"prompt": "x"}')
    assert json.loads(out["body"])["model"] == "org/tiny-ckpt"


def test_unknown_model_and_non_json_pass_unchanged():
    for content in (b'{"model": "other", "prompt": "x"}', b"not json", b"[1, 2]"):
        assert _post("/v1/completions", content)["body"] == content.decode()


def test_other_paths_are_untouched():
    content = b'{"model": "tiny"}'
    assert _post("/v1/other", content)["body"] == content.decode()
