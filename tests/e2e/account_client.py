"""A researcher's side of /v1/usage and /v1/keys in e2e tests: a client per key, the usage once
settled, and the ledger the operator's `vllm-acs usage` reads. Every wait has a bound."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import httpx

from tests.harness import ServerProcess


def client_for(server: ServerProcess, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )


def ledger_of(server: ServerProcess, key_prefix: str) -> dict[str, int]:
    """This month's rows of one key as the operator's `vllm-acs usage` sums them."""
    month = datetime.now(timezone.utc).strftime("%Y-%m")
    rows = server.cli("usage", "--month", month)["per_key_model_month"]
    mine = [r for r in rows if r["key_prefix"] == key_prefix]
    return {
        "prompt_tokens": sum(r["prompt_tokens"] for r in mine),
        "completion_tokens": sum(r["completion_tokens"] for r in mine),
        "requests": sum(r["requests"] for r in mine),
    }


def budgets(usage: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["name"]: b for b in usage["budgets"]}


def settled_usage(client: httpx.Client, deadline_s: float = 30) -> dict[str, Any]:
    """GET /v1/usage once nothing is held any more (every request settled)."""
    deadline = time.monotonic() + deadline_s
    while True:
        answer = client.get("/v1/usage")
        assert answer.status_code == 200, answer.text
        usage = answer.json()
        if all(not b["held"] for b in usage["budgets"]) or time.monotonic() > deadline:
            return usage
        time.sleep(0.2)


def usage_matching_ledger(
    server: ServerProcess, client: httpx.Client, prefix: str
) -> tuple[dict[str, Any], dict[str, int]]:
    """The usage and the ledger once they agree (the ledger writes rows in batches, off the
    response path), or the last pair seen when the deadline passes. `key_monthly` must be one
    of the key's budgets."""
    deadline = time.monotonic() + 30
    while True:
        usage, ledger = settled_usage(client), ledger_of(server, prefix)
        total = ledger["prompt_tokens"] + ledger["completion_tokens"]
        # The per-day figures are the ledger's rows, which trail the counters by the ledger's
        # write (tens of milliseconds): both must have caught up.
        days = sum(d["prompt_tokens"] + d["completion_tokens"] for d in usage["days"])
        caught_up = budgets(usage)["key_monthly"]["spent"] == total == days
        if caught_up or time.monotonic() > deadline:
            return usage, ledger
        time.sleep(0.2)
