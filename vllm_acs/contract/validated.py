"""`ValidatedCompletion`: a /v1/completions request after strict validation, before vLLM sees it.

API server process. StrictValidationMiddleware creates it and puts it on `scope["state"]` under
`VALIDATED_COMPLETION_KEY`; Admission may lower `max_tokens` through `clamp()`; the Rewrite stage
turns it into vLLM's body. The stages in between read it, never the raw body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..activations.payload import AcsPayload
from ..served_model import ServedModel

VALIDATED_COMPLETION_KEY = "acs_completion"


@dataclass
class ValidatedCompletion:
    model: ServedModel
    # The validated fields, JSON-ready, without `model` and `max_tokens`; `prompt` as vLLM
    # must receive it.
    fields: dict[str, Any]
    prompt_count: int
    # Tokens of every prompt together, counted with the model's tokenizer (ids count as ids).
    prompt_tokens: int
    n: int
    max_tokens: int
    max_tokens_source: Literal["client", "default"]
    stream: bool
    workload: str | None = None
    # False when the caller sent `X-Acs-Budget-Clamp: refuse`: a budget that cannot hold the
    # whole max_tokens refuses the request (429 budget_exceeded) instead of lowering it.
    may_clamp_to_budget: bool = True
    # Extra per-request values for the worker side (vLLM's `vllm_xargs`): numbers and strings.
    engine_args: dict[str, Any] = field(default_factory=dict)
    requested_max_tokens: int = 0
    clamp_reasons: list[str] = field(default_factory=list)
    # What the workers capture and steer (also in `engine_args`); None for a plain completion.
    activations: AcsPayload | None = None

    def __post_init__(self) -> None:
        if not self.requested_max_tokens:
            self.requested_max_tokens = self.max_tokens

    @property
    def choices(self) -> int:
        return self.prompt_count * self.n

    @property
    def worst_case_output_tokens(self) -> int:
        return self.choices * self.max_tokens

    def clamp(self, applied: int, reason: Literal["deadline", "budget"]) -> None:
        """Lowers max_tokens to `applied` (never raises it) and remembers why."""
        if applied < self.max_tokens:
            self.max_tokens = applied
            if reason not in self.clamp_reasons:
                self.clamp_reasons.append(reason)

    def clamp_header(self) -> str | None:
        """The `X-Acs-Max-Tokens-Clamped` value, or None when max_tokens was not lowered."""
        if not self.clamp_reasons:
            return None
        return (
            f"requested={self.requested_max_tokens},applied={self.max_tokens},"
            f"reason={'+'.join(self.clamp_reasons)},source={self.max_tokens_source}"
        )
