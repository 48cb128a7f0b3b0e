"""Capture and steering in the real vLLM engine (offline `vllm.LLM`, CPU build, tiny Llama), in
eager mode and in vLLM's default compiled mode (inductor), with the same tests.

Each engine configuration runs once per mode in a subprocess (hooks_engine_driver.py) that is
bounded in time and killed with its process group; the tests below check its pickled results
against `transformers` on the same weights and against unsteered runs.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.reference import row_errors, transformers_blocks
from vllm_acs.activations.codec import bf16_bits_to_float

pytestmark = pytest.mark.e2e

DRIVER = Path(__file__).with_name("hooks_engine_driver.py")
ROOT = Path(__file__).resolve().parents[2]
# Relative error per row between vLLM (bf16) and transformers (fp32); measured ~0.012 max here.
ROW_TOLERANCE = 0.03


# benchmarks/gpu_check.sh adds the GPU's CUDA-graph modes (piecewise, full) through this variable.
MODES = tuple(os.environ.get("ACS_HOOK_ENGINE_MODES", "eager,compiled").split(","))


def _run_driver(
    model_dir: Path, out_dir: Path, config: str, mode: str, timeout: float
) -> tuple[int, str]:
    out_file = out_dir / f"{config}-{mode}.pkl"
    log_file = out_dir / f"{config}-{mode}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT)}
    with open(log_file, "w") as log:
        process = subprocess.Popen(
            [sys.executable, str(DRIVER), str(model_dir), str(out_file), config, mode],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            # vLLM's EngineCore and worker live in this session: leave none behind.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return code, log_file.read_text(errors="replace")


def _results(model_dir: Path, out_dir: Path, config: str, mode: str) -> dict[str, Any]:
    code, log = _run_driver(model_dir, out_dir, config, mode, timeout=480)  # CI: up to 96 s
    assert code == 0, f"driver {config} ({mode}) failed ({code}):\n{log[-4000:]}"
    with open(out_dir / f"{config}-{mode}.pkl", "rb") as handle:
        return pickle.load(handle)


@pytest.fixture(scope="module", params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def wide(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, mode: str):
    return _results(tiny_model_dir, tmp_path_factory.mktemp("hooks-wide"), "wide", mode)


@pytest.fixture(scope="module")
def chunked(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, mode: str):
    return _results(tiny_model_dir, tmp_path_factory.mktemp("hooks-chunked"), "chunked", mode)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path):
    return transformers_blocks(tiny_model_dir)


def _check_against_reference(result: dict[str, Any], layers: list[int], reference) -> None:
    prompt, generated = result["prompt"], result["generated"]
    got = bf16_bits_to_float(result["capture"])
    assert got.shape == (len(layers), len(prompt) + len(generated) - 1, 128)
    want = reference(prompt + generated[:-1])[layers]
    assert row_errors(got, want).max() < ROW_TOLERANCE
    if got.shape[1] > 1:
        # The comparison can fail: rows off by one position are far apart (most of them; a
        # repeated token can give a close neighbour).
        assert np.median(row_errors(got[:, 1:], want[:, :-1])) > 10 * ROW_TOLERANCE


def test_capture_matches_transformers_on_prompt_and_generated_rows(wide, reference):
    result = wide["capture_single"]
    assert len(result["prompt"]) == 11 and len(result["generated"]) == 6
    _check_against_reference(result, [0, 1, 2, 3], reference)


def test_sixteen_concurrent_captures_of_different_lengths(wide, reference):
    results = wide["capture_batch16"]
    for i, result in enumerate(results[:16]):
        _check_against_reference(result, [0, 1, 2, 3] if i % 2 else [1, 3], reference)
    assert all("capture" not in r for r in results[16:])
    assert wide["leftover_files"] == []


def test_capture_does_not_read_the_prefix_cache(wide, reference):
    # The cache is live: the same prompt, plain, is served from it the second time...
    assert wide["prefix_plain_again"]["num_cached_tokens"] >= 256
    # ...but a capture request recomputes every token, so no row is missing.
    result = wide["prefix_capture"]
    assert result["num_cached_tokens"] == 0
    _check_against_reference(result, [0, 1, 2, 3], reference)


def test_the_op_runs_inside_every_forward_pass(wide, mode):
    """The worker counts the op's calls in a step: one per decoder layer, in the compiled graph
    as in eager mode (a graph compiled without it, or with it traced away, would count 0). On a
    GPU a CUDA graph replays its kernels without Python: there the captures prove it ran."""
    device, calls = wide["op_calls"]
    if device == "cpu" or mode == "eager":
        assert calls == 4
    else:  # the captures and steers of this module show it ran in the graph
        assert calls in (0, 4)


def test_scale_zero_reproduces_the_unsteered_text_and_large_scale_changes_it(wide):
    baseline = wide["steer_baseline"]["generated"]
    assert len(baseline) == 16
    # Bit-identical: the same tokens with the same logprobs (exact float equality).
    assert wide["steer_zero"]["generated"] == baseline
    assert wide["steer_zero"]["logprobs"] == wide["steer_baseline"]["logprobs"]
    # The zero-scale request really went through the steering path (the workers say so).
    assert wide["steer_zero"]["header"].rows_done == 9 + 16 - 1
    assert wide["steer_big"]["generated"] != baseline


def test_steering_one_request_leaves_its_batchmates_unchanged(wide):
    """Compared with the SAME batch run unsteered, not with solo runs: on this tiny bf16 model
    on CPU, batch composition alone can change greedy output (docs/vllm-notes.md)."""
    plain, steered = wide["batch_plain"], wide["batch_steered"]
    assert steered[0]["generated"] != plain[0]["generated"]
    for before, after in zip(plain[1:], steered[1:], strict=True):
        assert after["generated"] == before["generated"]


def test_plain_requests_beside_a_steered_and_a_capturing_one_are_bit_identical(wide, reference):
    plain, mixed = wide["mixed_plain"], wide["mixed"]
    assert mixed[0]["generated"] != plain[0]["generated"]  # the steered one changed
    for before, after in zip(plain[1:], mixed[1:], strict=True):
        assert after["generated"] == before["generated"]
        assert after["logprobs"] == before["logprobs"]
    _check_against_reference(mixed[1], [0, 2], reference)
    assert "capture" not in mixed[2] and "capture" not in mixed[3]


def _layer_rows(result: dict[str, Any]) -> np.ndarray:
    return bf16_bits_to_float(result["capture"])


def test_norm_match_scales_by_the_full_residual_stream(wide):
    plain, steered = _layer_rows(wide["nm_plain"]), _layer_rows(wide["nm_steered"])
    n_prompt = len(wide["nm_plain"]["prompt"])
    # Layer 0 runs before the steered layer: untouched, bit for bit (prompt rows).
    np.testing.assert_array_equal(steered[0, :n_prompt], plain[0, :n_prompt])
    stream = plain[1, :n_prompt]
    delta = steered[1, :n_prompt] - stream
    ratio = np.linalg.norm(delta, axis=-1) / np.linalg.norm(stream, axis=-1)
    # scale 0.5 of the norm of hidden + residual at each position (bf16 rounding aside).
    np.testing.assert_allclose(ratio, 0.5, rtol=0.03)


def _direction_check(delta: np.ndarray, vector: np.ndarray, stream: np.ndarray, scale: float):
    cosine = delta @ vector / (np.linalg.norm(delta) * np.linalg.norm(vector))
    assert cosine > 0.99
    assert np.linalg.norm(delta) / np.linalg.norm(stream) == pytest.approx(scale, rel=0.03)


def test_position_index_applies_during_decode_only_where_asked(wide):
    plain, steered = _layer_rows(wide["nm_plain"]), _layer_rows(wide["pos_decode"]["steered"])
    position = wide["pos_decode"]["position"]
    assert position >= len(wide["nm_plain"]["prompt"])  # a generated token's position
    np.testing.assert_array_equal(steered[:, :position], plain[:, :position])
    np.testing.assert_array_equal(steered[0, position], plain[0, position])
    delta = steered[1, position] - plain[1, position]
    _direction_check(delta, wide["pos_decode"]["vector"], plain[1, position], 2.0)


def test_chunked_prefill_sixteen_concurrent_captures(chunked, reference):
    results = chunked["capture_batch16"]
    assert max(len(r["prompt"]) for r in results) > 2 * 32  # prompts span several chunks
    for result in results:
        _check_against_reference(result, [0, 1, 2, 3], reference)
    assert chunked["leftover_files"] == []


def test_position_indices_in_a_later_prefill_chunk(chunked):
    plain, steered = _layer_rows(chunked["pos_plain"]), _layer_rows(chunked["pos_steered"])
    n_prompt = len(chunked["pos_plain"]["prompt"])
    vectors = chunked["pos_vectors"]  # row 0 for position -1 (the last prompt token), row 1 for 5
    last = n_prompt - 1  # 69: in the third 32-token chunk
    np.testing.assert_array_equal(steered[:2, :n_prompt], plain[:2, :n_prompt])
    untouched = [p for p in range(n_prompt) if p not in (5, last)]
    np.testing.assert_array_equal(steered[2, untouched], plain[2, untouched])
    _direction_check(steered[2, last] - plain[2, last], vectors[0], plain[2, last], 2.0)
    _direction_check(steered[2, 5] - plain[2, 5], vectors[1], plain[2, 5], 2.0)


@pytest.mark.parametrize("preempt_mode", MODES)
def test_capture_and_steering_survive_preemption(
    tiny_model_dir: Path, tmp_path: Path, reference, preempt_mode: str
):
    """A preempted request loses its KV blocks and is recomputed from position 0: its rows must
    still be complete and right, and a steered request's text unchanged by a zero vector."""
    result = _results(tiny_model_dir, tmp_path, "preempt", preempt_mode)
    assert result["preemptions"] >= 1
    for captured in result["captured"]:
        _check_against_reference(captured, [0, 1, 2, 3], reference)
    for plain, captured in zip(result["plain"], result["captured"], strict=True):
        assert captured["generated"] == plain["generated"]
    assert result["leftover_files"] == []
