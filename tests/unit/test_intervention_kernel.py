"""The fused kernel of `vllm_acs::intervene` (hooks/intervention_kernel.py) against the reference
(`apply_interventions`), on CPU through Triton's interpreter: the GPU check's stage 1 run as
`python -m benchmarks.gpu_check --interpret` in a subprocess (TRITON_INTERPRET must be set before
triton is imported, and must not leak into this process), one test per PASS line it must print.

Tolerance (benchmarks/gpu_check.py says it in full): the interpreter rounds float32 to bf16 by
truncation where a GPU rounds to nearest-even, so every rounded value is held to one step (ulp)
of its dtype here, and a norm-matched token to one step everywhere (the norm's sum runs in
another order than torch's). What the kernel must not touch is held bit-identical.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip(
        "Triton is not installed: the fused kernel cannot run, not even in its interpreter",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[2]
TAGS = ("bf16 h64", "bf16 h96 in slices of 32", "fp16 h64", "fp16 h96 in slices of 32")
PER_CASE = (
    "tokens at rest, capture-only tokens and padding rows untouched",
    "plain steer equals the reference",
    "norm-matched steer within 1 ulp of the reference",
    "captured rows equal hidden + residual",
    "capture equals the reference wherever the steered stream does",
    "other capture rows and the scratch row keep the sentinel",
    "a call at rest writes nothing",
)
CHECKS = [f"{tag}: {check}" for tag in TAGS for check in PER_CASE] + [
    "the op's CUDA implementation runs the fused kernel",
    "stands on torch and Triton alone, no vLLM imported",
]


@pytest.fixture(scope="module")
def stage1(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu-check")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--interpret", str(out)],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = {}
    for line in done.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("PASS", "FAIL"):
            name = rest.split(" (")[0]
            lines[name] = line
    return {"done": done, "lines": lines, "out": out}


@pytest.mark.parametrize("name", CHECKS)
def test_the_kernel_under_the_interpreter(stage1: dict, name: str) -> None:
    line = stage1["lines"].get(name)
    assert line is not None, (
        f"no line for {name!r}:\n{stage1['done'].stdout}\n{stage1['done'].stderr}"
    )
    assert line.startswith("PASS"), line


def test_the_stage_passes_and_writes_its_log_and_figures(stage1: dict) -> None:
    done, out = stage1["done"], stage1["out"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout
    assert (out / "stage1.log").read_text().splitlines()[-1] == "stage1: all passed"
    result = json.loads((out / "stage1.json").read_text())
    assert result["mode"] == "interpret"
    assert set(result["checks"]) == set(CHECKS)
    assert result["figures"]["bf16 h64"]["plain_ulps"] <= 1


def test_the_op_imports_without_triton() -> None:
    """The CPU build may lack Triton: the op (and its CPU kernel) must not need it to import."""
    code = (
        "import sys\n"
        "sys.modules['triton'] = None\n"  # import triton now raises ImportError
        "import torch\n"
        "from vllm_acs.hooks import intervention_op\n"
        "h = torch.zeros(2, 4); cap = torch.zeros(2, 4, dtype=torch.bfloat16)\n"
        "idx = torch.zeros(2, 3, 1, dtype=torch.int32); idx[:, 2] = 1\n"
        "intervention_op.intervene()(h, h, torch.zeros(2, 4), idx, cap, 0)\n"
        "print(intervention_op._fused() is intervention_op.apply_interventions)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"  # on CUDA it would fall back to the reference
    assert "fused intervention kernel is unavailable" in done.stderr
