"""`vllm-acs accounts|keys|usage|db` as an operator runs them: subprocesses, `--json`, both
databases, while a node (here: storage opened in this process) uses the same database."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.storage.helpers import settings_for
from vllm_acs.auth.key_auth import KeyAuthPlugin
from vllm_acs.errors import AcsError
from vllm_acs.storage import open_storage
from vllm_acs.storage.api_key_secret import looks_like_secret
from vllm_acs.storage.migrate import head_revision
from vllm_acs.storage.usage import UsageRow


def _cli(url: str, home: Path, *args: str, ok: bool = True) -> Any:
    env = {**os.environ, "VLLM_ACS_DATABASE_URL": url, "VLLM_ACS_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-m", "vllm_acs.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if not ok:
        assert done.returncode == 1, done.stderr
        return done.stderr
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if "--json" in args else done.stdout


def test_operator_commands_against_a_live_database(database_url: str, tmp_path: Path):
    assert _cli(database_url, tmp_path, "db", "upgrade", "--json") == {"revision": head_revision()}

    async def live() -> None:
        # The "node": opened before the keys exist, kept open while the CLI changes things.
        storage = await open_storage(settings_for(database_url))
        plugin = KeyAuthPlugin(storage.keys, storage.settings)
        try:
            account = _cli(database_url, tmp_path, "accounts", "create", "lab", "--json")
            assert account["status"] == "pending"
            assert (
                _cli(database_url, tmp_path, "accounts", "approve", "lab", "--json")["status"]
                == "approved"
            )
            created = _cli(
                database_url,
                tmp_path,
                "keys",
                "create",
                "--account",
                "lab",
                "--monthly-tokens",
                "1000",
                "--daily-tokens",
                "100",
                "--max-running",
                "4",
                "--monthly-activations",
                "5",
                "--scopes",
                "completions,jobs",
                "--json",
            )
            assert looks_like_secret(created["key"]) and created["key"].startswith(
                created["prefix"]
            )
            assert created["id"].startswith("key_") and created["monthly_tokens"] == 1000
            headers = {"authorization": f"Bearer {created['key']}"}
            principal = await plugin.acs_authenticate(headers)
            assert principal.limits.daily_tokens == 100 and principal.limits.max_running == 4
            assert principal.limits.monthly_activation_requests == 5
            assert principal.scopes == {"completions", "jobs"}

            listed = _cli(database_url, tmp_path, "keys", "list", "--json")
            assert [(k["id"], k["prefix"], k["state"]) for k in listed] == [
                (created["id"], created["prefix"], "active")
            ]
            assert all("key" not in k and "secret_hash" not in k for k in listed)
            assert listed[0]["monthly_activation_requests"] == 5
            assert (
                _cli(database_url, tmp_path, "keys", "pause", created["prefix"], "--json")["state"]
                == "paused"
            )
            with pytest.raises(AcsError) as refused:  # a paused key does not authenticate
                await plugin.acs_authenticate(headers)
            assert refused.value.code == "key_disabled"
            _cli(database_url, tmp_path, "keys", "resume", created["id"])
            changed = _cli(
                database_url,
                tmp_path,
                "keys",
                "set",
                created["id"],
                "--daily-tokens",
                "none",
                "--starts-per-minute",
                "5",
                "--monthly-activations",
                "none",
                "--json",
            )
            assert changed["daily_tokens"] is None and changed["starts_per_minute"] == 5
            assert changed["monthly_activation_requests"] is None
            assert changed["monthly_tokens"] == 1000
            principal = await plugin.acs_authenticate(headers)
            assert principal.limits.daily_tokens is None
            assert principal.limits.monthly_activation_requests is None

            storage.ledger.record(
                UsageRow(
                    route="/v1/completions",
                    status=200,
                    latency_ms=2,
                    prompt_tokens=3,
                    completion_tokens=4,
                    key_id=created["id"],
                    key_prefix=created["prefix"],
                    account_id=account["id"],
                    model="tiny",
                )
            )
            await storage.ledger.flush(10)
            usage = _cli(database_url, tmp_path, "usage", "--json")
            (row,) = usage["per_key_model_month"]
            assert (row["key_prefix"], row["model"], row["total_tokens"]) == (
                created["prefix"],
                "tiny",
                7,
            )
            assert usage["per_account_month"][0]["total_tokens"] == 7
            assert "lab" in _cli(database_url, tmp_path, "accounts", "list")

            for action in ("spend-cap", "lift-cap", "suspend"):
                _cli(database_url, tmp_path, "accounts", action, account["id"])
            assert _cli(database_url, tmp_path, "accounts", "list", "--json")[0]["status"] == (
                "suspended"
            )
            _cli(database_url, tmp_path, "keys", "revoke", created["prefix"])
            refusal = _cli(database_url, tmp_path, "keys", "resume", created["prefix"], ok=False)
            assert "revoked" in refusal
            assert "no key" in _cli(database_url, tmp_path, "keys", "pause", "nope", ok=False)
        finally:
            await storage.close()

    asyncio.run(live())
