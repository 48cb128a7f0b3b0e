"""Auth and Admission inside the real /v1 middleware order, in process, before vLLM is wired in.

RequestId → ErrorEnvelope → BodyLimit → Auth → StrictValidation → Admission → Rewrite → a stand-in
for vLLM's route that answers with the max_tokens it received. Checks the interfaces between the
stages: the ValidatedCompletion, the clamp reaching vLLM's body and the client's header.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from vllm_acs.auth.key_auth import KeyAuthPlugin
from vllm_acs.middleware.admission import AdmissionMiddleware
from vllm_acs.middleware.auth import AuthMiddleware
from vllm_acs.middleware.body_limit import BodyLimitMiddleware
from vllm_acs.middleware.completion_rewrite import CompletionRewriteMiddleware
from vllm_acs.middleware.error_envelope import ErrorEnvelopeMiddleware
from vllm_acs.middleware.request_id import RequestIdMiddleware
from vllm_acs.middleware.strict_validation import StrictValidationMiddleware
from vllm_acs.plugins import build_plugin_manager
from vllm_acs.served_model import NodeModels, ServedModel
from vllm_acs.settings import Settings
from vllm_acs.storage import Storage, open_storage


async def vllm_stand_in(scope: Any, receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body)
    usage = {"prompt_tokens": 3, "completion_tokens": request["max_tokens"]}
    answer = json.dumps({"received": request, "choices": [], "usage": usage}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": answer})


def pipeline(storage: Storage, settings: Settings) -> Any:
    models = NodeModels()
    models.register(
        ServedModel("tiny", "vllm-acs/tiny-llama", 2048, 100, "cpu", 256, vocab_size=1024),
        lambda text, special: [1 + len(word) for word in text.split()],
    )
    manager = build_plugin_manager(KeyAuthPlugin(storage.keys, settings), load_entry_points=False)
    app = CompletionRewriteMiddleware(vllm_stand_in)
    app = AdmissionMiddleware(app, storage.counters, storage.ledger)
    app = StrictValidationMiddleware(app, models=models, settings=settings)
    app = AuthMiddleware(app, manager)
    app = BodyLimitMiddleware(app, limit_bytes=settings.body_limit_bytes)
    return RequestIdMiddleware(ErrorEnvelopeMiddleware(app))


def test_the_access_stages_in_the_real_pipeline(tmp_path: Path):
    async def body() -> None:
        settings = Settings(home=tmp_path)
        storage = await open_storage(settings)
        try:
            account = await storage.accounts.create("lab", approved=True)
            key, secret = await storage.keys.create(account.id, monthly_tokens=20)
            transport = httpx.ASGITransport(app=pipeline(storage, settings))
            auth = {"Authorization": f"Bearer {secret}", "X-Request-Id": "pipe-1"}
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                refused = await client.post("/v1/completions", json={"prompt": "x"})
                assert refused.status_code == 401
                assert refused.json()["request_id"] == refused.headers["x-request-id"]

                bad = await client.post("/v1/completions", headers=auth, json={"prompt": 1.5})
                assert bad.status_code == 400  # StrictValidation answers; nothing was held
                assert await storage.counters.slots(key.id) == (0, 0)

                ok = await client.post(
                    "/v1/completions",
                    headers=auth,
                    json={"model": "tiny", "prompt": "a b c", "max_tokens": 50},
                )
                assert ok.status_code == 200, ok.text
                assert ok.json()["received"]["max_tokens"] == 17  # 20 - 3 prompt tokens
                assert ok.json()["received"]["model"] == "vllm-acs/tiny-llama"
                assert ok.headers["x-acs-max-tokens-clamped"] == (
                    "requested=50,applied=17,reason=budget,source=client"
                )
                assert ok.headers.get_list("x-acs-max-tokens-clamped") == [
                    "requested=50,applied=17,reason=budget,source=client"
                ]

                spent = await client.post(
                    "/v1/completions",
                    headers=auth,
                    json={"model": "tiny", "prompt": "a", "max_tokens": 1},
                )
                assert spent.status_code == 429
                error = spent.json()
                assert error["error"]["code"] == "budget_exceeded"
                assert error["request_id"] == "pipe-1"
            await storage.ledger.flush(5)
            rows = sorted(
                (r["status"], r["prompt_tokens"], r["completion_tokens"])
                for r in await storage.usage.rows()
            )
            assert rows == [(200, 3, 17), (429, 0, 0)]
        finally:
            await storage.close()

    asyncio.run(body())
