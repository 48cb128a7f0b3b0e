"""AuthMiddleware with the built-in key plugin, on real SQLite storage, in process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.unit.access_stack import EngineControl, access_stack
from vllm_acs.settings import Settings
from vllm_acs.storage import open_storage


def _settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path, default_max_running=3)


def test_every_refusal_code_and_the_principal(tmp_path: Path):
    async def body() -> None:
        storage = await open_storage(_settings(tmp_path))
        try:
            control = EngineControl()
            transport = httpx.ASGITransport(app=access_stack(storage, control))
            client = httpx.AsyncClient(transport=transport, base_url="http://t")
            account = await storage.accounts.create("carol", approved=True)
            _, secret = await storage.keys.create(account.id, scopes=("jobs",))
            ok_key, ok_secret = await storage.keys.create(account.id)
            pending = await storage.accounts.create("dave")
            _, pending_secret = await storage.keys.create(pending.id)

            async def code(headers: dict[str, str], path: str = "/v1/models") -> tuple[int, str]:
                answer = await client.get(path, headers=headers)
                error = answer.json().get("error") if answer.status_code != 200 else None
                assert answer.headers["x-request-id"]
                return answer.status_code, error["code"] if error else "ok"

            bearer = {"Authorization": f"Bearer {ok_secret}"}
            assert await code({}) == (401, "missing_authorization")
            assert await code({"Authorization": "Basic abc"}) == (401, "invalid_api_key")
            assert await code({"Authorization": "Bearer acs-bm-short"}) == (401, "invalid_api_key")
            wrong = ok_secret[:-4] + ("AAAA" if not ok_secret.endswith("AAAA") else "BBBB")
            assert await code({"Authorization": f"Bearer {wrong}"}) == (401, "invalid_api_key")
            assert await code({"Authorization": f"Bearer {pending_secret}"}) == (
                401,
                "account_not_approved",
            )
            assert await code(bearer) == (200, "ok")
            assert (await client.get("/v1/models", headers=bearer)).json()["principal"] == (
                ok_key.prefix
            )
            answer = await client.post(
                "/v1/completions",
                headers={"Authorization": f"Bearer {secret}"},
                json={"prompt": "a b", "max_tokens": 2},
            )
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "scope_denied"
            assert await code({"Authorization": f"Bearer {secret}"}) == (200, "ok")

            # A pause, a revoke, a suspension count on the very next request.
            await storage.keys.set_state(ok_key.prefix, "paused")
            assert await code(bearer) == (401, "key_disabled")
            await storage.keys.set_state(ok_key.id, "active")
            assert await code(bearer) == (200, "ok")
            await storage.accounts.suspend(account.id)
            assert await code(bearer) == (401, "account_suspended")
            await storage.accounts.approve(account.id)
            await storage.keys.set_state(ok_key.id, "revoked")
            assert await code(bearer) == (401, "key_revoked")
            # Paths outside /v1 need no key.
            assert (await client.get("/health")).status_code == 404
            await client.aclose()
        finally:
            await storage.close()

    asyncio.run(body())


def test_the_principal_carries_the_keys_limits_with_defaults(tmp_path: Path):
    async def body() -> None:
        storage = await open_storage(_settings(tmp_path))
        try:
            account = await storage.accounts.create("erin", approved=True, monthly_tokens=900)
            key, secret = await storage.keys.create(account.id, daily_tokens=50, max_waiting=2)
            from vllm_acs.auth.key_auth import KeyAuthPlugin

            plugin = KeyAuthPlugin(storage.keys, storage.settings)
            principal = await plugin.acs_authenticate({"authorization": f"bearer {secret}"})
            assert principal.key_id == key.id and principal.account_id == account.id
            assert principal.key_prefix == key.prefix and secret not in repr(principal)
            limits = principal.limits
            assert (limits.daily_tokens, limits.account_monthly_tokens) == (50, 900)
            assert (limits.max_running, limits.max_waiting, limits.starts_per_minute) == (3, 2, 600)
        finally:
            await storage.close()

    asyncio.run(body())
