"""The per-request ACS payload: what the API server tells the workers about one completion.

Built in the API server, sent as ONE JSON string under `SamplingParams.extra_args["acs"]` (vLLM's
`vllm_xargs` refuse nested objects), parsed in each worker. A leaf: standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EXTRA_ARGS_KEY = "acs"
PAYLOAD_VERSION = 1
# Capture ids name files in the capture directory: no separators, no dots, bounded.
CAPTURE_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class PayloadError(ValueError):
    """The payload is malformed; the API server built it wrong (a bug, not a client error)."""


@dataclass(frozen=True)
class SteeringEntry:
    """One `apply_steering_vectors` item, as validated by the API server.

    `activations` is the codec dict (see codec.py) of shape (len(layer_indices), hidden) or, with
    `position_indices`, (len(layer_indices), len(position_indices), hidden).
    """

    activations: Mapping[str, Any]
    layer_indices: tuple[int, ...]
    scale: float = 1.0
    norm_match: bool = False
    position_indices: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "activations": dict(self.activations),
            "layer_indices": list(self.layer_indices),
            "scale": self.scale,
            "norm_match": self.norm_match,
            "position_indices": None
            if self.position_indices is None
            else list(self.position_indices),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> SteeringEntry:
        if not isinstance(raw, Mapping):
            raise PayloadError("a steering entry must be an object")
        activations = raw.get("activations")
        if not isinstance(activations, Mapping):
            raise PayloadError("steering.activations must be a codec object")
        positions = raw.get("position_indices")
        scale = raw.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, int | float):
            raise PayloadError("steering.scale must be a number")
        norm_match = raw.get("norm_match", False)
        if not isinstance(norm_match, bool):
            raise PayloadError("steering.norm_match must be a boolean")
        return cls(
            activations=activations,
            layer_indices=_int_tuple(raw.get("layer_indices"), "steering.layer_indices"),
            scale=float(scale),
            norm_match=norm_match,
            position_indices=None
            if positions is None
            else _int_tuple(positions, "steering.position_indices"),
        )


@dataclass(frozen=True)
class AcsPayload:
    """Everything the workers do for one request: capture some layers, steer some layers.

    `capture_id` is chosen by the API server, unique per request: it names the capture file the
    workers write (store.py) even for steer-only requests, so the API server can check that the
    workers really applied the payload.
    """

    capture_id: str
    capture_layers: tuple[int, ...] = ()
    steering: tuple[SteeringEntry, ...] = field(default=())
    version: int = PAYLOAD_VERSION

    def __post_init__(self) -> None:
        if not CAPTURE_ID_PATTERN.match(self.capture_id):
            raise PayloadError(f"capture_id must match {CAPTURE_ID_PATTERN.pattern}")
        if list(self.capture_layers) != sorted(set(self.capture_layers)):
            raise PayloadError("capture_layers must be distinct and ascending")
        if any(layer < 0 for layer in self.capture_layers):
            raise PayloadError("capture_layers must not be negative")

    @property
    def captures(self) -> bool:
        return bool(self.capture_layers)

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": self.version,
                "capture_id": self.capture_id,
                "capture_layers": list(self.capture_layers),
                "steering": [entry.to_dict() for entry in self.steering],
            },
            separators=(",", ":"),
        )

    def to_extra_args(self) -> dict[str, str]:
        """The `vllm_xargs` / `SamplingParams.extra_args` entry carrying this payload."""
        return {EXTRA_ARGS_KEY: self.to_json()}

    @classmethod
    def from_json(cls, text: str) -> AcsPayload:
        try:
            raw = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise PayloadError(f"the acs payload is not JSON: {exc}") from None
        if not isinstance(raw, Mapping):
            raise PayloadError("the acs payload must be a JSON object")
        if raw.get("v") != PAYLOAD_VERSION:
            raise PayloadError(f"unsupported acs payload version {raw.get('v')!r}")
        capture_id = raw.get("capture_id")
        if not isinstance(capture_id, str):
            raise PayloadError("capture_id must be a string")
        steering = raw.get("steering") or []
        if not isinstance(steering, list):
            raise PayloadError("steering must be a list")
        return cls(
            capture_id=capture_id,
            capture_layers=_int_tuple(raw.get("capture_layers") or [], "capture_layers"),
            steering=tuple(SteeringEntry.from_dict(entry) for entry in steering),
        )

    @classmethod
    def from_extra_args(cls, extra_args: Mapping[str, Any] | None) -> AcsPayload | None:
        """The payload in a request's extra_args, or None for a plain request."""
        if not extra_args or EXTRA_ARGS_KEY not in extra_args:
            return None
        text = extra_args[EXTRA_ARGS_KEY]
        if not isinstance(text, str):
            raise PayloadError(f'extra_args["{EXTRA_ARGS_KEY}"] must be a JSON string')
        return cls.from_json(text)


def _int_tuple(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise PayloadError(f"{name} must be a list of integers")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise PayloadError(f"{name} must hold integers only")
    return tuple(value)
