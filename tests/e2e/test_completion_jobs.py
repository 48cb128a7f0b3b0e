"""Completion jobs on the real server: submit, poll, fetch, resubmit, conflicts, failures, cancel.

The session's node (embedded SQLite, default settings), with the `openai` SDK where it can send
the request (`client.post(..., cast_to=httpx.Response)`) and httpx elsewhere. A job's completion
is a live completion: its answer equals the same body sent live, and its usage row is written
under the job's id.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.e2e.access_load import BODY
from tests.harness import ServerProcess, running_server
from vllm_acs.client import decode_residual_stream

pytestmark = pytest.mark.e2e

JOBS = "/v1/completion-jobs"
# A key that may run nothing: its jobs are tried, find no slot and go back to the queue, so
# they stay unfinished for as long as a test needs (`keys set --max-running 1` lets them run).
FROZEN = ("--max-running", "0", "--max-waiting", "0")


def until(condition: Callable[[], Any], what: str, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


# (server, key, job id) of every job the module submitted: all must end before the next module
# (whose tests count the node's requests exactly).
SUBMITTED: list[tuple[ServerProcess, str, str]] = []


@pytest.fixture(scope="module", autouse=True)
def every_job_ends() -> Iterator[None]:
    yield
    for server, key, job_id in SUBMITTED:
        if server.process is not None:  # a module's own node may be stopped already
            ended(server, key, job_id)


# One client for the module, made before any test starts a stream: on a loaded machine making
# a client (its TLS context) can take longer than a stream that holds a slot lasts.
CLIENT = httpx.Client(timeout=60)


def submit(server: ServerProcess, key: str, body: dict, idem: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": idem or uuid.uuid4().hex}
    response = CLIENT.post(f"{server.base_url}{JOBS}", json=body, headers=headers)
    if response.status_code == 202:
        SUBMITTED.append((server, key, response.json()["id"]))
    return response


def read(server: ServerProcess, key: str, job_id: str, suffix: str = "") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return CLIENT.get(f"{server.base_url}{JOBS}/{job_id}{suffix}", headers=headers)


def cancel(server: ServerProcess, key: str, job_id: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return CLIENT.delete(f"{server.base_url}{JOBS}/{job_id}", headers=headers)


def ended(server: ServerProcess, key: str, job_id: str) -> dict:
    def done() -> dict | None:
        job = read(server, key, job_id).json()
        return job if job["status"] not in ("queued", "running") else None

    return until(done, f"job {job_id} ends")


def usage_rows(server: ServerProcess, request_id: str) -> list[tuple[int, int, int]]:
    """(status, prompt_tokens, completion_tokens) of the usage rows written for a request id."""
    database = server.env["VLLM_ACS_HOME"] + "/vllm-acs.sqlite3"
    with sqlite3.connect(database) as conn:
        return conn.execute(
            "SELECT status, prompt_tokens, completion_tokens FROM usage_rows WHERE request_id = ?",
            (request_id,),
        ).fetchall()


def test_submit_poll_fetch_with_the_openai_sdk(acs_server, api_key, openai_client, model_id):
    body = {**BODY, "max_tokens": 5, "temperature": 0}
    submitted = openai_client.post(
        "/completion-jobs",
        cast_to=httpx.Response,
        body=body,
        options={"headers": {"Idempotency-Key": f"sdk-{uuid.uuid4().hex}"}},
    )
    assert submitted.status_code == 202
    job = submitted.json()
    assert (job["status"], job["model"]) == ("queued", model_id)
    assert isinstance(job["created_at"], int)
    assert submitted.headers["location"] == f"{JOBS}/{job['id']}"
    final = ended(acs_server, api_key, job["id"])
    assert final["status"] == "succeeded"
    assert final["result_status"] == 200
    assert (
        final["started_at"] >= final["created_at"] and final["finished_at"] >= final["started_at"]
    )
    result = openai_client.get(f"/completion-jobs/{job['id']}/result", cast_to=httpx.Response)
    live = openai_client.completions.create(**body)
    completion = result.json()
    assert completion["choices"][0]["text"] == live.choices[0].text
    assert completion["usage"]["completion_tokens"] == live.usage.completion_tokens == 5
    rows = until(lambda: usage_rows(acs_server, job["id"]), "the job's usage row is written")
    assert rows == [(200, live.usage.prompt_tokens, 5)]


def test_the_result_is_202_with_retry_after_until_the_job_ends(acs_server):
    key = acs_server.create_key("jobs-pending", *FROZEN)
    job = submit(acs_server, key, {**BODY, "max_tokens": 1}).json()
    early = read(acs_server, key, job["id"], "/result")
    assert early.status_code == 202
    assert early.headers["retry-after"] == "1"
    assert early.json()["id"] == job["id"]
    acs_server.cli("keys", "set", key[:15], "--max-running", "1")
    assert ended(acs_server, key, job["id"])["status"] == "succeeded"
    assert read(acs_server, key, job["id"], "/result").status_code == 200


def test_a_long_poll_answers_when_the_job_ends(acs_server):
    """`?wait=` holds the read until the job ends: /result gives the completion, the job's
    GET its end; a held read of a job cancelled meanwhile answers `cancelled` (that the cancel
    wakes it at once, not at the next shared check, is tests/unit/test_job_watch.py's)."""
    key = acs_server.create_key("jobs-long-poll", *FROZEN)
    job = submit(acs_server, key, {**BODY, "max_tokens": 1}).json()
    waiting: dict[str, httpx.Response] = {}
    reader = threading.Thread(
        target=lambda: waiting.update(result=read(acs_server, key, job["id"], "/result?wait=60"))
    )
    reader.start()
    # Still held while the job cannot run (its key has no running slot).
    until(lambda: read(acs_server, key, job["id"]).json()["started_at"], "the job was tried")
    assert reader.is_alive()
    acs_server.cli("keys", "set", key[:15], "--max-running", "1")
    reader.join(timeout=60)
    assert not reader.is_alive()
    answer = waiting["result"]
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 1
    assert "x-acs-longpoll" not in answer.headers
    # An ended job's long-poll answers at once.
    assert read(acs_server, key, job["id"], "?wait=60").json()["status"] == "succeeded"

    acs_server.cli("keys", "set", key[:15], "--max-running", "0")
    second = submit(acs_server, key, {**BODY, "max_tokens": 1}).json()
    reader = threading.Thread(
        target=lambda: waiting.update(job=read(acs_server, key, second["id"], "?wait=60"))
    )
    reader.start()
    until(lambda: acs_server.metric("acs_waiting_job_reads") >= 1, "the read is held")
    assert cancel(acs_server, key, second["id"]).status_code == 200
    reader.join(timeout=10)
    assert not reader.is_alive(), "the cancel did not wake the long-poll"
    assert waiting["job"].json()["status"] == "cancelled"


@pytest.mark.parametrize("wait", ["61", "-1", "1.5", "soon"])
def test_a_long_poll_wait_outside_0_to_60_is_400(acs_server, api_key, wait):
    job = submit(acs_server, api_key, {**BODY, "max_tokens": 1}).json()
    for suffix in (f"?wait={wait}", f"/result?wait={wait}"):
        refused = read(acs_server, api_key, job["id"], suffix)
        assert refused.status_code == 400
        assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == (
            "invalid_request",
            "wait",
        )


def test_a_resubmit_replays_the_first_answer(acs_server, api_key):
    body, idem = {**BODY, "max_tokens": 1}, f"same-{uuid.uuid4().hex}"
    first = submit(acs_server, api_key, body, idem)
    again = submit(acs_server, api_key, dict(reversed(body.items())), idem)  # key order differs
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["x-request-id"] != first.headers["x-request-id"]
    conflict = submit(acs_server, api_key, {**BODY, "max_tokens": 2}, idem)
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "idempotency_conflict"
    assert conflict.headers["x-should-retry"] == "false"


def test_the_idempotency_key_is_scoped_to_the_api_key(acs_server, api_key):
    other = acs_server.create_key("jobs-other")
    idem = f"shared-{uuid.uuid4().hex}"
    mine = submit(acs_server, api_key, {**BODY, "max_tokens": 1}, idem).json()
    theirs = submit(acs_server, other, {**BODY, "max_tokens": 2}, idem)
    assert theirs.status_code == 202
    assert theirs.json()["id"] != mine["id"]
    for suffix in ("", "/result"):
        refused = read(acs_server, other, mine["id"], suffix)
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "job_not_found"
    deleted = cancel(acs_server, other, mine["id"])
    assert (deleted.status_code, deleted.json()["error"]["code"]) == (404, "job_not_found")


@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        ({}, BODY, "Idempotency-Key"),
        ({"Idempotency-Key": ""}, BODY, "Idempotency-Key"),
        ({"Idempotency-Key": "k" * 256}, BODY, "Idempotency-Key"),
        ({"Idempotency-Key": "stream"}, {**BODY, "stream": True}, "stream"),
        ({"Idempotency-Key": "bad-temp"}, {**BODY, "temperature": 5000}, "temperature"),
        ({"Idempotency-Key": "unknown"}, {**BODY, "max-tokens": 3}, "max-tokens"),
    ],
)
def test_bad_submits_are_400_and_store_nothing(acs_server, api_key, headers, body, param):
    headers = {"Authorization": f"Bearer {api_key}", **headers}
    url = f"{acs_server.base_url}{JOBS}"
    for _ in range(2):  # refused before it started: the same key is free to use again
        response = CLIENT.post(url, json=body, headers=headers)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param
    if headers.get("Idempotency-Key") == "bad-temp":
        fixed = CLIENT.post(url, json=BODY, headers=headers)
        assert fixed.status_code == 202  # no record was kept for the refused body


