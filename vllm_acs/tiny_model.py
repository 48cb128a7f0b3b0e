"""Writes a deterministic tiny Llama (random weights, fixed seed) and a byte-level BPE tokenizer.

Runs in the CLI (`vllm-acs tiny-model DIR`) and in the test harness. Everything is made locally:
the same call writes the same bytes, and both vLLM and `transformers` load the result.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from .private_paths import make_private_folder

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN)


@dataclass(frozen=True)
class TinyLlamaShape:
    """The architecture. Heads of 64 dims: the CPU attention kernels need 32/64/128-dim heads."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    vocab_size: int = 1024
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    seed: int = 20261129


# A fixed, varied English text: the BPE merges are learned from it, so it must never change
# (or every test fixture's token ids change with it).
_CORPUS_SENTENCES = (
    "The sky is blue and the grass is green.",
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Once upon a time there was a small model that learned to continue text.",
    "Researchers read the residual stream of a language model to understand it.",
    "A steering vector is added to the hidden state at one layer of the network.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 appear in many documents.",
    "She said: \"Hello, world!\" and then he asked, 'How are you today?'",
    "def main():\n    print('hello')\n    return 0\n",
    "In the beginning the weather was cold; later it became warm and sunny.",
    "Tokens, logits, probabilities, samples: every completion is made of them.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Music, mathematics, history, biology, chemistry, physics and philosophy.",
)


def _corpus() -> list[str]:
    words = sorted({w.strip(".,;:!?\"'()") for s in _CORPUS_SENTENCES for w in s.split()})
    lines = list(_CORPUS_SENTENCES) * 20
    # Word pairs give the trainer enough distinct pairs to reach the full vocabulary.
    for i, first in enumerate(words):
        for second in words[i + 1 : i + 40]:
            lines.append(f"{first} {second} {second.lower()}{first.lower()}")
    return lines


def build_tokenizer(vocab_size: int):
    """A byte-level BPE with a BOS token prepended by the post-processor, as Llama 3 does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"tiny tokenizer has {tokenizer.get_vocab_size()} tokens, expected {vocab_size}"
        )
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN} $A",
                pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ]
    )
    return tokenizer


def build_weights(shape: TinyLlamaShape, bos_id: int, eos_id: int) -> dict:
    """Random bf16 weights from a fixed seed, named as Llama checkpoints name them."""
    import torch

    generator = torch.Generator().manual_seed(shape.seed)

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=generator) * std).to(torch.bfloat16)

    def norm_weight() -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(shape.hidden_size, generator=generator)).to(torch.bfloat16)

    h, inter = shape.hidden_size, shape.intermediate_size
    q_dim = shape.num_attention_heads * shape.head_dim
    kv_dim = shape.num_key_value_heads * shape.head_dim
    tensors: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": normal(shape.vocab_size, h, 1.0)
    }
    for i in range(shape.num_hidden_layers):
        prefix = f"model.layers.{i}"
        tensors[f"{prefix}.input_layernorm.weight"] = norm_weight()
        tensors[f"{prefix}.self_attn.q_proj.weight"] = normal(q_dim, h, 1 / math.sqrt(h))
        tensors[f"{prefix}.self_attn.k_proj.weight"] = normal(kv_dim, h, 1 / math.sqrt(h))
        tensors[f"{prefix}.self_attn.v_proj.weight"] = normal(kv_dim, h, 1 / math.sqrt(h))
        tensors[f"{prefix}.self_attn.o_proj.weight"] = normal(h, q_dim, 1 / math.sqrt(q_dim))
        tensors[f"{prefix}.post_attention_layernorm.weight"] = norm_weight()
        tensors[f"{prefix}.mlp.gate_proj.weight"] = normal(inter, h, 1 / math.sqrt(h))
        tensors[f"{prefix}.mlp.up_proj.weight"] = normal(inter, h, 1 / math.sqrt(h))
        tensors[f"{prefix}.mlp.down_proj.weight"] = normal(h, inter, 1 / math.sqrt(inter))
    tensors["model.norm.weight"] = norm_weight()
    # A wide logit spread keeps greedy choices far from bf16 ties, so vLLM and transformers agree.
    lm_head = normal(shape.vocab_size, h, 0.5)
    # Never sample BOS or EOS: generations then always run to max_tokens, which tests rely on.
    lm_head[bos_id] = 0
    lm_head[eos_id] = 0
    tensors["lm_head.weight"] = lm_head.contiguous()
    return tensors


def _config(shape: TinyLlamaShape, bos_id: int, eos_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
    }


def _tokenizer_config(bos_id: int, eos_id: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "add_bos_token": False,  # the post-processor adds it
        "model_max_length": TinyLlamaShape.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": None,
        "added_tokens_decoder": {
            str(bos_id): {"content": BOS_TOKEN, "special": True},
            str(eos_id): {"content": EOS_TOKEN, "special": True},
        },
    }


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_tiny_model(directory: str | Path, shape: TinyLlamaShape | None = None) -> Path:
    """Writes config, tokenizer and bf16 safetensors weights into `directory`; returns it."""
    from safetensors.torch import save_file

    shape = shape or TinyLlamaShape()
    out = Path(directory)
    make_private_folder(out)  # `make serve` writes it into the data home
    tokenizer = build_tokenizer(shape.vocab_size)
    bos_id, eos_id = tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)

    tokenizer.save(str(out / "tokenizer.json"), pretty=True)
    _write_json(out / "tokenizer_config.json", _tokenizer_config(bos_id, eos_id))
    _write_json(out / "special_tokens_map.json", {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN})
    _write_json(out / "config.json", _config(shape, bos_id, eos_id))
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": False},
    )
    save_file(
        build_weights(shape, bos_id, eos_id),
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return out
