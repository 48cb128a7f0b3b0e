"""The GPU check's stage 2 (benchmarks/gpu_check_model.py) on a tiny Llama on the CPU:
`python -m benchmarks.gpu_check --tiny` in a subprocess, so the script cannot rot between GPU
sessions. It proves the code path (the op on transformers' decoder layers, the modes' index rows,
the copy-out, the paired timing, the log and JSON), not the cost: the ratios are a GPU's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_check_model import MODES, SHAPES_TINY

ROOT = Path(__file__).resolve().parents[2]
PER_SHAPE = (
    "idle output bit-identical to plain",
    "captured rows equal the layer's output from output_hidden_states",
    "the replayed step captures the eager pass's rows, within 1%",
    "a steer adds its vector to the layer's output, rounded once",
)
CHECKS = [f"{shape}: {check}" for shape, _, _ in SHAPES_TINY for check in PER_SHAPE] + [
    "stands on torch, Triton and transformers alone, no vLLM imported"
]


@pytest.fixture(scope="module")
def stage2(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu-check")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--tiny", "--limit", "240", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return {"done": done, "out": out}


def test_the_tiny_stage_passes_every_check(stage2: dict) -> None:
    done = stage2["done"]
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {
        line.partition(" ")[2].split(" (")[0]: line
        for line in done.stdout.splitlines()
        if line.startswith(("PASS", "FAIL"))
    }
    assert set(lines) == set(CHECKS), done.stdout
    assert all(line.startswith("PASS") for line in lines.values()), done.stdout


def test_the_tiny_stage_writes_its_log_and_the_ratios_of_every_mode(stage2: dict) -> None:
    out = stage2["out"]
    assert (out / "stage2.log").read_text().splitlines()[-1] == "stage2: all passed"
    result = json.loads((out / "stage2.json").read_text())
    assert result["mode"] == "tiny"
    assert set(result["checks"]) == set(CHECKS)
    for shape, _, _ in SHAPES_TINY:
        figures = result["figures"][shape]
        assert figures["plain_step_ms"] > 0
        assert set(figures["ratios"]) == set(MODES)
        assert all(ratio["median"] > 0 for ratio in figures["ratios"].values())


def test_a_stage_past_its_time_limit_fails_and_keeps_its_log(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--tiny", "--limit", "1", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "FAIL stage 2 within its time limit (1 s)" in done.stdout
    result = json.loads((tmp_path / "stage2.json").read_text())
    assert result["checks"]["stage 2 within its time limit"] is False
    assert (tmp_path / "stage2.log").read_text().splitlines()[-1] == "stage2: 1 failed"