def test_a_failing_completion_is_stored_as_the_jobs_result(acs_server, api_key):
    # vLLM itself refuses n > 1 with greedy sampling: the job runs and fails.
    job = submit(acs_server, api_key, {**BODY, "n": 2, "temperature": 0}).json()
    final = ended(acs_server, api_key, job["id"])
    assert (final["status"], final["result_status"]) == ("failed", 400)
    assert final["error_code"] == "vllm_invalid_request"
    result = read(acs_server, api_key, job["id"], "/result")
    assert result.status_code == 400
    assert result.json()["error"]["code"] == "vllm_invalid_request"


def test_a_job_over_budget_fails_and_charges_nothing(acs_server):
    key = acs_server.create_key("jobs-budget", "--monthly-tokens", "30")
    job = submit(acs_server, key, {**BODY, "max_tokens": 50}).json()
    final = ended(acs_server, key, job["id"])  # 4 + 50 tokens do not fit: a job refuses...
    assert (final["status"], final["error_code"]) == ("failed", "budget_exceeded")
    result = read(acs_server, key, job["id"], "/result")
    assert result.status_code == 429
    assert result.headers.get("retry-after") is None
    rows = until(lambda: usage_rows(acs_server, job["id"]), "the refused job's usage row")
    assert rows == [(429, 0, 0)]
    live = httpx.post(
        f"{acs_server.base_url}/v1/completions",
        json={**BODY, "max_tokens": 50},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert live.status_code == 200  # ...where a live request is clamped to what fits
    assert live.headers["x-acs-max-tokens-clamped"].startswith("requested=50,applied=26")


def test_a_capture_job_returns_the_live_activations(acs_server, api_key, api):
    body = {**BODY, "max_tokens": 2, "temperature": 0, "output_residual_stream": [1, 3]}
    job = submit(acs_server, api_key, body).json()
    assert ended(acs_server, api_key, job["id"])["status"] == "succeeded"
    stored = read(acs_server, api_key, job["id"], "/result").json()
    live = api.post("/v1/completions", json=body).json()
    np.testing.assert_array_equal(decode_residual_stream(stored), decode_residual_stream(live))


def test_cancel_a_queued_job(acs_server):
    key = acs_server.create_key("jobs-queued", *FROZEN)
    job = submit(acs_server, key, {**BODY, "max_tokens": 1}).json()

    def handed_back() -> bool:
        seen = read(acs_server, key, job["id"]).json()
        return seen["status"] == "queued" and seen["started_at"] is not None

    until(handed_back, "the job was tried and handed back to the queue")
    cancelled = cancel(acs_server, key, job["id"])
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    acs_server.cli("keys", "set", key[:15], "--max-running", "1")
    time.sleep(1.5)  # past the hand-back delay: a runner would have taken it by now
    # The job stays cancelled though the key may run it now.
    assert read(acs_server, key, job["id"]).json()["status"] == "cancelled"
    again = cancel(acs_server, key, job["id"])
    assert (again.status_code, again.json()["error"]["code"]) == (409, "job_not_cancellable")
    assert again.headers["x-should-retry"] == "false"
    gone = read(acs_server, key, job["id"], "/result")
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "job_not_found")


