"""Client helpers for users of the API: encode steering vectors, decode captured activations,
download a harvest and iterate its rows.

Runs in the user's process. The codec helpers (activations.py) are numpy + zstandard only; the
harvest helpers (harvest_files.py) need httpx, safetensors and torch and load when first asked for.
"""

from __future__ import annotations

from typing import Any

from .activations import decode_residual_stream, encode_vector

# The harvest helpers stay out of __all__: a star import must not load torch.
__all__ = ["decode_residual_stream", "encode_vector"]

_HARVEST_HELPERS = {"download_harvest", "open_harvest", "HarvestFiles", "HarvestNotReady"}


def __getattr__(name: str) -> Any:
    """The harvest helpers load on first use, so the codec above stays numpy-only."""
    if name in _HARVEST_HELPERS:
        from . import harvest_files

        return getattr(harvest_files, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
