"""Bulk harvests end to end on the session's node: submit, long-poll, download the files by their
signed URLs (no key), and check them against the inline capture of the same prompts, the
prompts' own token ids, and a NumPy computation of the statistics.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load

from tests.harness import MODEL_ID
from tests.reference import assert_rows_close
from vllm_acs.client import decode_residual_stream

pytestmark = pytest.mark.e2e

CONTEXT = 2048  # the harness serves --max-model-len 2048
LAYERS = [0, 2, 3]
LONG_PROMPT = 39  # the last of _prompts(): longer than the context
LONG_PROMPT_ROW_TOLERANCE = 0.02  # relative L2 error per row


def _prompts() -> list[Any]:
    rng = np.random.default_rng(7)
    prompts: list[Any] = []
    for i in range(39):
        if i % 3 == 0:
            prompts.append([int(t) for t in rng.integers(3, 1000, size=int(rng.integers(1, 30)))])
        else:
            prompts.append(" ".join(["the sky is blue"] * int(rng.integers(1, 8))) + f" {i}")
    # Longer than the context: cut to what runs (the context less the one generated token).
    prompts.append([int(t) for t in rng.integers(3, 1000, size=CONTEXT + 50)])
    return prompts


def _wait_done(client: httpx.Client, job_id: str, timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/v1/harvest/{job_id}", params={"wait": 20}).json()
        if job["status"] not in ("pending", "running") or time.monotonic() > deadline:
            return job


@pytest.fixture(scope="module")
def harvested(acs_server) -> dict[str, Any]:
    key = acs_server.create_key("harvest-lab")
    client = httpx.Client(
        base_url=acs_server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    prompts = _prompts()
    body = {"model": MODEL_ID, "prompts": prompts, "layers": LAYERS, "shard_size": 16}
    submitted = client.post("/v1/harvest", json=body)
    assert submitted.status_code == 202, submitted.text
    answer = submitted.json()
    assert (answer["status"], answer["model"], answer["n_prompts"]) == ("pending", MODEL_ID, 40)
    assert submitted.headers["location"] == f"/v1/harvest/{answer['job_id']}"
    job = _wait_done(client, answer["job_id"])
    assert job["status"] == "done", (job, acs_server.log_tail())
    files = {"manifest": httpx.get(job["result"]["manifest_url"]).content}
    files["stats"] = httpx.get(job["result"]["stats_url"]).content
    shards = [httpx.get(url) for url in job["result"]["shard_urls"]]
    assert all(s.status_code == 200 for s in shards)
    return {
        "client": client,
        "key": key,
        "prompts": prompts,
        "job": job,
        "manifest": json.loads(files["manifest"]),
        "stats": load(files["stats"]),
        "shards": [load(s.content) for s in shards],
    }


def _tensors(harvested: dict[str, Any]) -> dict[str, torch.Tensor]:
    merged: dict[str, torch.Tensor] = {}
    for shard in harvested["shards"]:
        merged.update(shard)
    return merged


def test_the_job_answers_its_files_and_progress(harvested):
    job = harvested["job"]
    assert job["result"]["n_shards"] == 3  # 40 prompts, 16 per shard
    assert job["result"]["layer_indices"] == LAYERS
    progress = job["progress"]
    # 3 shards make one part (4 shards to a part by default), run on this one node.
    assert progress == {
        "prompts_done": 40,
        "n_prompts": 40,
        "shards_done": 3,
        "n_shards": 3,
        "rows_done": progress["n_rows"],
        "n_rows": sum(s["n_tokens"] for s in harvested["manifest"]["shards"]),
        "parts": 1,
        "parts_done": 1,
        "parts_running": 0,
        "nodes": 0,
    }
    assert job["urls_expired"] is False
    timings = job["result"]["timings"]
    assert {"forward_s", "write_s", "tokens"} <= set(timings)
    assert (timings["parts"], timings["nodes"]) == (1, 1)


def test_the_manifest_lists_every_shard(harvested):
    manifest = harvested["manifest"]
    assert manifest["complete"] is True
    assert manifest["layer_indices"] == LAYERS
    assert manifest["hidden_size"] == 128 and manifest["dtype"] == "bfloat16"
    assert "hook_resid_post" in manifest["layer_convention"]
    assert manifest["truncated_prompts"] == [39]
    ranges = [(s["file"], s["first_prompt"], s["last_prompt"]) for s in manifest["shards"]]
    assert ranges == [
        ("shard_00000.safetensors", 0, 15),
        ("shard_00001.safetensors", 16, 31),
        ("shard_00002.safetensors", 32, 39),
    ]
    tensors = _tensors(harvested)
    assert sum(s["n_tokens"] for s in manifest["shards"]) == sum(
        int(tensors[f"tokens_{i}"].shape[0]) for i in range(40)
    )


def test_tokens_are_the_prompts_ids_and_the_long_one_is_cut(harvested, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    bos = harvested["manifest"]["bos_token_id"]
    assert bos == tokenizer.bos_token_id
    tensors = _tensors(harvested)
    for i, prompt in enumerate(harvested["prompts"]):
        tokens = tensors[f"tokens_{i}"]
        assert tokens.dtype == torch.int32
        rows = tensors[f"prompt_{i}"]
        assert rows.dtype == torch.bfloat16
        assert tuple(rows.shape) == (len(LAYERS), tokens.shape[0], 128)
        if isinstance(prompt, list):
            assert tokens.tolist() == prompt[: CONTEXT - 1]
        else:
            assert tokens.tolist() == tokenizer(prompt).input_ids
            assert tokens[0].item() == bos


def test_every_shard_tensor_equals_the_inline_capture(harvested):
    tensors = _tensors(harvested)
    for index in range(40):
        tokens = tensors[f"tokens_{index}"].tolist()
        inline = harvested["client"].post(
            "/v1/completions",
            json={
                "model": MODEL_ID,
                "prompt": tokens,
                "max_tokens": 1,
                "temperature": 0,
                "output_residual_stream": LAYERS,
            },
        )
        assert inline.status_code == 200, inline.text
        expected = decode_residual_stream(inline.json())  # float32, exact bf16 values
        got = tensors[f"prompt_{index}"].float().numpy()
        if index < LONG_PROMPT:
            assert_rows_close(got, expected, f"prompt {index}")
            continue
        # The long prompt's 2,047 tokens fill the node's 2,048-token step alone, but share the
        # harvest's steps with other prompts: chunked prefill cuts them where the budget ran out
        # then (which depends on timing), and a cut prompt is computed in other shapes, so bf16
        # rounds its later rows further apart. Measured with a cut at 1,024: row 0 exact, rows
        # from 717 on off by up to 0.0076 (relative L2), 0.0625 at most in one value (the
        # figure of CI's failure). The bound is below the hook tests' vLLM-versus-transformers
        # one.
        assert_rows_close(got, expected, "the long prompt", LONG_PROMPT_ROW_TOLERANCE)


def test_stats_equal_numpy_over_the_shards_without_bos(harvested):
    tensors = _tensors(harvested)
    bos_id = harvested["manifest"]["bos_token_id"]
    rows, bos = [], []
    for i in range(40):
        values = tensors[f"prompt_{i}"].float().numpy().astype(np.float64)
        if tensors[f"tokens_{i}"][0].item() == bos_id:
            bos.append(values[:, :1])
            values = values[:, 1:]
        rows.append(values)
    everything = np.concatenate(rows, axis=1)  # [layers, tokens, hidden]
    stats = {k: v.numpy() for k, v in harvested["stats"].items()}
    assert stats["layer_indices"].tolist() == LAYERS
    assert stats["count"].tolist() == [everything.shape[1]] * len(LAYERS)
    np.testing.assert_allclose(stats["mean"], everything.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["std"], everything.std(axis=1), rtol=1e-5, atol=1e-6)
    norms = np.linalg.norm(everything, axis=2)
    np.testing.assert_allclose(stats["mean_norm"], norms.mean(axis=1), rtol=1e-5)
    np.testing.assert_allclose(stats["mean_sq_norm"], (norms**2).mean(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(stats["absmax"], np.abs(everything).max(axis=(1, 2)))
    bos_norms = np.linalg.norm(np.concatenate(bos, axis=1), axis=2)
    np.testing.assert_allclose(stats["bos_mean_norm"], bos_norms.mean(axis=1), rtol=1e-5)


def test_a_range_request_returns_those_bytes(harvested):
    url = harvested["job"]["result"]["shard_urls"][1]
    whole = httpx.get(url).content
    part = httpx.get(url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206
    assert part.headers["content-range"] == f"bytes 100-199/{len(whole)}"
    assert part.content == whole[100:200]
    tail = httpx.get(url, headers={"Range": "bytes=-10"})
    assert tail.content == whole[-10:]
    outside = httpx.get(url, headers={"Range": f"bytes={len(whole)}-"})
    assert outside.status_code == 416
    assert outside.json()["error"]["code"] == "range_not_satisfiable"


def test_an_expired_url_is_refused(acs_server, harvested):
    # Signed with this deployment's own secret, but an hour in the past.
    from vllm_acs.harvest.download_urls import UrlSigner, load_or_create_secret

    secret = load_or_create_secret(None, Path(acs_server.env["VLLM_ACS_HOME"]))
    path = urlsplit(harvested["job"]["result"]["stats_url"]).path
    expired = UrlSigner(secret).sign(path, datetime.now(timezone.utc) - timedelta(hours=1))
    answer = httpx.get(f"{acs_server.base_url}{expired}")
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "download_url_invalid"
    assert "expired" in answer.json()["error"]["message"]
    fresh = UrlSigner(secret).sign(path, datetime.now(timezone.utc) + timedelta(hours=1))
    assert httpx.get(f"{acs_server.base_url}{fresh}").status_code == 200


def test_a_tampered_or_unsigned_url_is_refused(harvested):
    url = harvested["job"]["result"]["stats_url"]
    tampered = url.replace("signature=", "signature=0")
    for bad in (tampered, url.split("?")[0], url.replace("expires=", "expires=9")):
        answer = httpx.get(bad)
        assert answer.status_code == 403, bad
        assert answer.json()["error"]["code"] == "download_url_invalid"
        assert answer.headers["x-should-retry"] == "false"


def test_a_harvest_is_not_a_completion_job(harvested):
    job_id = harvested["job"]["job_id"]
    for path in (f"/v1/completion-jobs/{job_id}", f"/v1/completion-jobs/{job_id}/result"):
        answer = harvested["client"].get(path)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "job_not_found"


def test_another_keys_id_is_harvest_job_not_found(acs_server, harvested):
    other = acs_server.create_key("harvest-other")
    job_id = harvested["job"]["job_id"]
    for method in ("GET", "DELETE"):
        answer = httpx.request(
            method,
            f"{acs_server.base_url}/v1/harvest/{job_id}",
            headers={"Authorization": f"Bearer {other}"},
        )
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "harvest_job_not_found"


def test_a_done_harvest_is_not_cancellable(harvested):
    job_id = harvested["job"]["job_id"]
    answer = harvested["client"].delete(f"/v1/harvest/{job_id}")
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "harvest_not_cancellable"
    assert "done" in answer.json()["error"]["message"]


def test_strict_validation_and_the_layer_choice(harvested):
    client = harvested["client"]
    cases = [
        ({"model": MODEL_ID, "prompts": ["x"], "bogus": 1}, "bogus"),
        ({"model": MODEL_ID, "prompts": []}, "prompts"),
        ({"model": MODEL_ID, "prompts": ["x"], "layers": [9]}, "layers"),
        ({"model": MODEL_ID, "prompts": ["x"], "layers": "some"}, "layers"),
        ({"model": MODEL_ID, "prompts": [[5, 99999]]}, "prompts.0"),
    ]
    for body, param in cases:
        answer = client.post("/v1/harvest", json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["error"]["param"] == param, answer.text


def test_a_running_harvest_long_polls_refuses_a_second_and_cancels(acs_server):
    # No running slot but one queue place: the run captures its first shard, then waits in that
    # place for the key's slot to write it, for as long as it takes: it stays `running`.
    key = acs_server.create_key("harvest-held", "--max-running", "0", "--max-waiting", "1")
    client = httpx.Client(
        base_url=acs_server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    body = {"model": MODEL_ID, "prompts": ["The sky is", "Grass is"], "layers": [1]}
    submitted = client.post("/v1/harvest", json=body, headers={"Idempotency-Key": "held-1"})
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job_id"]
    again = client.post("/v1/harvest", json=body, headers={"Idempotency-Key": "held-1"})
    assert again.status_code == 202 and again.json() == submitted.json()
    assert again.headers["idempotent-replayed"] == "true"
    deadline = time.monotonic() + 60
    while client.get(f"/v1/harvest/{job_id}").json()["status"] != "running":
        assert time.monotonic() < deadline, acs_server.log_tail()
        time.sleep(0.2)

    # One harvest at a time per key.
    second = client.post("/v1/harvest", json=body)
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "harvest_concurrency_exceeded"
    assert int(second.headers["retry-after"]) > 0

    # A long-poll with nothing changing holds for its wait, then answers the same state.
    started = time.monotonic()
    held = client.get(f"/v1/harvest/{job_id}", params={"wait": 2})
    assert held.status_code == 200 and held.json()["status"] == "running"
    assert held.json()["progress"]["shards_done"] == 0
    # Its one part runs here, waiting for the slot.
    assert held.json()["progress"] | {"eta_s": None} == held.json()["progress"] | {
        "parts": 1,
        "parts_done": 0,
        "parts_running": 1,
        "nodes": 1,
        "eta_s": None,
    }
    assert time.monotonic() - started >= 1.9
    assert client.get(f"/v1/harvest/{job_id}", params={"wait": 61}).status_code == 400

    # A long-poll answers as soon as the status changes: here, the cancel.
    answers: dict[str, Any] = {}

    def long_poll() -> None:
        answers["at"] = time.monotonic()
        answers["job"] = client.get(f"/v1/harvest/{job_id}", params={"wait": 30}).json()
        answers["took"] = time.monotonic() - answers["at"]

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(1.0)
    cancelled = client.delete(f"/v1/harvest/{job_id}")
    poller.join(timeout=40)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    # Its part was cancelled with it: nothing of it runs on.
    assert cancelled.json()["progress"]["parts_running"] == 0
    assert answers["job"]["status"] == "cancelled" and answers["took"] < 10
    again = client.delete(f"/v1/harvest/{job_id}")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "harvest_not_cancellable"
    # The cancelled run gives its queue place back (within a moment: the runner stops it): a new
    # submit, whose budget check needs that one place, is then accepted; a place never given
    # back would answer 429 queue_full for ever.
    deadline = time.monotonic() + 30
    while (after := client.post("/v1/harvest", json=body)).status_code == 429:
        assert after.json()["error"]["code"] == "queue_full", after.text
        assert time.monotonic() < deadline, "the cancelled harvest kept its queue place"
        time.sleep(0.5)
    assert after.status_code == 202, after.text
    assert client.delete(f"/v1/harvest/{after.json()['job_id']}").status_code == 200
