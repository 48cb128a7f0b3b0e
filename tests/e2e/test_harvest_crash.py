"""A harvest survives a SIGKILL of its node: the restarted node's reaper hands it back, each of
its parts that was running continues after its last complete shard (not from scratch), and its
files equal those of an uninterrupted run of the same prompts; each shard is charged once.

One node on embedded SQLite, killed with its whole process group mid-harvest, then started again
on the same VLLM_ACS_HOME and a new port.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.torch import load

from tests.e2e.crashed_node import RESTARTED_LEASE_MS, crash_node, read_sqlite
from tests.e2e.jobs_client import wait_harvest_ended
from tests.harness import MODEL_ID, sigkill_group, started
from tests.reference import assert_rows_close

pytestmark = pytest.mark.e2e

N_PROMPTS, SHARD_SIZE = 240, 4
N_SHARDS = N_PROMPTS // SHARD_SIZE
KILL_AFTER_SHARDS = 3
# The parts of its 60 shards (the defaults): 4 shards each, 1 running at a time on the node.
PART_SHARDS, PARTS_PER_NODE = 4, 1


# Two prompts in the engine at a time: the harvest takes seconds, the kill lands inside.
IN_FLIGHT = {"VLLM_ACS_HARVEST_PROMPTS_IN_FLIGHT": "2"}


def _body() -> dict[str, Any]:
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(3, 1000, size=60)] for _ in range(N_PROMPTS)]
    return {"model": MODEL_ID, "prompts": prompts, "layers": [1, 3], "shard_size": SHARD_SIZE}


def _files(home: Path, job_id: str) -> Path:
    return home / "files" / "harvests" / job_id


def _manifest(home: Path, job_id: str) -> dict[str, Any] | None:
    path = _files(home, job_id) / "manifest.json"
    return json.loads(path.read_bytes()) if path.exists() else None


def _shards_of_parts(home: Path, job_id: str) -> dict[int, list[int]]:
    """The shards each part has listed as complete (its manifest in _parts/), by part."""
    listed = {}
    for path in sorted((_files(home, job_id) / "_parts").glob("part_*.json")):
        part = json.loads(path.read_bytes())
        listed[part["part"]] = [int(s["file"][6:11]) for s in part["shards"]]
    return listed


def _states_of_parts(home: Path, job_id: str) -> dict[int, list[int]]:
    """The statistics states each part has in _parts/ (state_PPPP_NNNNN: after NNNNN shards)."""
    states: dict[int, list[int]] = {}
    for path in sorted((_files(home, job_id) / "_parts").glob("state_*.safetensors")):
        part, done = path.stem.split("_")[1:]
        states.setdefault(int(part), []).append(int(done))
    return states


def _usage(home: Path, job_id: str) -> list[sqlite3.Row]:
    """(request_id, prompt_tokens) of the harvest's shard charges, in shard order."""
    return read_sqlite(
        home,
        "SELECT request_id, prompt_tokens FROM usage_rows WHERE request_id LIKE ? "
        "ORDER BY request_id",
        f"{job_id}-shard-%",
    )


