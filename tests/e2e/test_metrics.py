"""The plugin's series in vLLM's `/metrics`, read with prometheus_client's own parser.

Admitted, queued, refused, captured, steered and unknown-route requests on the session's server:
each series moves by exactly what the test sent (the suite's requests run one test at a time),
the waiting gauge shows the queued request while it waits, and no label carries a key, a prompt
or a request id.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.access_load import BODY
from tests.slot_holder import holding_stream
from vllm_acs.client import encode_vector

pytestmark = pytest.mark.e2e

HIDDEN = 128
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(base_url: str) -> tuple[Samples, str]:
    response = httpx.get(f"{base_url}/metrics", timeout=30)
    assert response.status_code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, response.text


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_the_plugin_series_count_what_was_sent(acs_server):
    base = acs_server.base_url
    key = acs_server.create_key("metrics-lab", "--max-running", "1", "--max-waiting", "4")
    broke = acs_server.create_key("metrics-broke", "--monthly-tokens", "2")
    auth = {"Authorization": f"Bearer {key}"}

    def idle() -> bool:
        samples, _ = scrape(base)
        return all(
            value(samples, name) == 0
            for name in (
                "acs_running_requests",
                "acs_waiting_requests",
                "acs_tokens_held",
                "acs_running_jobs",
            )
        )

    until(idle, "the node has nothing in flight before the test")
    before, _ = scrape(base)
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=base, headers=auth, timeout=120) as client:
        answers += [client.post("/v1/completions", json=BODY) for _ in range(2)]
        # One stream holds the key's only slot; a second request queues behind it.
        queued: list[httpx.Response] = []
        with holding_stream(base, auth, BODY):
            waiter = threading.Thread(
                target=lambda: queued.append(client.post("/v1/completions", json=BODY))
            )
            waiter.start()
            seen: list[tuple[float, float, float]] = []  # (running, waiting, when)

            def one_waits() -> bool:
                started = time.monotonic()
                samples = scrape(base)[0]
                running = value(samples, "acs_running_requests")
                seen.append((running, value(samples, "acs_waiting_requests"), started))
                return seen[-1][1] == 1

            try:
                until(one_waits, "the queued request shows in acs_waiting_requests")
            except AssertionError as error:
                raise AssertionError(f"{error}; (running, waiting, at) seen: {seen}") from None
            assert seen[-1][:2] == (1, 1), seen
        waiter.join(timeout=120)
        answers += queued
        refused = httpx.post(
            f"{base}/v1/completions", json=BODY, headers={"Authorization": f"Bearer {broke}"}
        )
        captured = client.post("/v1/completions", json={**BODY, "output_residual_stream": [1]})
        steer = {"activations": encode_vector(np.ones((1, HIDDEN))), "layer_indices": [1]}
        steered = client.post("/v1/completions", json={**BODY, "apply_steering_vectors": [steer]})
        answers += [captured, steered]
        unknown = client.get("/no/such/route")
    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers]
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    assert unknown.status_code == 404

    until(idle, "every request settled")
    after, text = scrape(base)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    completions = {"route": "/v1/completions", "method": "POST"}
    assert delta("acs_requests_total", **completions, status="200", code="") == 6
    assert delta("acs_requests_total", **completions, status="429", code="budget_exceeded") == 1
    unknown_route = {"route": "other", "method": "GET", "status": "404", "code": "not_found"}
    assert delta("acs_requests_total", **unknown_route) == 1
    assert delta("acs_admissions_total", outcome="admitted") == 5  # 2 + stream + capture + steer
    assert delta("acs_admissions_total", outcome="queued") == 1
    assert delta("acs_admissions_total", outcome="budget_exceeded") == 1
    assert delta("acs_validation_seconds_count") == 7
    assert delta("acs_activation_requests_total", kind="capture") == 1
    assert delta("acs_activation_requests_total", kind="steering") == 1
    usage = captured.json()["usage"]
    rows = usage["prompt_tokens"] + usage["completion_tokens"] - 1
    assert delta("acs_capture_rows_total") == rows
    assert delta("acs_capture_bytes_total") == rows * 1 * HIDDEN * 2
    prompt_tokens = usage["prompt_tokens"]
    assert delta("acs_tokens_settled_total", kind="prompt") == 6 * prompt_tokens
    known = sum(a.json()["usage"]["completion_tokens"] for a in answers)
    assert delta("acs_tokens_settled_total", kind="completion") >= known + 1  # + the cut stream
    # Labels never carry a key, its prefix, a prompt or a request id.
    for secret in (key, key[:15], broke, BODY["prompt"], captured.headers["x-request-id"]):
        assert secret not in text
