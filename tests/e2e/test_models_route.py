"""GET /v1/models, /v1/models/{id} and /v1/models/{id}/status: the plugin's routes, live on
the real server."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e


def test_sdk_lists_the_short_id(openai_client, model_id):
    assert [m.id for m in openai_client.models.list()] == [model_id]


def test_models_list_has_the_spec_shape(api, model_id, checkpoint):
    response = api.get("/v1/models")
    assert response.status_code == 200
    assert response.headers["x-request-id"]
    body = response.json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == model_id
    assert card["object"] == "model"
    assert card["served_model_name"] == checkpoint
    assert card["status"] == "live"
    assert card["default"] is True
    assert card["gpu_shape"] == "cpu-test"  # VLLM_ACS_GPU_SHAPE set by the fixture
    assert card["capabilities"] == {
        "max_model_len": 2048,
        "max_logprobs": 100,
        "logprobs": True,
        "prompt_logprobs": True,
        "prompt_logprobs_full_vocab": True,
        "full_vocab_max_prompt_tokens": 256,
        "activations": True,
        "max_activation_prompt_tokens": 2048,
        "chat_template": None,
    }


def test_one_model_by_id(api, model_id):
    response = api.get(f"/v1/models/{model_id}")
    assert response.status_code == 200
    assert response.json() == api.get("/v1/models").json()["data"][0]


def test_unknown_model_id_is_a_404_in_the_envelope(api):
    response = api.get("/v1/models/llama-999b", headers={"X-Request-Id": "req-models-1"})
    assert response.status_code == 404
    assert response.headers["x-request-id"] == "req-models-1"
    assert response.json() == {
        "error": {
            "message": "The model 'llama-999b' does not exist.",
            "type": "invalid_request_error",
            "param": "model_id",
            "code": "model_not_found",
        },
        "request_id": "req-models-1",
    }


def test_request_id_invalid_is_replaced(api):
    response = api.get("/v1/models", headers={"X-Request-Id": "bad id with spaces"})
    rid = response.headers["x-request-id"]
    assert rid != "bad id with spaces"
    assert 1 <= len(rid) <= 64


def test_status_of_the_served_model_is_warm_on_its_one_node(api, model_id):
    # The session node runs the embedded default (SQLite, no Redis): it counts itself.
    response = api.get(f"/v1/models/{model_id}/status", headers={"X-Request-Id": "req-status-1"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "req-status-1"
    assert response.json() == {"id": model_id, "warm": True, "nodes": 1}
    head = api.head(f"/v1/models/{model_id}/status")
    assert (head.status_code, head.content) == (200, b"")


def test_status_of_an_unknown_model_is_the_same_404_as_the_model(api):
    response = api.get("/v1/models/llama-999b/status", headers={"X-Request-Id": "req-status-2"})
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "The model 'llama-999b' does not exist.",
            "type": "invalid_request_error",
            "param": "model_id",
            "code": "model_not_found",
        },
        "request_id": "req-status-2",
    }
    same = api.get("/v1/models/llama-999b", headers={"X-Request-Id": "req-status-2"})
    assert (same.status_code, same.json()) == (404, response.json())


def test_status_needs_a_key(acs_server, model_id):
    url = f"{acs_server.base_url}/v1/models/{model_id}/status"
    for headers, code in (
        ({}, "missing_authorization"),
        ({"Authorization": "Bearer acs-bm-not-a-real-key"}, "invalid_api_key"),
    ):
        response = httpx.get(url, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == code
