"""A value the client sent and an error message repeats (an unknown model, an id that is not the
caller's) comes back cut to its first `ECHO_CHARS` characters and the count of the rest, not in
full: a 100,000-character model name is a 400 of a few hundred bytes; so is a 5,000-character
path that names no route (404) or a route without that method (405)."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import OpenAI

from vllm_acs.auth.principal import SCOPES
from vllm_acs.errors import ECHO_CHARS, echoed

pytestmark = pytest.mark.e2e

LONG_MODEL = "m" * 100_000
# Path segments stay under the HTTP server's own limit on a request line.
LONG_ID = "job_" + "9" * 5_000
BOUND = 400  # the longest message below with a cut value is about 250 characters


def test_a_value_is_cut_with_the_count_of_the_rest():
    assert echoed("tiny-llama") == "tiny-llama"
    assert echoed("x" * ECHO_CHARS) == "x" * ECHO_CHARS
    assert echoed("x" * (ECHO_CHARS + 1234)) == "x" * ECHO_CHARS + "... (1,234 more characters)"


@pytest.fixture(scope="module")
def key(acs_server) -> str:
    return acs_server.create_key("hostile-echo", "--scopes", ",".join(sorted(SCOPES)))


def _cut(message: str, value: str) -> None:
    assert len(message) < BOUND, message[:BOUND]
    assert value[:ECHO_CHARS] + "... (" in message
    assert f"({len(value) - ECHO_CHARS:,} more characters)" in message


def test_an_unknown_long_model_is_a_short_400(acs_server, key):
    sdk = OpenAI(base_url=f"{acs_server.base_url}/v1", api_key=key, max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(model=LONG_MODEL, prompt="x", max_tokens=1)
    error = refused.value.response.json()["error"]
    assert error["code"] == "model_not_found"
    _cut(error["message"], LONG_MODEL)
    assert len(refused.value.response.content) < 2 * BOUND


@pytest.mark.parametrize(
    ("path", "code"),
    [
        (f"/v1/harvest/{LONG_ID}", "harvest_job_not_found"),
        (f"/v1/completion-jobs/{LONG_ID}", "job_not_found"),
        (f"/v1/looms/{LONG_ID}", "loom_not_found"),
        (f"/v1/models/{LONG_ID}/status", "model_not_found"),
    ],
)
def test_an_unknown_long_id_is_a_short_404(acs_server, key, path, code):
    answer = httpx.get(
        f"{acs_server.base_url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=60
    )
    assert answer.status_code == 404, answer.text[:BOUND]
    error = answer.json()["error"]
    assert error["code"] == code
    _cut(error["message"], LONG_ID)


def test_an_unknown_long_field_is_a_short_400(acs_server, key, model_id):
    field = "f" * 100_000
    answer = httpx.post(
        f"{acs_server.base_url}/v1/completions",
        json={"model": model_id, "prompt": "x", "max_tokens": 1, field: 1},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert answer.status_code == 400, answer.text[:BOUND]
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    _cut(error["message"], field)
    assert error["param"] == echoed(field)
    assert len(answer.content) < 2 * BOUND


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/nothing/" + "p" * 5_000, 404, "not_found"),
        ("GET", "/v1/keys/" + "k" * 5_000, 405, "method_not_allowed"),
    ],
)
def test_a_long_unknown_path_is_a_short_404_or_405(acs_server, key, method, path, status, code):
    answer = httpx.request(
        method, f"{acs_server.base_url}{path}", headers={"Authorization": f"Bearer {key}"}
    )
    assert answer.status_code == status, answer.text[:BOUND]
    error = answer.json()["error"]
    assert error["code"] == code
    _cut(error["message"], path)
