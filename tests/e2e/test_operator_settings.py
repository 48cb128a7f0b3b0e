"""Operator settings reach the contract: a node started with its own numbers enforces them.

A second server (module scope) with VLLM_ACS_DEADLINE_MAX_TOKENS=8, a 2 KiB body limit, the
Workbench closed (VLLM_ACS_WORKBENCH=false) and, via --additional-config, max_logprobs 5;
everything else as the default node, vLLM's thread binding included (`auto`, where the suite's
other nodes run `nobind`): the node keeps its own threads off the core vLLM bound its worker to.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import httpx
import psutil
import pytest

from tests.harness import MODEL_ID, ServerProcess, running_server

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
            # vLLM's default, as `vllm-acs serve` leaves it (the harness sets `nobind`).
            "VLLM_CPU_OMP_THREADS_BIND": "auto",
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


def _thread_masks(process: psutil.Process) -> list[set[int]]:
    return [os.sched_getaffinity(thread.id) for thread in process.threads()]


def test_the_node_keeps_its_own_threads_off_the_workers_core(tuned_server, tuned_auth):
    api = psutil.Process(tuned_server.process.pid)
    tree = [api, *api.children(recursive=True)]
    engine_cores = [p for p in tree if p.name().startswith("VLLM::EngineCore")]
    workers = [p for p in tree if p.name().startswith("VLLM::Worker")]
    assert len(engine_cores) == 1 and len(workers) == 1, [p.name() for p in tree]
    # vLLM bound the worker's OpenMP thread (its main thread) to a core of its own.
    worker_core = os.sched_getaffinity(workers[0].pid)
    every = os.sched_getaffinity(0)
    assert worker_core < every
    for process in (api, engine_cores[0]):
        masks = _thread_masks(process)
        assert masks and all(not mask & worker_core for mask in masks), (process.name(), masks)
    assert "off the CPU workers'" in tuned_server.log_path.read_text(errors="replace")
    # And it serves.
    body = {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 2}
    assert _post(tuned_server, body, tuned_auth).status_code == 200
