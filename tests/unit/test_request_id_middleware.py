"""RequestIdMiddleware on an in-process ASGI app."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from vllm_acs.middleware.request_id import RequestIdMiddleware, choose_request_id


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse(
        {"state": request.state.acs_request_id, "header": request.headers.get("x-request-id")},
        headers={"x-request-id": "from-inner-app"},
    )


def _client() -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/", _echo)])
    transport = httpx.ASGITransport(app=RequestIdMiddleware(app))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


@pytest.mark.parametrize("value", ["abc", "A-b_9", "x" * 64])
def test_valid_client_ids_are_kept(value):
    assert choose_request_id(value) == value


@pytest.mark.parametrize("value", [None, "", "x" * 65, "has space", "ü", "a.b"])
def test_invalid_client_ids_are_replaced(value):
    chosen = choose_request_id(value)
    assert chosen != value and len(chosen) == 32


async def _get(headers: dict[str, str]) -> httpx.Response:
    async with _client() as client:
        return await client.get("/", headers=headers)


def test_the_id_reaches_the_app_and_the_answer_once():
    import asyncio

    response = asyncio.run(_get({"X-Request-Id": "trace-1"}))
    assert response.headers.get_list("x-request-id") == ["trace-1"]
    assert response.json() == {"state": "trace-1", "header": "trace-1"}


def test_a_new_id_is_made_and_passed_on():
    import asyncio

    response = asyncio.run(_get({"X-Request-Id": "no good!"}))
    rid = response.headers["x-request-id"]
    assert rid != "no good!"
    assert response.json() == {"state": rid, "header": rid}
