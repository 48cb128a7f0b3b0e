"""From a harvest to a trained SAE, as a researcher does it: submit, download the files with
`vllm_acs.client` (a cut download resumes), iterate one layer's rows, and train SAELens's
`SAETrainer` on them for a few hundred steps; its reconstruction loss falls.
"""

from __future__ import annotations

import time

import httpx
import pytest
import torch

from tests.harness import MODEL_ID
from vllm_acs.client import download_harvest

pytestmark = pytest.mark.e2e

LAYER, HIDDEN = 2, 128
SENTENCE = "the sky is blue grass is green water is wet fire is hot a cat sat on the mat"
WORDS = SENTENCE.split()


def _prompts(n: int) -> list[str]:
    generator = torch.Generator().manual_seed(3)
    prompts = []
    for _ in range(n):
        picks = torch.randint(len(WORDS), (int(torch.randint(8, 24, (1,))),), generator=generator)
        prompts.append(" ".join(WORDS[i] for i in picks.tolist()))
    return prompts


def _harvest(base_url: str, key: str) -> dict:
    client = httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    body = {"model": MODEL_ID, "prompts": _prompts(160), "layers": [LAYER], "shard_size": 40}
    submitted = client.post("/v1/harvest", json=body)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job_id"]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        job = client.get(f"/v1/harvest/{job_id}", params={"wait": 20}).json()
        if job["status"] not in ("pending", "running"):
            return job
    raise AssertionError(f"harvest {job_id} did not end")


def test_a_harvest_trains_an_sae_through_the_client(acs_server, tmp_path):
    from sae_lens import SAETrainer, StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig

    key = acs_server.create_key("harvest-sae")
    job = _harvest(acs_server.base_url, key)
    assert job["status"] == "done", job

    # Download by id, as a notebook would; cut one shard and download again: it resumes.
    files = download_harvest(
        job["job_id"], tmp_path, base_url=f"{acs_server.base_url}/v1", api_key=key
    )
    shard = files.shard_paths[1]
    whole = shard.read_bytes()
    shard.unlink()
    shard.with_name(shard.name + ".part").write_bytes(whole[: len(whole) // 3])
    files = download_harvest(job, tmp_path)
    assert shard.read_bytes() == whole
    assert files.layer_indices == [LAYER] and files.hidden_size == HIDDEN

    held_out = torch.cat(list(files.iter_layer(LAYER, batch_size=256, seed=99)))[:512]
    assert held_out.shape == (512, HIDDEN) and held_out.dtype == torch.float32

    sae = StandardTrainingSAE(
        StandardTrainingSAEConfig(d_in=HIDDEN, d_sae=4 * HIDDEN, l1_coefficient=1e-3)
    )

    def reconstruction_loss() -> float:
        with torch.no_grad():
            return float(((sae(held_out) - held_out) ** 2).sum(dim=-1).mean())

    before = reconstruction_loss()
    steps, batch = 300, 64
    trainer = SAETrainer(
        cfg=SAETrainerConfig(
            total_training_samples=steps * batch,
            train_batch_size_samples=batch,
            lr=1e-3,
            lr_end=1e-3,  # SAETrainerConfig leaves it to the caller (constant schedule)
            device="cpu",
            dead_feature_window=100,
            feature_sampling_window=100,
        ),
        sae=sae,
        data_provider=files.iter_layer(LAYER, batch_size=batch, repeat=True, shuffle_rows=4096),
    )
    trainer.fit()
    after = reconstruction_loss()
    print(f"\nSAE reconstruction loss on held-out rows: {before:.4f} before, {after:.4f} after")
    assert after < 0.5 * before, (before, after)
