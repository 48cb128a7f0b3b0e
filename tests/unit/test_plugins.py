"""The pluggy extension points: an operator's authenticator before the key check; usage export."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import httpx

from tests.unit.access_stack import EngineControl, access_stack
from vllm_acs.auth.principal import Principal
from vllm_acs.hookspecs import hookimpl
from vllm_acs.plugins import authenticate, build_plugin_manager, notify_usage_recorded
from vllm_acs.settings import Settings
from vllm_acs.storage import open_storage
from vllm_acs.storage.usage import UsageRow


class HeaderSso:
    """An operator's SSO: trusts `X-Sso-User` (behind its proxy) and runs before the key check."""

    @hookimpl
    def acs_authenticate(self, headers: Mapping[str, str]) -> Principal | None:
        user = headers.get("x-sso-user")
        if user is None:
            return None
        return Principal(key_id=f"sso-{user}", key_prefix="sso", account_id="sso", source="sso")


class AsyncNobody:
    @hookimpl(tryfirst=True)
    async def acs_authenticate(self, path: str) -> Principal | None:
        return None  # an async implementation that declines lets the next one decide


def test_acs_authenticate_an_operator_plugin_goes_before_the_key_check(tmp_path: Path):
    async def body() -> None:
        storage = await open_storage(Settings(home=tmp_path))
        try:
            app = access_stack(storage, EngineControl(), HeaderSso(), AsyncNobody())
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                answer = await client.get("/v1/models", headers={"X-Sso-User": "ann"})
                assert answer.status_code == 200 and answer.json()["principal"] == "sso"
                # Without the SSO header the built-in key check (the default plugin) decides.
                answer = await client.get("/v1/models")
                assert answer.json()["error"]["code"] == "missing_authorization"
        finally:
            await storage.close()

    asyncio.run(body())


def test_authenticate_returns_none_when_no_plugin_decides():
    manager = build_plugin_manager(AsyncNobody(), load_entry_points=False)
    assert asyncio.run(authenticate(manager, {}, "GET", "/v1/models")) is None
    # Loading the operator's entry-point group works when nothing is registered there: the
    # manager holds exactly the built-in plugins, as without entry points.
    nobody = AsyncNobody()
    assert build_plugin_manager(load_entry_points=True).get_plugins() == set()
    assert build_plugin_manager(nobody, load_entry_points=True).get_plugins() == {nobody}


class BillingExport:
    def __init__(self) -> None:
        self.rows: list[UsageRow] = []

    @hookimpl
    def acs_usage_recorded(self, row: UsageRow) -> None:
        self.rows.append(row)


class BrokenExport:
    @hookimpl
    def acs_usage_recorded(self, row: UsageRow) -> None:
        raise RuntimeError("export down")


def test_acs_usage_recorded_sees_each_written_row(tmp_path: Path):
    export = BillingExport()
    manager = build_plugin_manager(export, BrokenExport(), load_entry_points=False)

    async def body() -> None:
        storage = await open_storage(
            Settings(home=tmp_path),
            on_usage_written=lambda row: notify_usage_recorded(manager, row),
        )
        try:
            row = UsageRow(route="/v1/completions", status=200, latency_ms=1, prompt_tokens=2)
            storage.ledger.record(row)
            await storage.ledger.flush(5)
            assert export.rows == [row]  # after the write, and despite the broken exporter
            assert len(await storage.usage.rows()) == 1  # a failing export loses nothing
        finally:
            await storage.close()

    asyncio.run(body())


def test_operator_plugins_are_found_through_the_vllm_acs_entry_point_group(
    tmp_path: Path, monkeypatch
):
    # A minimal installed distribution, as `pip install` leaves it, declaring one plugin.
    (tmp_path / "acs_demo_plugin.py").write_text(
        "from vllm_acs.hookspecs import hookimpl\n"
        "from vllm_acs.auth.principal import Principal\n\n\n"
        "@hookimpl\n"
        "def acs_authenticate(headers):\n"
        "    if headers.get('x-demo') == 'yes':\n"
        "        return Principal(key_id='demo', key_prefix='demo', account_id='demo')\n"
    )
    info = tmp_path / "acs_demo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acs-demo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vllm_acs]\ndemo = acs_demo_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    manager = build_plugin_manager(AsyncNobody())
    assert manager.get_plugin("demo") is not None
    principal = asyncio.run(authenticate(manager, {"x-demo": "yes"}, "GET", "/v1/models"))
    assert principal is not None and principal.key_id == "demo"
