"""What the plugin's /v1 stack adds per completion request, against no stack, in one run.

The plugin's middleware (request id, gzip, envelope, body limit, route gate, strict validation
with the tiny model's real tokenizer, rewrite) runs in front of a stand-in for vLLM's route that
answers a fixed completion; the same stand-in alone is the baseline. Calls are interleaved so both
see the same machine noise. Run: `python -m benchmarks.validation_overhead`.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from starlette.middleware.gzip import GZipMiddleware

from vllm_acs.middleware.body_limit import BodyLimitMiddleware
from vllm_acs.middleware.completion_rewrite import CompletionRewriteMiddleware
from vllm_acs.middleware.error_envelope import ErrorEnvelopeMiddleware
from vllm_acs.middleware.request_id import RequestIdMiddleware
from vllm_acs.middleware.route_gate import RouteGateMiddleware
from vllm_acs.middleware.strict_validation import StrictValidationMiddleware
from vllm_acs.served_model import NodeModels, ServedModel
from vllm_acs.settings import Settings
from vllm_acs.tiny_model import write_tiny_model

ROUNDS = 2000
ANSWER = json.dumps(
    {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": "vllm-acs/tiny-llama",
        "choices": [{"index": 0, "text": " blue", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
    }
).encode()

BODIES = {
    "short prompt": {"model": "tiny", "prompt": "The sky is", "max_tokens": 16, "temperature": 0.7},
    "4 KB prompt": {"model": "tiny", "prompt": "The quick brown fox. " * 195, "max_tokens": 16},
    "8 prompts, n=2": {
        "model": "tiny",
        "prompt": [f"Prompt number {i} is about the sky" for i in range(8)],
        "n": 2,
        "max_tokens": 16,
        "logprobs": 5,
    },
}


async def engine_stand_in(scope, receive, send) -> None:
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": ANSWER})


def plugin_stack(models: NodeModels, settings: Settings):
    app = CompletionRewriteMiddleware(engine_stand_in)
    app = StrictValidationMiddleware(app, models=models, settings=settings)
    app = RouteGateMiddleware(app)
    app = BodyLimitMiddleware(app, limit_bytes=settings.body_limit_bytes)
    app = ErrorEnvelopeMiddleware(app)
    app = GZipMiddleware(app, minimum_size=500)
    return RequestIdMiddleware(app)


def tiny_models(model_dir: Path) -> NodeModels:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    models = NodeModels()
    models.register(
        ServedModel("tiny", "vllm-acs/tiny-llama", 2048, 100, "cpu", 256, vocab_size=1024),
        lambda text, special: tokenizer.encode(text, add_special_tokens=special),
    )
    return models


async def one_call(app, body: bytes) -> float:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(b"content-type", b"application/json"), (b"accept-encoding", b"gzip")],
        "state": {},
    }
    delivered = False
    status: list[int] = []

    async def receive():
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])

    started = time.perf_counter()
    await app(scope, receive, send)
    elapsed = time.perf_counter() - started
    assert status == [200], status
    return elapsed


async def measure() -> list[tuple[str, float, float, float, float]]:
    with tempfile.TemporaryDirectory() as directory:
        models = tiny_models(write_tiny_model(Path(directory) / "tiny"))
    stack = plugin_stack(models, Settings.load(environ={}))
    rows = []
    for name, request in BODIES.items():
        body = json.dumps(request).encode()
        plain, full = [], []
        for _ in range(ROUNDS):  # interleaved: both sides see the same noise
            plain.append(await one_call(engine_stand_in, body))
            full.append(await one_call(stack, body))
        p50_plain, p50_full = statistics.median(plain), statistics.median(full)
        p95_full = statistics.quantiles(full, n=20)[18]
        rows.append(
            (name, p50_plain * 1e6, p50_full * 1e6, (p50_full - p50_plain) * 1e6, p95_full * 1e6)
        )
    return rows


def main() -> None:
    rows = asyncio.run(measure())
    header = ("request", "no stack p50", "stack p50", "added p50", "stack p95")
    print(f"{header[0]:<16} {header[1]:>13} {header[2]:>10} {header[3]:>10} {header[4]:>10}")
    for name, plain, full, added, p95 in rows:
        print(f"{name:<16} {plain:>11.1f}us {full:>8.1f}us {added:>8.1f}us {p95:>8.1f}us")


if __name__ == "__main__":
    main()
