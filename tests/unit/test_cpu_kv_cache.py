"""cpu_kv_cache.py: the KV cache a CPU node starts with when its operator set none."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from vllm_acs.cpu_kv_cache import (
    FLOOR_BYTES,
    MIB,
    KvCacheTooSmall,
    apply_default,
    bytes_per_token,
    choose,
)
from vllm_acs.tiny_model import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def test_the_tiny_model_gets_the_floor_not_most_of_the_machine(tiny: Path):
    # 4 layers x 1 KV head x 64 dims x K and V x bf16.
    assert bytes_per_token(tiny) == 2 * 4 * 1 * 64 * 2
    choice = choose(str(tiny), 2048, available_bytes=20 * 1024 * MIB)
    assert choice.size_bytes == FLOOR_BYTES


def test_a_large_model_is_capped_at_half_the_free_memory(tmp_path: Path):
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,'
        ' "hidden_size": 4096, "torch_dtype": "bfloat16"}'
    )
    assert bytes_per_token(tmp_path) == 2 * 32 * 8 * 128 * 2
    choice = choose(str(tmp_path), 8192, available_bytes=9 * 1024 * MIB)
    assert choice.size_bytes == int(9 * 1024 * MIB * 0.5)
    assert "half the free memory" in choice.reason


def test_a_model_whose_one_sequence_cannot_fit_is_refused_with_what_to_set(tmp_path: Path):
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096}'
    )
    # 512 KiB a token: 131072 tokens need 64 GiB; half of 8 GiB is free for it.
    with pytest.raises(KvCacheTooSmall, match=r"--max-model-len.*VLLM_CPU_KVCACHE_SPACE"):
        choose(str(tmp_path), 131072, available_bytes=8 * 1024 * MIB)


def test_a_model_not_on_disk_gets_a_modest_default():
    choice = choose("meta-llama/Llama-3.1-8B", 8192, available_bytes=64 * 1024 * MIB)
    assert choice.size_bytes == 4 * FLOOR_BYTES


@pytest.mark.parametrize(
    ("environ", "args", "argv"),
    [
        ({"VLLM_CPU_KVCACHE_SPACE": "2"}, {}, []),
        ({}, {"kv_cache_memory_bytes": 123}, []),
        ({}, {}, ["--gpu-memory-utilization", "0.5"]),
        ({}, {}, ["--gpu-memory-utilization=0.5"]),
    ],
)
def test_the_operators_own_setting_wins(tiny: Path, environ, args, argv):
    namespace = types.SimpleNamespace(
        model_tag=str(tiny),
        model=None,
        max_model_len=2048,
        **{"kv_cache_memory_bytes": None, **args},
    )
    apply_default(namespace, environ, argv)
    assert namespace.kv_cache_memory_bytes == args.get("kv_cache_memory_bytes")


def test_unset_it_is_chosen_and_logged(tiny: Path, caplog: pytest.LogCaptureFixture):
    namespace = types.SimpleNamespace(
        model_tag=str(tiny), model=None, max_model_len=None, kv_cache_memory_bytes=None
    )
    with caplog.at_level("INFO"):
        apply_default(namespace, {}, [])
    assert 0 < namespace.kv_cache_memory_bytes <= FLOOR_BYTES
    assert "VLLM_CPU_KVCACHE_SPACE" in caplog.text
