"""transformers on the tiny weights: the reference the captured residual stream must match."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def transformers_blocks(model_dir: Path) -> Callable[[list[int]], np.ndarray]:
    """Token ids -> every decoder block's output [n_layers, tokens, hidden], in fp32.

    Block k is `hidden_states[k + 1]`, except the last, which transformers returns normed: that
    one is read from the block itself with a forward hook.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    n_layers = model.config.num_hidden_layers

    def blocks(ids: list[int]) -> np.ndarray:
        grabbed: dict[str, Any] = {}

        def grab(module: Any, args: Any, output: Any) -> None:
            grabbed["last"] = output[0] if isinstance(output, tuple) else output

        handle = model.model.layers[-1].register_forward_hook(grab)
        try:
            with torch.no_grad():
                out = model(torch.tensor([ids]), output_hidden_states=True)
        finally:
            handle.remove()
        states = [out.hidden_states[k + 1][0] for k in range(n_layers - 1)]
        return torch.stack([*states, grabbed["last"][0]]).numpy()

    return blocks


def row_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Relative L2 error of each row (last axis)."""
    return np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)


# vLLM's kernels are not batch-invariant: a prompt computed in one step with others (a harvest) and
# alone (an inline capture) can round some bf16 values a step apart. A CI host showed it: 36 of a
# 4-token prompt's 1,024 values one bf16 step (0.0156) apart, a row error far below this bound. A
# wrong row (another token's or another layer's) is off by the order of 1.
BATCH_ROUNDING_TOLERANCE = 0.01  # relative L2 error per row


def assert_rows_close(
    got: np.ndarray, want: np.ndarray, what: str, tolerance: float = BATCH_ROUNDING_TOLERANCE
) -> None:
    """The same capture computed in another batch: equal shapes, every row within `tolerance`."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    worst = float(row_errors(got, want).max())
    assert worst <= tolerance, f"{what}: the worst row is {worst:.4f} off (relative L2)"
