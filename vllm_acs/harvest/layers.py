"""Which decoder blocks a harvest keeps: the defaults and the user's choice, checked.

Pure (numpy-free, standard library only); runs in the API server process. Layer k is the output
of decoder block k.
"""

from __future__ import annotations

ALL = "all"
_SHAPE_MESSAGE = 'layers must be a list of block indices, "all", or omitted'


class LayerChoiceError(ValueError):
    """A layer choice the model cannot serve; the message is written to be shown to the user."""


def default_layers(n_layers: int) -> tuple[int, ...]:
    """The quartile blocks n_layers // 4 * k for k = 1, 2, 3, e.g. (8, 16, 24) for 32 layers."""
    if n_layers < 1:
        raise ValueError(f"a model has at least one decoder block, got n_layers={n_layers}")
    quarter = n_layers // 4
    if quarter >= 1:
        return tuple(sorted({quarter * k for k in (1, 2, 3) if 0 <= quarter * k < n_layers}))
    # Under 4 blocks the integer quarter is 0 and every quartile collapses onto block 0; rounding
    # the fractions instead spreads the choice over the few blocks there are.
    return tuple(sorted({max(0, min(n_layers - 1, round(n_layers * k / 4))) for k in (1, 2, 3)}))


def resolve_layers(requested: list[int] | str | None, n_layers: int) -> tuple[int, ...]:
    """The blocks to keep, ascending: the defaults for None, every block for "all", else the list.

    Raises LayerChoiceError (meant for a 400 on param "layers") for anything else, an empty list,
    a non-integer (bools included), an index outside the model or a duplicate.
    """
    if requested is None:
        return default_layers(n_layers)
    if isinstance(requested, str):
        if requested == ALL:
            return tuple(range(n_layers))
        raise LayerChoiceError(_SHAPE_MESSAGE)
    if not isinstance(requested, (list, tuple)):
        raise LayerChoiceError(_SHAPE_MESSAGE)
    if not requested:
        raise LayerChoiceError('layers must not be empty; omit it for the defaults or pass "all"')
    seen: set[int] = set()
    for value in requested:
        # bool is an int subclass, but `true` in a JSON body is a mistake, not block 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise LayerChoiceError(f"layers must hold integer block indices, got {value!r}")
        if not 0 <= value < n_layers:
            raise LayerChoiceError(
                f"layer {value} is out of range: this model has blocks 0..{n_layers - 1}"
            )
        if value in seen:
            raise LayerChoiceError(f"layer {value} is listed more than once")
        seen.add(value)
    return tuple(sorted(seen))
