"""The harvest kind over its parts (issue 33), on a real JobRepository (SQLite) and file store with
the parts played by the test: it queues its parts once (a resumed harvest adds none), merges
their files in order when all succeed (statistics equal to adding every row in order, within
float rounding), and fails with a failed part's error, naming the harvest, cancelling the rest.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_acs.auth.principal import Principal
from vllm_acs.auth.refusals import refusal
from vllm_acs.errors import error_body
from vllm_acs.harvest.context import HarvestContext, HarvestModel
from vllm_acs.harvest.inputs import HarvestRequest
from vllm_acs.harvest.job import HarvestJobKind
from vllm_acs.harvest.manifest import ShardEntry
from vllm_acs.harvest.parts import PART_KIND, PartManifest, part_manifest_name, part_state_name
from vllm_acs.harvest.shards import state_bytes
from vllm_acs.harvest.stats import LayerStats
from vllm_acs.jobs.kinds import JobOutcome, Stopped
from vllm_acs.settings import Settings
from vllm_acs.states import JobStatus
from vllm_acs.storage import open_storage
from vllm_acs.storage.errors import BudgetExhausted
from vllm_acs.storage.jobs import NewJob

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
HIDDEN, LAYERS = 8, (0, 2)
# 10 prompts in shards of 2: 5 shards, parts of 2 shards: 3 parts.
N_PROMPTS, SHARD_SIZE, PART_SHARDS = 10, 2, 2
MODEL = HarvestModel("tiny", "ckpt", HIDDEN, 4, 1, "0.0", "0.1")


def _request() -> HarvestRequest:
    return HarvestRequest(
        principal=Principal("key_1", "sk-acs-x", "acct_1"),
        layers=LAYERS,
        shard_size=SHARD_SIZE,
        batch_size=None,
        n_prompts=N_PROMPTS,
        n_tokens=N_PROMPTS * 3,
        max_prompt_tokens=100,
        truncated=(),
    )


class _FlakyReads:
    """The job repository, but its first read of the parts fails as in a database outage."""

    def __init__(self, jobs) -> None:
        self._jobs = jobs
        self.failed = 0

    def __getattr__(self, name: str):
        return getattr(self._jobs, name)

    async def parts_of(self, parent_id: str):
        if not self.failed:
            self.failed += 1
            raise OSError("connection refused")
        return await self._jobs.parts_of(parent_id)


def _scenario(tmp_path: Path, play_parts, *, flaky: bool = False):
    """Runs the harvest kind on a submitted harvest while `play_parts(storage, harvest)` plays
    its parts; returns what the kind answered."""

    async def main():
        url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"
        storage = await open_storage(Settings(database_url=url, home=tmp_path))
        woken = []
        context = HarvestContext(
            engine=None,
            files=storage.files,
            counters=storage.counters,
            usage=storage.usage,
            settings=SimpleNamespace(harvest_part_shards=PART_SHARDS),  # type: ignore[arg-type]
            model=lambda: MODEL,
            principal_now=lambda principal: principal,
            jobs=_FlakyReads(storage.jobs) if flaky else storage.jobs,  # type: ignore[arg-type]
            wake_runner=lambda: woken.append(1),
        )
        kind = HarvestJobKind(context, poll_s=0.02)
        new = NewJob("harvest", "key_1", "acct_1", "tiny", _request().to_json())
        await storage.jobs.submit(new, NOW)
        (harvest,) = await storage.jobs.claim_many("node-a", ["tiny"], NOW, 30, limit=1)
        stop = asyncio.Event()
        try:
            running = asyncio.create_task(kind.run(harvest, stop))
            played = await play_parts(storage, harvest)
            outcome = await asyncio.wait_for(running, 10)
            # A resumed harvest (another attempt, another node) queues the same parts: none
            # is added, and no runner is woken for them.
            await kind._queue_parts(harvest, kind.plan(_request()))
            assert woken == [1]
            parts = await storage.jobs.parts_of(harvest.id)
            assert len(parts) == 3
            return outcome, parts, played, woken, storage, harvest
        finally:
            await storage.close()

    return asyncio.run(main())


async def _parts_queued(storage, harvest):
    for _ in range(500):
        parts = await storage.jobs.parts_of(harvest.id)
        if parts:
            return parts
        await asyncio.sleep(0.01)
    raise AssertionError("no parts queued")


def _rows(rng: np.random.Generator, n_tokens: int) -> np.ndarray:
    return rng.standard_normal((len(LAYERS), n_tokens, HIDDEN)).astype(np.float32)


@pytest.mark.parametrize("flaky", [False, True], ids=["steady", "a-read-fails"])
def test_the_parts_are_merged_in_order_once_all_succeed(tmp_path, flaky):
    """(A failed read of its parts, as in a database outage, is read again, not a failure.)"""
    rng = np.random.default_rng(3)
    rows = [_rows(rng, 3) for _ in range(N_PROMPTS)]

    async def play(storage, harvest):
        parts = await _parts_queued(storage, harvest)
        assert [p.kind for p in parts] == [PART_KIND] * 3
        assert [p.request["plan"]["first_shard"] for p in parts] == [0, 2, 4]
        # Claimed by two "nodes", ended in reverse order: the merge is in shard order whatever
        # ended first.
        claimed_parts = []
        for owner in ["node-b", "node-c", "node-b"]:
            claimed_parts += await storage.jobs.claim_many(
                owner, ["tiny"], NOW, 30, [PART_KIND], limit=1
            )
        for claimed in reversed(claimed_parts):
            owner = claimed.owner
            plan = claimed.request["plan"]
            manifest = PartManifest(
                part=plan["index"],
                first_shard=plan["first_shard"],
                n_shards=plan["n_shards"],
                first_prompt=plan["first_prompt"],
                end_prompt=plan["end_prompt"],
                complete=True,
            )
            stats = LayerStats(len(LAYERS), HIDDEN)
            for shard in range(plan["first_shard"], plan["first_shard"] + plan["n_shards"]):
                first = shard * SHARD_SIZE
                last = min(first + SHARD_SIZE, N_PROMPTS) - 1
                for index in range(first, last + 1):
                    stats.add(rows[index])
                entry = ShardEntry(f"shard_{shard:05d}.safetensors", first, last, 6, 100)
                manifest.shards.append(entry)
            files = storage.files
            await files.write(part_manifest_name(harvest.id, plan["index"]), manifest.to_bytes())
            name = part_state_name(harvest.id, plan["index"], len(manifest.shards))
            await files.write(name, state_bytes(stats.to_state()))
            timings = {"forward_s": 1.0, "write_s": 0.5, "tokens": 6, "prompts": 2}
            body = json.dumps({"part": plan["index"], "timings": timings})
            assert await storage.jobs.finish(
                claimed.id, 0, owner, JobStatus.SUCCEEDED, NOW, result_status=200, result_body=body
            )
        return None

    outcome, _parts, _, woken, _storage, harvest = _scenario(tmp_path, play, flaky=flaky)
    assert woken == [1]  # its own node's runner was told of the parts, once
    assert isinstance(outcome, JobOutcome) and outcome.status is JobStatus.SUCCEEDED
    result = json.loads(outcome.result_body)
    assert result["files"] == [f"shard_{n:05d}.safetensors" for n in range(5)]
    assert result["timings"]["parts"] == 3 and result["timings"]["nodes"] == 2
    assert result["timings"]["tokens"] == 18 and result["timings"]["forward_s"] == 3.0

    async def read():
        url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"
        again = await open_storage(Settings(database_url=url, home=tmp_path))
        try:
            manifest = json.loads(await again.files.read(f"harvests/{harvest.id}/manifest.json"))
            stats = await again.files.read(f"harvests/{harvest.id}/stats.safetensors")
            return manifest, stats
        finally:
            await again.close()

    manifest, stats_file = asyncio.run(read())
    assert manifest["complete"] is True and manifest["job_id"] == harvest.id
    assert [(s["first_prompt"], s["last_prompt"]) for s in manifest["shards"]] == [
        (0, 1),
        (2, 3),
        (4, 5),
        (6, 7),
        (8, 9),
    ]
    from safetensors.numpy import load

    merged = load(stats_file)
    direct = LayerStats(len(LAYERS), HIDDEN)
    for prompt_rows in rows:
        direct.add(prompt_rows)
    for name, want in direct.final().items():
        np.testing.assert_allclose(merged[name], want, rtol=1e-6, atol=1e-7, err_msg=name)
    assert merged["layer_indices"].tolist() == list(LAYERS)


def test_a_failed_part_fails_the_harvest_with_its_error_and_cancels_the_rest(tmp_path):
    async def play(storage, harvest):
        parts = await _parts_queued(storage, harvest)
        (claimed,) = await storage.jobs.claim_many(
            "node-b", ["tiny"], NOW, 30, [PART_KIND], limit=1
        )
        assert claimed.id == parts[0].id
        error = refusal(BudgetExhausted("monthly_tokens"))
        body = json.dumps(error_body(error, claimed.id))
        assert await storage.jobs.finish(
            claimed.id,
            0,
            "node-b",
            JobStatus.FAILED,
            NOW,
            result_status=error.status,
            result_body=body,
            error_code=error.code,
        )
        return error

    outcome, parts, error, _, _, harvest = _scenario(tmp_path, play)
    assert isinstance(outcome, JobOutcome) and outcome.status is JobStatus.FAILED
    assert (outcome.result_status, outcome.error_code) == (error.status, "budget_exceeded")
    body = json.loads(outcome.result_body)
    assert body["request_id"] == harvest.id
    assert body["error"]["code"] == "budget_exceeded"
    assert [p.status for p in parts] == [
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
    ]


def test_a_cancelled_harvest_stops_without_an_outcome(tmp_path):
    async def play(storage, harvest):
        await _parts_queued(storage, harvest)
        await storage.jobs.cancel(harvest.id, None, NOW)
        await storage.jobs.cancel_parts(harvest.id, NOW)

    outcome, parts, *_ = _scenario(tmp_path, play)
    assert isinstance(outcome, Stopped)
    assert {p.status for p in parts} == {JobStatus.CANCELLED}
