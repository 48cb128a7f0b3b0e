"""The KV cache a CPU node starts with when its operator set none (`vllm-acs serve`, before vLLM
starts).

vLLM's CPU backend otherwise reserves `--gpu-memory-utilization` (0.92) of the machine's memory
and refuses to start when that much is not free, so a node on a machine that is also doing other
things fails at start-up for a tiny model that needs a few MB. Here: room for a number of
full-length sequences of this model (from its config.json), at least a floor, never more than
half of the memory that is free now. The operator's own setting wins: VLLM_CPU_KVCACHE_SPACE,
`--kv-cache-memory-bytes` or `--gpu-memory-utilization`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
FLOOR_BYTES = 256 * MIB
SEQUENCES = 16  # full-length sequences the default leaves room for
FREE_MEMORY_SHARE = 0.5
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


class KvCacheTooSmall(SystemExit):
    """Not even one full-length sequence fits in the memory this node may take: says what to
    set (raised before vLLM starts, which would name only its GPU setting)."""


@dataclass(frozen=True)
class KvCacheChoice:
    size_bytes: int
    reason: str


def operator_chose(args: Any, environ: Mapping[str, str], argv: Sequence[str]) -> bool:
    if environ.get("VLLM_CPU_KVCACHE_SPACE", "") != "":
        return True
    if getattr(args, "kv_cache_memory_bytes", None) is not None:
        return True
    return any(a.split("=", 1)[0] == "--gpu-memory-utilization" for a in argv)


def model_config(model_dir: Path) -> dict[str, Any]:
    """A local checkpoint's config.json (its text model's part); empty when the model is not a
    local directory."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config.get("text_config", config) if isinstance(config, dict) else {}


def bytes_per_token(model_dir: Path) -> int | None:
    """K and V of every layer for one token, from a local checkpoint's config.json (None when
    the model is not a local directory or its config says too little)."""
    config = model_config(model_dir)
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads", heads))
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    dtype = _DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or ""), 2)
    return 2 * layers * kv_heads * head_dim * dtype


def choose(model: str, max_model_len: int | None, available_bytes: int) -> KvCacheChoice:
    """The size for a node of `model` (a local directory or a hub name) with `available_bytes`
    free."""
    cap = int(available_bytes * FREE_MEMORY_SHARE)
    per_token = bytes_per_token(Path(model))
    if per_token is None or not max_model_len:
        want, why = FLOOR_BYTES * 4, "the model's size is unknown here"
    else:
        want = per_token * max_model_len * SEQUENCES
        why = f"{SEQUENCES} sequences of {max_model_len} tokens at {per_token} bytes a token"
    size = max(FLOOR_BYTES, want)
    if size <= cap:
        return KvCacheChoice(size, why)
    if per_token is not None and max_model_len and per_token * max_model_len > cap:
        raise KvCacheTooSmall(
            f"vllm-acs serve: one sequence of {max_model_len} tokens of this model needs "
            f"{per_token * max_model_len // MIB} MiB of KV cache, and half of the free memory is "
            f"{cap // MIB} MiB: lower --max-model-len, free memory, or set the size yourself "
            "(VLLM_CPU_KVCACHE_SPACE in GiB, or --kv-cache-memory-bytes)"
        )
    return KvCacheChoice(cap, f"{why} would need {size // MIB} MiB; half the free memory")


def apply_default(args: Any, environ: Mapping[str, str], argv: Sequence[str]) -> None:
    """Sets `args.kv_cache_memory_bytes` on a CPU node whose operator chose no size; logs it."""
    if operator_chose(args, environ, argv):
        return
    import psutil

    model = getattr(args, "model_tag", None) or args.model
    max_model_len = getattr(args, "max_model_len", None) or model_config(Path(model)).get(
        "max_position_embeddings"
    )
    choice = choose(model, max_model_len, psutil.virtual_memory().available)
    args.kv_cache_memory_bytes = choice.size_bytes
    logger.info(
        "vllm_acs: CPU KV cache %d MiB (%s); set VLLM_CPU_KVCACHE_SPACE (GiB) or "
        "--kv-cache-memory-bytes to choose another size",
        choice.size_bytes // MIB,
        choice.reason,
    )