def test_cancel_a_running_job_aborts_its_engine_request(acs_server):
    key = acs_server.create_key("jobs-running")
    # Far longer than the half second below on any host: 8,000 tokens with 20 logprobs each (16 x
    # 500 such tokens took 7 s here; one plain choice of 2,000, the old job, ~10 s, which a host
    # 3x faster would nearly finish before the cancel).
    long = {**BODY, "max_tokens": 2000, "n": 4, "logprobs": 20, "temperature": 1.0}
    job = submit(acs_server, key, long).json()
    until(
        lambda: read(acs_server, key, job["id"]).json()["status"] == "running",
        "the job runs",
    )
    time.sleep(0.5)  # let the engine start generating
    cancelled = cancel(acs_server, key, job["id"])
    assert (cancelled.status_code, cancelled.json()["status"]) == (200, "cancelled")
    # The engine request was aborted: its usage row ends with the client gone, short of 2000.
    rows = until(lambda: usage_rows(acs_server, job["id"]), "the cancelled job's usage row")
    assert len(rows) == 1
    status, _prompt, completion = rows[0]
    assert status in (200, 499) and completion < 4 * 2000, rows
    assert read(acs_server, key, job["id"]).json()["status"] == "cancelled"


def test_concurrent_identical_submits_make_one_job(acs_server, api_key):
    idem, answers = f"race-{uuid.uuid4().hex}", []
    body = {**BODY, "max_tokens": 1}

    def send() -> None:
        answers.append(submit(acs_server, api_key, body, idem))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    accepted = [a for a in answers if a.status_code == 202]
    assert {a.json()["id"] for a in accepted} and len({a.json()["id"] for a in accepted}) == 1
    for answer in answers:
        if answer.status_code != 202:  # a resend while the first was in flight
            assert (answer.status_code, answer.json()["error"]["code"]) == (409, "running")
            assert answer.headers["retry-after"] == "1"


