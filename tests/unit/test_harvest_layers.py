"""The harvest layer choice: quartile defaults at any depth, "all", a checked list, refusals."""

from __future__ import annotations

import pytest

from vllm_acs.harvest.layers import LayerChoiceError, default_layers, resolve_layers


@pytest.mark.parametrize(
    ("n_layers", "expected"),
    [(32, (8, 16, 24)), (4, (1, 2, 3)), (5, (1, 2, 3)), (3, (1, 2)), (2, (0, 1)), (1, (0,))],
)
def test_default_layers_are_the_quartile_blocks(n_layers: int, expected: tuple[int, ...]):
    assert default_layers(n_layers) == expected


@pytest.mark.parametrize("n_layers", range(1, 80))
def test_default_layers_are_never_empty_ascending_and_in_range(n_layers: int):
    layers = default_layers(n_layers)
    assert layers
    assert list(layers) == sorted(set(layers))
    assert all(0 <= layer < n_layers for layer in layers)


def test_default_layers_refuse_a_model_without_blocks():
    with pytest.raises(ValueError):
        default_layers(0)


def test_none_means_the_defaults():
    assert resolve_layers(None, 32) == (8, 16, 24)


def test_all_means_every_block():
    assert resolve_layers("all", 4) == (0, 1, 2, 3)


def test_a_list_comes_back_sorted():
    assert resolve_layers([5, 0, 3], 6) == (0, 3, 5)
    assert resolve_layers([0], 1) == (0,)


def test_a_choice_error_is_a_value_error():
    assert issubclass(LayerChoiceError, ValueError)


@pytest.mark.parametrize(
    ("requested", "fragment"),
    [
        ([4], "layer 4 is out of range: this model has blocks 0..3"),
        ([1, 100], "layer 100 is out of range"),
        ([-1], "layer -1 is out of range: this model has blocks 0..3"),
        ([2, 1, 2], "layer 2 is listed more than once"),
        ([], "must not be empty"),
        ([True], "integer block indices, got True"),
        ([1, False], "got False"),
        ([1.0], "got 1.0"),
        (["1"], "got '1'"),
        ("ALL", 'a list of block indices, "all", or omitted'),
        ("0,1", 'a list of block indices, "all", or omitted'),
        ("", 'a list of block indices, "all", or omitted'),
        (3, 'a list of block indices, "all", or omitted'),
    ],
)
def test_bad_choices_are_refused_with_a_message_for_the_user(requested: object, fragment: str):
    with pytest.raises(LayerChoiceError) as caught:
        resolve_layers(requested, 4)  # type: ignore[arg-type]
    assert fragment in str(caught.value)
