"""What the console's and the application form's tests share: an admin key (made as an
operator makes the first one, with the CLI), an application sent from a given client address,
and the admin routes with their path parameters filled in."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.harness import ServerProcess
from vllm_acs.contract.routes import PUBLIC_V1_ROUTES

ANSWERS = {
    "name": "Ada Researcher",
    "affiliation": "Example Lab",
    "intended_use": "Probing the residual stream of a small model for a paper.",
}


def admin_key(server: ServerProcess, account: str = "operators") -> str:
    """`vllm-acs keys create --account operators --scopes admin`: the only way to make one."""
    return server.create_key(account, "--scopes", "admin")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def apply(server: ServerProcess, address: str, **answers: Any) -> httpx.Response:
    """POST /v1/applications as a client at `address` (the node trusts loopback's
    X-Forwarded-For, as behind a proxy on the same host), without a key."""
    body = {**ANSWERS, "email": f"{uuid.uuid4().hex[:10]}@lab.example", **answers}
    return httpx.post(
        f"{server.base_url}/v1/applications",
        json=body,
        headers={"X-Forwarded-For": address},
        timeout=60,
    )


def claim(server: ServerProcess, code: str) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/applications/claim", json={"claim_code": code}, timeout=60
    )


def admin_operations() -> list[tuple[str, str]]:
    """Every (method, path) of /v1/admin, path parameters filled with made-up ids."""
    filled = {
        "{application_id}": "app_0000",
        "{account_id}": "acct_0000",
        "{key_id}": "key_0000",
    }
    operations = []
    for route in PUBLIC_V1_ROUTES:
        if not route.template.startswith("/v1/admin"):
            continue
        path = route.template
        for name, value in filled.items():
            path = path.replace(name, value)
        operations.extend((method, path) for method in sorted(route.methods))
    return operations
