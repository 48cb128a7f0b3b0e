"""Operator settings reach the contract: a node started with its own numbers enforces them.

A second server (module scope) with VLLM_ACS_DEADLINE_MAX_TOKENS=8, a 2 KiB body limit, the
Workbench closed (VLLM_ACS_WORKBENCH=false) and, via --additional-config, max_logprobs 5;
everything else as the default node.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import ServerProcess, running_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tuned_server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    with running_server(
        tiny_model_dir,
        tmp_path_factory.mktemp("tuned-home"),
        env={
            "VLLM_ACS_DEADLINE_MAX_TOKENS": "8",
            "VLLM_ACS_BODY_LIMIT_BYTES": "2048",
            "VLLM_ACS_WORKBENCH": "false",
        },
        extra_args=["--additional-config", json.dumps({"acs": {"max_logprobs": 5}})],
    ) as server:
        yield server


@pytest.fixture(scope="module")
def tuned_auth(tuned_server) -> dict[str, str]:
    return {"Authorization": f"Bearer {tuned_server.create_key()}"}


def _post(server: ServerProcess, body: dict, auth: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", json=body, headers=auth, timeout=60)


def test_injected_default_is_clamped_to_the_deadline(tuned_server, tuned_auth):
    response = _post(tuned_server, {"prompt": "The sky is"}, tuned_auth)
    assert response.status_code == 200
    # max_model_len 2048 - 4 prompt tokens is the injected default; the deadline allows 8.
    assert response.headers["x-acs-max-tokens-clamped"] == (
        "requested=2044,applied=8,reason=deadline,source=default"
    )
    assert response.json()["usage"]["completion_tokens"] == 8


def test_streaming_keeps_the_default(tuned_server, tuned_auth):
    with httpx.stream(
        "POST",
        f"{tuned_server.base_url}/v1/completions",
        json={"prompt": "x" * 1500, "stream": True},
        headers=tuned_auth,
        timeout=120,
    ) as response:
        assert response.status_code == 200
        assert "x-acs-max-tokens-clamped" not in response.headers


def test_explicit_max_tokens_over_the_deadline(tuned_server, tuned_auth):
    response = _post(tuned_server, {"prompt": "x", "max_tokens": 9}, tuned_auth)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "deadline_infeasible"
    assert response.headers["x-should-retry"] == "false"


def test_additional_config_sets_max_logprobs(tuned_server, tuned_auth):
    card = httpx.get(f"{tuned_server.base_url}/v1/models", headers=tuned_auth).json()["data"][0]
    assert card["capabilities"]["max_logprobs"] == 5
    assert (
        _post(tuned_server, {"prompt": "x", "max_tokens": 1, "logprobs": 5}, tuned_auth).status_code
        == 200
    )
    refused = _post(tuned_server, {"prompt": "x", "max_tokens": 1, "logprobs": 6}, tuned_auth)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "logprobs"


def test_body_limit_setting(tuned_server, tuned_auth):
    response = _post(tuned_server, {"prompt": "x" * 2100, "max_tokens": 1}, tuned_auth)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_closed_workbench_is_a_404_like_any_path_off_the_surface(tuned_server):
    for path in ("/workbench", "/workbench/app.js", "/workbench/style.css"):
        closed = httpx.get(f"{tuned_server.base_url}{path}", timeout=30)
        assert closed.status_code == 404, path
        assert closed.json()["error"]["code"] == "not_found"
        assert "Content-Security-Policy" not in closed.headers
