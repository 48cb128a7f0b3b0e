"""The client-facing AcsError for each refusal of the counters (budgets, starts, slots).

API server process: Admission answers live requests with it, a harvest fails its job with it.
"""

from __future__ import annotations

from ..errors import AcsError, ActivationQuotaExceeded, BudgetExceeded, TrafficLimited
from ..storage.errors import BudgetExhausted, QueueFull, StartsExhausted
from ..storage.periods import ACTIVATION_QUOTA, BUDGET_MESSAGES, BUDGET_NAMES


def refusal(error: Exception) -> AcsError:
    """The client-facing answer for a storage refusal."""
    if isinstance(error, BudgetExhausted) and error.budget == ACTIVATION_QUOTA:
        return ActivationQuotaExceeded()
    if isinstance(error, BudgetExhausted) and error.fits >= 1:
        return BudgetExceeded(_not_shortened(error))
    if isinstance(error, BudgetExhausted):
        return BudgetExceeded(BUDGET_MESSAGES.get(error.budget, "Token budget exhausted."))
    if isinstance(error, StartsExhausted):
        return TrafficLimited(
            "This API key started too many requests in the last minute.",
            code="rate_limited",
            retry_after_ms=error.retry_after_ms,
        )
    retry_ms = error.retry_after_ms if isinstance(error, QueueFull) else 1000
    return TrafficLimited(
        "This API key has too many requests running and waiting.",
        code="queue_full",
        retry_after_ms=retry_ms,
    )


def _not_shortened(error: BudgetExhausted) -> str:
    """A request that may not be clamped (a job, a Loom branch, `X-Acs-Budget-Clamp: refuse`)
    whose budget still holds some tokens: how many, so the caller knows what to ask for."""
    budget = BUDGET_NAMES.get(error.budget, "the token budget")
    return (
        f"This request asks for up to {error.asked} tokens per choice; {budget} holds only "
        f"{error.fits} per choice. It is refused rather than shortened: lower max_tokens to "
        f"{error.fits} or less, or ask the operator for a larger budget."
    )
