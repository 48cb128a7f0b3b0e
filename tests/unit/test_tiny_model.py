"""`vllm-acs tiny-model`: deterministic bytes, the documented shape, a working tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vllm_acs.tiny_model import BOS_TOKEN, EOS_TOKEN, write_tiny_model


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_same_command_same_bytes(tmp_path: Path):
    for name in ("a", "b"):
        subprocess.run(
            [sys.executable, "-m", "vllm_acs.cli", "tiny-model", str(tmp_path / name)], check=True
        )
    first, second = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert set(first) == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert first == second


def test_shape_and_dtype(tmp_path: Path):
    from safetensors import safe_open

    out = write_tiny_model(tmp_path / "m")
    config = json.loads((out / "config.json").read_text())
    assert config["hidden_size"] == 128
    assert config["num_hidden_layers"] == 4
    assert config["num_attention_heads"] == 2 and config["head_dim"] == 64
    assert config["num_key_value_heads"] == 1
    assert config["vocab_size"] == 1024
    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        embed = weights.get_tensor("model.embed_tokens.weight")
        assert str(embed.dtype) == "torch.bfloat16"
        assert tuple(embed.shape) == (1024, 128)
        assert len(list(weights.keys())) == 2 + 9 * 4 + 1


def test_tokenizer_is_byte_level_with_bos(tmp_path: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(write_tiny_model(tmp_path / "m"))
    assert len(tokenizer) == 1024
    assert tokenizer.bos_token == BOS_TOKEN and tokenizer.eos_token == EOS_TOKEN
    text = "Grüße, 世界! \t ok"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids[1:]) == text  # byte-level: any text round-trips
    assert tokenizer("")["input_ids"] == [tokenizer.bos_token_id]
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids[1:]