def test_a_killed_harvest_resumes_after_its_last_shard_and_matches_an_uninterrupted_run(
    tiny_model_dir, tmp_path_factory
):
    home = tmp_path_factory.mktemp("harvest-crash-home")
    first = crash_node(tiny_model_dir, home, "node-first", env=IN_FLIGHT)
    with started(first):
        key = first.create_key("harvest-crash")
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=first.base_url, headers=auth, timeout=120) as client:
            submitted = client.post("/v1/harvest", json=_body())
            assert submitted.status_code == 202, submitted.text
            job_id = submitted.json()["job_id"]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                progress = client.get(f"/v1/harvest/{job_id}").json()["progress"]
                if progress["shards_done"] >= KILL_AFTER_SHARDS:
                    break
                time.sleep(0.05)
        sigkill_group(first.process.pid)

    # Killed mid-harvest: some shards complete, not all (else this proves nothing).
    assert _manifest(home, job_id) is None
    at_kill = _shards_of_parts(home, job_id)
    done_at_kill = sorted(n for shards in at_kill.values() for n in shards)
    assert KILL_AFTER_SHARDS <= len(done_at_kill) < N_SHARDS, at_kill
    charged_at_kill = len(_usage(home, job_id))
    # Each part keeps the statistics state its manifest names, and the one before it (its delete
    # cut short by the kill) or the next (written before the manifest that names it): two at
    # most, not one per shard.
    for part, states in _states_of_parts(home, job_id).items():
        listed = len(at_kill.get(part, []))
        assert set(states) <= {listed - 1, listed, listed + 1} and len(states) <= 2, (
            part,
            states,
            at_kill,
        )

    second = crash_node(
        tiny_model_dir, home, "node-second", lease_ms=RESTARTED_LEASE_MS, env=IN_FLIGHT
    )
    with started(second), httpx.Client(base_url=second.base_url, headers=auth, timeout=120) as c:
        job = wait_harvest_ended(c, job_id, [second])
        assert job["status"] == "done", (job, second.log_tail())
        assert job["result"]["n_shards"] == N_SHARDS
        assert job["progress"]["shards_done"] == N_SHARDS
        log = second.log_path.read_text()
        # Each part cut short resumes after its last listed shard; no listed shard is captured
        # again, and every shard not listed at the kill is written by the restarted node.
        for part, shards in at_kill.items():
            if shards and len(shards) < PART_SHARDS:
                assert f"harvest {job_id} part {part} resumes after shard {shards[-1]}" in log
        for number in range(N_SHARDS):
            wrote = f"harvest {job_id} wrote shard_{number:05d}.safetensors" in log
            assert wrote == (number not in done_at_kill), number

        # The same prompts, uninterrupted, on the same node.
        reference = c.post("/v1/harvest", json=_body())
        assert reference.status_code == 202, reference.text
        reference_id = reference.json()["job_id"]
        assert wait_harvest_ended(c, reference_id, [second])["status"] == "done"

    resumed, uninterrupted = _files(home, job_id), _files(home, reference_id)
    rows_identical = True
    for number in range(N_SHARDS):
        name = f"shard_{number:05d}.safetensors"
        got, want = load((resumed / name).read_bytes()), load((uninterrupted / name).read_bytes())
        assert got.keys() == want.keys(), name
        for tensor in want:
            if tensor.startswith("tokens_"):
                assert got[tensor].equal(want[tensor]), (name, tensor)
                continue
            # Which prompts share a step differs between the runs (two in flight, timing), and
            # vLLM's kernels are not batch-invariant: rows may round a bf16 step apart.
            assert_rows_close(got[tensor].float().numpy(), want[tensor].float().numpy(), tensor)
            rows_identical = rows_identical and bool(got[tensor].equal(want[tensor]))
    got_stats = load((resumed / "stats.safetensors").read_bytes())
    want_stats = load((uninterrupted / "stats.safetensors").read_bytes())
    assert got_stats.keys() == want_stats.keys()
    for name in want_stats:
        if rows_identical:  # the usual case: merged exactly, not approximately
            assert got_stats[name].equal(want_stats[name]), name
        else:
            np.testing.assert_allclose(
                got_stats[name].numpy(),
                want_stats[name].numpy(),
                rtol=1e-3,
                atol=1e-4,
                err_msg=name,
            )
    manifest, reference_manifest = _manifest(home, job_id), _manifest(home, reference_id)
    assert manifest is not None and reference_manifest is not None
    assert manifest["shards"] == reference_manifest["shards"]
    # Merged: no part's statistics state is left.
    assert _states_of_parts(home, job_id) == {} == _states_of_parts(home, reference_id)

    rows = _usage(home, job_id)
    # Every listed shard was charged before it was listed; one more per running part may have
    # been charged and not listed yet, and its rerun found its row.
    assert len(done_at_kill) <= charged_at_kill <= len(done_at_kill) + PARTS_PER_NODE
    assert [r[0] for r in rows] == [f"{job_id}-shard-{n:05d}" for n in range(N_SHARDS)]
    assert sum(r[1] for r in rows) == N_PROMPTS * 60
