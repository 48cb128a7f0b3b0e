"""A harvest's `manifest.json`: what the files hold and how to read them, rewritten after each
shard, so it always lists exactly the complete shards (which is where a resumed run continues).

API server process (the harvest job writes it; the job's answer and a resume read it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

LAYER_CONVENTION = (
    "layer k = the output of decoder block k (0-based) = transformers hidden_states[k+1] = "
    "TransformerLens blocks.k.hook_resid_post; the full residual stream"
)
BOS_HANDLING = (
    "string prompts are tokenized as /v1/completions tokenizes them (the tokenizer's BOS first); "
    "token-id prompts run exactly as given; each prompt's BOS row is kept in its shard, and left "
    "out of stats.safetensors (its own norm is bos_mean_norm)"
)


@dataclass(frozen=True)
class ShardEntry:
    file: str
    first_prompt: int
    last_prompt: int  # inclusive
    n_tokens: int
    bytes: int


@dataclass
class Manifest:
    job_id: str
    model: str
    checkpoint: str
    tokenizer: str
    hidden_size: int
    n_model_layers: int
    layer_indices: list[int]
    n_prompts: int
    shard_size: int
    max_prompt_tokens: int
    truncated_prompts: list[int]
    bos_token_id: int | None
    vllm_version: str
    vllm_acs_version: str
    shards: list[ShardEntry] = field(default_factory=list)
    complete: bool = False
    dtype: str = "bfloat16"
    layer_convention: str = LAYER_CONVENTION
    bos_handling: str = BOS_HANDLING
    tensors: dict[str, str] = field(
        default_factory=lambda: {
            "prompt_{i}": "bfloat16 [n_layers_kept, n_tokens, hidden]",
            "tokens_{i}": "int32 [n_tokens], the token axis of prompt_{i}",
        }
    )

    @property
    def prompts_done(self) -> int:
        return self.shards[-1].last_prompt + 1 if self.shards else 0

    @property
    def n_tokens(self) -> int:
        return sum(shard.n_tokens for shard in self.shards)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), indent=2).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        raw: dict[str, Any] = json.loads(data)
        raw["shards"] = [ShardEntry(**entry) for entry in raw.get("shards", [])]
        return cls(**raw)