def test_the_sdk_raises_the_envelopes_errors(openai_client):
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.post("/completion-jobs", cast_to=httpx.Response, body=BODY)
    assert refused.value.body["code"] == "invalid_request"


@pytest.fixture(scope="module")
def small_node(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    """A node whose keys may each have 3 jobs not ended, and that holds no long-poll."""
    env = {"VLLM_ACS_MAX_JOBS_PER_KEY": "3", "VLLM_ACS_JOB_LONG_POLLS": "0"}
    with running_server(tiny_model_dir, tmp_path_factory.mktemp("jobs-home"), env=env) as server:
        yield server


def test_job_capacity_per_key(small_node):
    key = small_node.create_key("capacity", *FROZEN)  # its jobs cannot run: they stay unfinished
    other = small_node.create_key("capacity-other")
    jobs = [submit(small_node, key, {**BODY, "max_tokens": 1}) for _ in range(3)]
    assert [j.status_code for j in jobs] == [202] * 3
    refused = submit(small_node, key, {**BODY, "max_tokens": 1})
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "job_capacity"
    assert refused.headers["x-should-retry"] == "false"
    assert "retry-after" not in refused.headers
    assert submit(small_node, other, {**BODY, "max_tokens": 1}).status_code == 202
    assert cancel(small_node, key, jobs[0].json()["id"]).status_code == 200
    assert submit(small_node, key, {**BODY, "max_tokens": 1}).status_code == 202
    # A node past its long-polls answers a `?wait=` read at once, saying so.
    declined = read(small_node, key, jobs[1].json()["id"], "/result?wait=30")
    assert declined.status_code == 202
    assert declined.headers["x-acs-longpoll"] == "declined"
    assert declined.headers["retry-after"] == "3"
    for job in jobs[1:]:
        cancel(small_node, key, job.json()["id"])


def test_retention_with_the_operators_clock(small_node):
    """Expiry and deletion as of a chosen time: `vllm-acs jobs sweep --now` runs the nodes' own
    sweep against their database (no waiting 24 hours)."""
    key = small_node.create_key("retention")
    body, idem = {**BODY, "max_tokens": 1}, f"keep-{uuid.uuid4().hex}"
    done = submit(small_node, key, body, idem).json()
    assert ended(small_node, key, done["id"])["status"] == "succeeded"
    blocked = small_node.create_key("retention-blocked", *FROZEN)
    queued = submit(small_node, blocked, body).json()
    day_later = datetime.now(timezone.utc) + timedelta(hours=25)

    def expired() -> bool:
        small_node.cli("jobs", "sweep", "--now", day_later.isoformat())
        return read(small_node, blocked, queued["id"]).json()["status"] == "expired"

    # A sweep that falls in the moment a runner tries the job finds it running: sweep again.
    until(expired, "the queued job expires after 24 hours", timeout_s=60)
    assert read(small_node, blocked, queued["id"], "/result").status_code == 404
    # 25 hours after it ended, the result is deleted; the job and its idempotency record remain.
    assert read(small_node, key, done["id"]).json()["status"] == "succeeded"
    gone = read(small_node, key, done["id"], "/result")
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "job_not_found")
    replay = submit(small_node, key, body, idem)
    assert (replay.json()["id"], replay.headers["idempotent-replayed"]) == (done["id"], "true")
    # After 7 days the metadata goes too: the id is unknown, the Idempotency-Key is free again.
    week_later = datetime.now(timezone.utc) + timedelta(days=8)
    small_node.cli("jobs", "sweep", "--now", week_later.isoformat())
    assert read(small_node, key, done["id"]).status_code == 404
    fresh = submit(small_node, key, body, idem)
    assert fresh.status_code == 202 and fresh.json()["id"] != done["id"]
    assert "idempotent-replayed" not in fresh.headers
