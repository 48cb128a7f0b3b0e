"""A harvest on a node whose job files live in S3 (a real SeaweedFS): the files land in the bucket,
the harvest answers the store's presigned URLs (expiring 7 days after it ended), and
`download_harvest` fetches them from the store, a cut download resuming with Range; the shards
equal the inline capture of the same prompts (up to the batch's bf16 rounding). The node's own
signed URL still serves them."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import numpy as np
import pytest

from tests.harness import MODEL_ID, running_server
from tests.reference import assert_rows_close
from vllm_acs.client import decode_residual_stream, download_harvest

pytestmark = pytest.mark.e2e

LAYERS = [0, 2]
SEVEN_DAYS_S = 7 * 24 * 3600


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(11)
    sizes = rng.integers(2, 20, size=8)
    return [[int(t) for t in rng.integers(3, 1000, size=int(n))] for n in sizes]


@pytest.fixture(scope="module")
def s3_node(seaweedfs, tiny_model_dir, tmp_path_factory):
    prefix = seaweedfs.prefix("e2e")
    home = tmp_path_factory.mktemp("acs-home-s3")
    env = {"VLLM_ACS_GPU_SHAPE": "cpu-test", **seaweedfs.env(prefix)}
    with running_server(tiny_model_dir, home, env=env) as server:
        yield {"server": server, "prefix": prefix, "home": home}


@pytest.fixture(scope="module")
def harvested(s3_node) -> dict[str, Any]:
    server = s3_node["server"]
    key = server.create_key("harvest-s3")
    client = httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    prompts = _prompts()
    body = {"model": MODEL_ID, "prompts": prompts, "layers": LAYERS, "shard_size": 4}
    submitted = client.post("/v1/harvest", json=body)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job_id"]
    deadline = time.monotonic() + 120
    while (job := client.get(f"/v1/harvest/{job_id}", params={"wait": 20}).json())["status"] in (
        "pending",
        "running",
    ):
        assert time.monotonic() < deadline, server.log_tail()
    assert job["status"] == "done", (job, server.log_tail())
    return {"client": client, "job": job, "prompts": prompts}


def test_the_files_are_in_the_bucket_not_on_the_node(seaweedfs, s3_node, harvested):
    from vllm_acs.storage.files_s3 import S3FileStore

    job = harvested["job"]
    assert job["result"]["n_shards"] == 2
    store = S3FileStore.from_settings(seaweedfs.settings(s3_node["prefix"]))
    names = asyncio.run(store.children(f"harvests/{job['job_id']}"))
    assert {"manifest.json", "stats.safetensors", "_input", "_parts"} <= set(names)
    assert {"shard_00000.safetensors", "shard_00001.safetensors"} <= set(names)
    assert not (s3_node["home"] / "files").exists()


def test_the_urls_are_presigned_and_end_seven_days_after_the_harvest(seaweedfs, harvested):
    job = harvested["job"]
    result = job["result"]
    urls = [result["manifest_url"], result["stats_url"], *result["shard_urls"]]
    ended = datetime.fromisoformat(job["finished_at"])
    assert datetime.fromisoformat(job["urls_expire_at"]) == ended + timedelta(days=7)
    assert job["urls_expired"] is False
    for url in urls:
        parts = urlsplit(url)
        assert f"{parts.scheme}://{parts.netloc}" == seaweedfs.endpoint, url
        query = parse_qs(parts.query)
        assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
        # Signed at this read, to end when the harvest's URLs end (SigV4: at most 7 days).
        signed = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ")
        expires = signed.replace(tzinfo=timezone.utc) + timedelta(
            seconds=int(query["X-Amz-Expires"][0])
        )
        assert int(query["X-Amz-Expires"][0]) <= SEVEN_DAYS_S
        assert abs((expires - (ended + timedelta(days=7))).total_seconds()) <= 2
    assert [urlsplit(u).path.rsplit("/", 1)[-1] for u in result["shard_urls"]] == [
        "shard_00000.safetensors",
        "shard_00001.safetensors",
    ]


def test_download_harvest_fetches_them_and_they_equal_the_inline_capture(harvested, tmp_path):
    files = download_harvest(harvested["job"], tmp_path)
    assert files.layer_indices == LAYERS
    seen = 0
    for index, rows, tokens in files.prompts():
        prompt = harvested["prompts"][index]
        assert tokens.tolist() == prompt
        assert tuple(rows.shape) == (len(LAYERS), len(prompt), 128)
        inline = harvested["client"].post(
            "/v1/completions",
            json={
                "model": MODEL_ID,
                "prompt": prompt,
                "max_tokens": 1,
                "temperature": 0,
                "output_residual_stream": LAYERS,
            },
        )
        assert inline.status_code == 200, inline.text
        expected = decode_residual_stream(inline.json())
        assert_rows_close(rows.float().numpy(), expected, f"prompt {index}")
        seen += 1
    assert seen == 8
    assert set(files.stats()["layer_indices"].tolist()) == set(LAYERS)


def test_a_cut_download_resumes_from_the_store_with_range(harvested, tmp_path):
    whole = download_harvest(harvested["job"], tmp_path / "whole")
    shard = whole.shard_paths[1]
    data = shard.read_bytes()
    target = tmp_path / "cut"
    download_harvest(harvested["job"], target)
    (target / shard.name).unlink()
    (target / f"{shard.name}.part").write_bytes(data[:1000])

    sent: list[tuple[str | None, int]] = []

    class Recording(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            if request.url.path.endswith(shard.name):
                sent.append((request.headers.get("range"), response.status_code))
            return response

    resumed = download_harvest(harvested["job"], target, transport=Recording())
    assert sent == [("bytes=1000-", 206)]
    assert (target / shard.name).read_bytes() == data
    assert not (target / f"{shard.name}.part").exists()
    assert [p.name for p in resumed.shard_paths] == [p.name for p in whole.shard_paths]


def test_the_nodes_own_signed_url_serves_the_bucket_too(s3_node, harvested):
    from vllm_acs.harvest.download_urls import UrlSigner, load_or_create_secret

    server, job = s3_node["server"], harvested["job"]
    secret = load_or_create_secret(None, Path(s3_node["home"]))
    path = f"/downloads/{job['job_id']}/shard_00000.safetensors"
    url = server.base_url + UrlSigner(secret).sign(path, datetime.now(timezone.utc) + timedelta(1))
    whole = httpx.get(job["result"]["shard_urls"][0]).content
    assert httpx.get(url).content == whole
    part = httpx.get(url, headers={"Range": "bytes=10-99"})
    assert part.status_code == 206 and part.content == whole[10:100]
