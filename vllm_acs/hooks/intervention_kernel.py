"""The fused CUDA kernel of `vllm_acs::intervene` (hooks/intervention_op.py): one Triton launch
per layer call, one program per token. Runs in a vLLM worker on a GPU; the tests run it on CPU
through Triton's interpreter (TRITON_INTERPRET=1, set before this module is imported).

Per token it does what `apply_interventions` (the reference) does, and nothing more:
- a token at rest (steer slot 0, norm slot 0, capture row = the scratch row, which is also what
  the padding rows past a step's tokens hold) reads its three indices and returns: it reads no
  stream and writes nothing, not even the scratch row;
- a steered token adds `bank[steer slot] + bank[norm slot] x |hidden + residual|` in float32 to
  its `hidden` row, rounded once to the model's dtype (the norm: that token's own stream, before
  this layer's vectors);
- a capturing token writes `hidden + residual` (after steering), rounded to the model's dtype and
  then to the buffer's, to its capture row.
The float operations are the reference's, in its order (no fused multiply-add), so on a GPU a
plain steer and a capture are bit-identical to it; only the norm's sum runs in another order.
A leaf module: torch and triton only, no vLLM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .intervention_op import CAPTURE_ROW, NORM_SLOT, STEER_SLOT, apply_interventions

# The widest slice of a row one program holds at a time: rows are walked in slices of this.
MAX_BLOCK = 1024


@triton.jit(do_not_specialize=["layer", "scratch"])
def _intervene(
    hidden_ptr,
    residual_ptr,
    bank_ptr,
    indices_ptr,
    capture_ptr,
    layer,
    scratch,
    width,
    hidden_stride,
    residual_stride,
    bank_stride,
    token_stride,
    field_stride,
    layer_stride,
    capture_stride,
    STEER: tl.constexpr,
    NORM: tl.constexpr,
    CAPTURE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    entry = indices_ptr + token * token_stride + layer * layer_stride
    steer = tl.load(entry + STEER * field_stride)
    norm_slot = tl.load(entry + NORM * field_stride)
    row = tl.load(entry + CAPTURE * field_stride)
    steers = (steer != 0) | (norm_slot != 0)
    captures = row != scratch
    if steers | captures:
        hidden_row = hidden_ptr + token * hidden_stride
        residual_row = residual_ptr + token * residual_stride
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        if norm_slot != 0:
            for start in range(0, width, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                inside = cols < width
                h = tl.load(hidden_row + cols, mask=inside, other=0.0).to(tl.float32)
                r = tl.load(residual_row + cols, mask=inside, other=0.0).to(tl.float32)
                stream = h + r
                squares += stream * stream
        norm = tl.sqrt_rn(tl.sum(squares, axis=0))
        plain_row = bank_ptr + steer.to(tl.int64) * bank_stride
        norm_row = bank_ptr + norm_slot.to(tl.int64) * bank_stride
        capture_row = capture_ptr + row.to(tl.int64) * capture_stride
        for start in range(0, width, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < width
            h = tl.load(hidden_row + cols, mask=inside, other=0.0)
            if steers:
                # As the reference: delta = plain + norm row x norm, and h + delta rounded once.
                plain = tl.load(plain_row + cols, mask=inside, other=0.0)
                scaled = tl.load(norm_row + cols, mask=inside, other=0.0) * norm
                h = (h.to(tl.float32) + (plain + scaled)).to(hidden_ptr.dtype.element_ty)
                tl.store(hidden_row + cols, h, mask=inside)
            if captures:
                r = tl.load(residual_row + cols, mask=inside, other=0.0)
                stream = (h.to(tl.float32) + r.to(tl.float32)).to(hidden_ptr.dtype.element_ty)
                tl.store(capture_row + cols, stream.to(capture_ptr.dtype.element_ty), mask=inside)


def launch(
    hidden: torch.Tensor,
    residual: torch.Tensor,
    bank: torch.Tensor,
    indices: torch.Tensor,
    capture_buffer: torch.Tensor,
    layer: int,
    *,
    block: int | None = None,
) -> None:
    """The op on `hidden`'s rows (rows past the step's tokens are padding, at rest in `indices`),
    in one launch. `block` narrows the slice a program holds (tests walk a row in several)."""
    tokens, width = hidden.shape
    if tokens == 0:
        return
    if any(t.stride(-1) != 1 for t in (hidden, residual, bank, capture_buffer)):
        # Never seen from a decoder layer; the reference handles any layout.
        apply_interventions(hidden, residual, bank, indices, capture_buffer, layer)
        return
    _intervene[(tokens,)](
        hidden,
        residual,
        bank,
        indices,
        capture_buffer,
        layer,
        capture_buffer.shape[0] - 1,
        width,
        hidden.stride(0),
        residual.stride(0),
        bank.stride(0),
        indices.stride(0),
        indices.stride(1),
        indices.stride(2),
        capture_buffer.stride(0),
        STEER=STEER_SLOT,
        NORM=NORM_SLOT,
        CAPTURE=CAPTURE_ROW,
        BLOCK=block or min(triton.next_power_of_2(width), MAX_BLOCK),
        num_warps=4,
        enable_fp_fusion=False,
    )
