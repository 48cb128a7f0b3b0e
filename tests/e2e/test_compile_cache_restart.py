"""A compiled engine restarted on a warm compile cache with other buffer sizes
(`VLLM_ACS_CAPTURE_BUFFER_MB`, `VLLM_ACS_STEERING_SLOTS`): the sizes are in the compile-cache key
(hooks/compat.py `mark_compile_cache`), so the second start compiles its own entry instead of
loading the first one's graphs, and its capture equals the first start's, bit for bit.

Two starts of the CPU engine in vLLM's default compiled mode (hooks_engine_driver.py, config
`restart`), one cache folder (VLLM_CACHE_ROOT) between them.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.test_hooks_engine import ROW_TOLERANCE, _run_driver
from tests.reference import row_errors, transformers_blocks
from vllm_acs.activations.codec import bf16_bits_to_float

pytestmark = pytest.mark.e2e

# (VLLM_ACS_CAPTURE_BUFFER_MB, VLLM_ACS_STEERING_SLOTS) of the first start, then of the second.
SIZES = (("1", "8"), ("3", "16"))


def _start(
    model_dir: Path, out_dir: Path, cache: Path, sizes: tuple[str, str], monkeypatch
) -> tuple[dict[str, Any], str]:
    out_dir.mkdir()
    with monkeypatch.context() as env:
        env.setenv("VLLM_CACHE_ROOT", str(cache))
        env.setenv("VLLM_ACS_CAPTURE_BUFFER_MB", sizes[0])
        env.setenv("VLLM_ACS_STEERING_SLOTS", sizes[1])
        code, log = _run_driver(model_dir, out_dir, "restart", "compiled", timeout=480)
    assert code == 0, f"driver (sizes {sizes}) failed ({code}):\n{log[-4000:]}"
    with open(out_dir / "restart-compiled.pkl", "rb") as handle:
        return pickle.load(handle), log


def test_a_restart_with_other_buffer_sizes_compiles_anew_and_captures_the_same(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cache = tmp_path / "vllm-cache"
    first, _ = _start(tiny_model_dir, tmp_path / "first", cache, SIZES[0], monkeypatch)
    second, log = _start(tiny_model_dir, tmp_path / "second", cache, SIZES[1], monkeypatch)
    one, two = first["worker"], second["worker"]
    # The sizes took effect, and the key says so.
    assert one["capture_shape"] != two["capture_shape"]
    assert one["bank_shape"] != two["bank_shape"]
    assert one["cache_key"] != two["cache_key"]
    # The first start compiled into the empty cache; the second did not load that entry but
    # compiled and saved its own (vLLM names an AOT entry by the hash of its key).
    assert (one["aot_compiled"], one["aot_loaded"]) == (1, 0)
    assert (two["aot_compiled"], two["aot_loaded"]) == (1, 0)
    entries = list((cache / "torch_compile_cache" / "torch_aot_compile").iterdir())
    assert len(entries) == 2, entries
    # Before the sizes were in the key, this start tried the first entry: the CPU build of
    # vLLM 0.32 fails to load it ("'function' object has no attribute 'finalize_loading'") and
    # compiles again; where the load works, the graphs traced for the first start's buffers ran.
    assert "Directly load AOT compilation" not in log
    assert "due to a load failure" not in log
    # The capture is the same, and right.
    a, b = first["capture"], second["capture"]
    assert a["generated"] == b["generated"]
    np.testing.assert_array_equal(a["capture"], b["capture"])
    reference = transformers_blocks(tiny_model_dir)
    got = bf16_bits_to_float(b["capture"])
    want = reference(b["prompt"] + b["generated"][:-1])[[0, 1, 2, 3]]
    assert row_errors(got, want).max() < ROW_TOLERANCE
