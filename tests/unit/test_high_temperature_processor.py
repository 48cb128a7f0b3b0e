"""hooks/temperature.py on plain tensors: the right rows are divided, moves and swaps followed."""

from __future__ import annotations

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from vllm_acs.hooks.temperature import HighTemperatureLogitsProcessor


def _params(scale: float | None) -> SamplingParams:
    return SamplingParams(extra_args={"acs_temperature_scale": scale} if scale else None)


def _update(added=(), removed=(), moved=()) -> BatchUpdate:
    return BatchUpdate(batch_size=4, removed=list(removed), added=list(added), moved=list(moved))


def _scales(processor, rows: int = 4) -> list[float]:
    """The divisor each row's logits got."""
    return (12.0 / processor.apply(torch.full((rows, 3), 12.0))[:, 0]).tolist()


def test_only_rows_with_a_scale_are_divided():
    processor = HighTemperatureLogitsProcessor(None, torch.device("cpu"), False)
    assert processor.is_argmax_invariant()
    assert _scales(processor) == [1, 1, 1, 1]
    processor.update_state(
        _update(
            added=[(0, _params(None), [], []), (1, _params(4.0), [], []), (2, _params(3.0), [], [])]
        )
    )
    assert _scales(processor) == [1, 4, 3, 1]


def test_moves_swaps_and_removals_follow_the_requests():
    processor = HighTemperatureLogitsProcessor(None, torch.device("cpu"), False)
    processor.update_state(_update(added=[(1, _params(4.0), [], []), (2, _params(3.0), [], [])]))
    processor.update_state(_update(moved=[(1, 2, MoveDirectionality.SWAP)]))
    assert _scales(processor) == [1, 3, 4, 1]
    processor.update_state(_update(moved=[(2, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    assert _scales(processor) == [4, 3, 1, 1]
    processor.update_state(_update(removed=[0, 1]))
    assert _scales(processor) == [1, 1, 1, 1]
    processor.update_state(None)  # no change in the batch: nothing moves
    assert _scales(processor) == [1, 1, 1, 1]


def test_a_new_request_without_a_scale_replaces_the_old_row():
    processor = HighTemperatureLogitsProcessor(None, torch.device("cpu"), False)
    processor.update_state(_update(added=[(1, _params(4.0), [], [])]))
    processor.update_state(_update(added=[(1, _params(None), [], [])]))
    assert _scales(processor) == [1, 1, 1, 1]
