"""A harvest's parts (issue 33): the plan cuts the shards of a one-node harvest into consecutive
ranges, the same on every node; a part's manifest reads back and adds up its progress."""

from __future__ import annotations

import itertools

import pytest

from vllm_acs.harvest.manifest import ShardEntry
from vllm_acs.harvest.parts import (
    MAX_PARTS,
    PartManifest,
    PartPlan,
    part_id,
    part_manifest_name,
    part_state_name,
    plan_parts,
)


@pytest.mark.parametrize(
    ("n_prompts", "shard_size", "part_shards"),
    [(1, 1, 1), (10, 3, 1), (10, 3, 2), (240, 4, 4), (241, 4, 4), (7, 32, 4), (1000, 1, 1)],
)
def test_the_parts_cover_every_shard_once_in_order(n_prompts, shard_size, part_shards):
    plans = plan_parts(n_prompts, shard_size, part_shards)
    n_shards = -(-n_prompts // shard_size)
    assert [p.index for p in plans] == list(range(len(plans)))
    assert plans[0].first_shard == 0 and plans[0].first_prompt == 0
    for before, after in itertools.pairwise(plans):
        assert after.first_shard == before.first_shard + before.n_shards
        assert after.first_prompt == before.end_prompt
    assert plans[-1].first_shard + plans[-1].n_shards == n_shards
    assert plans[-1].end_prompt == n_prompts
    for plan in plans:
        # A part starts on a shard boundary of the one-node harvest: its shards are its shards.
        assert plan.first_prompt == plan.first_shard * shard_size
        assert plan.n_shards <= max(part_shards, -(-n_shards // MAX_PARTS))
    assert len(plans) <= MAX_PARTS


def test_a_long_corpus_gets_longer_parts_not_more_of_them():
    plans = plan_parts(100_000, 1, 1)
    assert len(plans) == MAX_PARTS
    assert {p.n_shards for p in plans[:-1]} == {-(-100_000 // MAX_PARTS)}


def test_the_plan_refuses_an_empty_harvest():
    with pytest.raises(ValueError, match="n_prompts"):
        plan_parts(0, 4, 1)


def test_ids_and_file_names_are_the_same_on_every_node():
    assert part_id("job_abc", 3) == "job_abc-p0003"
    assert len(part_id("job_" + "f" * 24, 255)) <= 40  # jobs.id is String(40)
    assert part_manifest_name("job_abc", 3) == "harvests/job_abc/_parts/part_0003.json"
    assert part_state_name("job_abc", 3, 2) == (
        "harvests/job_abc/_parts/state_0003_00002.safetensors"
    )
    plan = PartPlan(index=2, first_shard=4, n_shards=2, first_prompt=16, end_prompt=23)
    assert PartPlan.from_json(plan.to_json()) == plan


def test_a_part_manifest_reads_back_and_adds_up_its_progress():
    plan = PartPlan(index=1, first_shard=2, n_shards=2, first_prompt=8, end_prompt=15)
    manifest = PartManifest.of(plan)
    assert (manifest.prompts_done, manifest.next_shard) == (8, 2)
    assert manifest.progress() == {"shards_done": 0, "prompts_done": 0, "rows_done": 0}
    manifest.shards.append(ShardEntry("shard_00002.safetensors", 8, 11, 40, 1000))
    read = PartManifest.from_bytes(manifest.to_bytes())
    assert read == manifest
    assert (read.prompts_done, read.next_shard) == (12, 3)
    assert read.progress() == {"shards_done": 1, "prompts_done": 4, "rows_done": 40}
