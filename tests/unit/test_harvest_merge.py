"""A harvest's parts' statistics states do not pile up: a part keeps only the state its manifest
names, the merge deletes the parts' last ones once `manifest.json` is written, and a merge run
again (the harvest's node died before its end was recorded) returns that manifest. A part whose
named state is gone starts over rather than failing."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_acs.harvest.manifest import Manifest, ShardEntry
from vllm_acs.harvest.merge import MANIFEST, STATS, merge_parts
from vllm_acs.harvest.part_run import PartRun
from vllm_acs.harvest.parts import PartManifest, part_manifest_name, part_state_name, plan_parts
from vllm_acs.harvest.shards import state_bytes
from vllm_acs.harvest.stats import LayerStats
from vllm_acs.storage.files import LocalFileStore

HARVEST = "job_merge"
LAYERS, HIDDEN, SHARD_SIZE, N_PROMPTS = [1, 3], 8, 2, 8
PLANS = plan_parts(N_PROMPTS, SHARD_SIZE, 2)  # 4 shards in 2 parts


def _manifest() -> Manifest:
    return Manifest(
        job_id=HARVEST,
        model="tiny",
        checkpoint="tiny",
        tokenizer="tiny",
        hidden_size=HIDDEN,
        n_model_layers=4,
        layer_indices=LAYERS,
        n_prompts=N_PROMPTS,
        shard_size=SHARD_SIZE,
        max_prompt_tokens=3,
        truncated_prompts=[],
        bos_token_id=None,
        vllm_version="x",
        vllm_acs_version="y",
    )


async def _write_part(files: LocalFileStore, index: int, n_done: int, complete: bool) -> None:
    plan = PLANS[index]
    part = PartManifest.of(plan)
    part.complete = complete
    rng = np.random.default_rng(index)
    stats = LayerStats(len(LAYERS), HIDDEN)
    for shard in range(plan.first_shard, plan.first_shard + n_done):
        first = shard * SHARD_SIZE
        stats.add(rng.standard_normal((len(LAYERS), 3, HIDDEN)).astype(np.float32))
        part.shards.append(ShardEntry(f"shard_{shard:05d}.safetensors", first, first + 1, 6, 10))
    await files.write(part_manifest_name(HARVEST, index), part.to_bytes())
    name = part_state_name(HARVEST, index, n_done)
    await files.write(name, state_bytes(stats.to_state()))


def test_the_merge_deletes_the_parts_states_and_a_second_merge_returns_the_first(tmp_path):
    files = LocalFileStore(tmp_path)

    async def scenario() -> None:
        for plan in PLANS:
            await _write_part(files, plan.index, plan.n_shards, complete=True)
        first = await merge_parts(files, HARVEST, PLANS, _manifest())
        assert first.complete and [s.file for s in first.shards] == [
            f"shard_{n:05d}.safetensors" for n in range(4)
        ]
        # Only the parts' manifests are left in _parts/; the merged files are beside them.
        assert await files.children(f"harvests/{HARVEST}/_parts") == [
            "part_0000.json",
            "part_0001.json",
        ]
        stats = await files.read(f"harvests/{HARVEST}/{STATS}")
        # Run again with the states gone: the written manifest, the same statistics.
        again = await merge_parts(files, HARVEST, PLANS, _manifest())
        assert again == first
        assert await files.read(f"harvests/{HARVEST}/{STATS}") == stats
        assert Manifest.from_bytes(await files.read(f"harvests/{HARVEST}/{MANIFEST}")) == first

    asyncio.run(scenario())


def _part_run(files: LocalFileStore) -> PartRun:
    context = SimpleNamespace(
        model=lambda: SimpleNamespace(id="tiny", hidden_size=HIDDEN),
        files=files,
        settings=SimpleNamespace(harvest_prompts_in_flight=2),
    )
    request = SimpleNamespace(layers=LAYERS, principal=None)
    job = SimpleNamespace(id=f"{HARVEST}-p0000", attempt=1, owner="node-a")
    return PartRun(context, HARVEST, job, PLANS[0], request, asyncio.Event())  # type: ignore[arg-type]


def test_a_part_resumes_from_the_state_its_manifest_names(tmp_path):
    files = LocalFileStore(tmp_path)

    async def scenario() -> tuple[PartManifest, LayerStats]:
        await _write_part(files, 0, 1, complete=False)
        return await _part_run(files)._resume_point()

    manifest, stats = asyncio.run(scenario())
    assert len(manifest.shards) == 1 and manifest.next_shard == 1
    assert int(stats.to_state()["count"].sum()) > 0


def test_a_part_whose_state_is_gone_starts_over(tmp_path, caplog: pytest.LogCaptureFixture):
    files = LocalFileStore(tmp_path)

    async def scenario() -> tuple[PartManifest, LayerStats]:
        await _write_part(files, 0, 1, complete=False)
        await files.delete(part_state_name(HARVEST, 0, 1))
        return await _part_run(files)._resume_point()

    with caplog.at_level(logging.WARNING, logger="vllm_acs.harvest.part_run"):
        manifest, stats = asyncio.run(scenario())
    assert manifest.shards == [] and manifest.next_shard == 0
    assert int(stats.to_state()["count"].sum()) == 0
    assert "the part starts over" in caplog.text
