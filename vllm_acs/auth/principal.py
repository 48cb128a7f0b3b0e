"""Who a request runs as: the `Principal` an authenticator returns, with its key's limits.

A leaf module used in the API server process: AuthMiddleware stores one on
`scope["state"][PRINCIPAL_STATE_KEY]`; Admission reads its limits; plugins may build their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PRINCIPAL_STATE_KEY = "acs_principal"
# What a key may do. `keys` (manage the account's keys) is never a default: the operator grants
# it (`vllm-acs keys create|set --scopes ...`), and a key grants at most the scopes it holds.
# `admin` (the operator's console, /v1/admin) is granted only by the operator's command line,
# never by a key (docs/admin-console.md).
DEFAULT_SCOPES: frozenset[str] = frozenset({"completions", "jobs", "harvest", "looms"})
ADMIN_SCOPE = "admin"
SCOPES: frozenset[str] = DEFAULT_SCOPES | {"keys", ADMIN_SCOPE}


@dataclass(frozen=True)
class KeyLimits:
    """Token budgets (None: no such budget) and traffic limits of one key, defaults resolved."""

    monthly_tokens: int | None = None
    daily_tokens: int | None = None
    monthly_input_tokens: int | None = None
    monthly_output_tokens: int | None = None
    account_monthly_tokens: int | None = None
    # Activation requests (capture or steering) per UTC month; None: unlimited.
    monthly_activation_requests: int | None = None
    max_running: int = 16
    max_waiting: int = 64
    starts_per_minute: int = 600


# The limits a key itself stores (`account_monthly_tokens` is the account's): the api_keys
# columns and the `vllm-acs keys create|set` flags.
KEY_LIMIT_FIELDS = (
    "monthly_tokens",
    "daily_tokens",
    "monthly_input_tokens",
    "monthly_output_tokens",
    "max_running",
    "max_waiting",
    "starts_per_minute",
    "monthly_activation_requests",
)


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `key_id` names the counters its budgets and slots live under."""

    key_id: str
    key_prefix: str
    account_id: str
    scopes: frozenset[str] = DEFAULT_SCOPES
    limits: KeyLimits = field(default_factory=KeyLimits)
    # An operator pause of the account: requests get 429 spend_cap until it is lifted.
    spend_capped: bool = False
    # Who vouched for it: "key" for the built-in check, a plugin's name otherwise.
    source: str = "key"


# `scope[REPLAY_SCOPE_KEY]`: a request the node replays through its own pipeline for a job. Only
# in-process code can put it on a scope (the server builds every client's scope without it).
REPLAY_SCOPE_KEY = "acs.replay"


@dataclass(frozen=True)
class Replay:
    """A job's completion run as a live one: Auth takes this principal; Admission takes no
    start (the job took it at submit) and refuses a Hold that would lower max_tokens."""

    principal: Principal
    job_id: str
    # Fields of vLLM's own request that go to the engine beside the validated body, which no
    # client may send (a Loom branch asks for `return_token_ids`).
    vllm_fields: Mapping[str, Any] = field(default_factory=dict)
    # Batch work (a completion job): not counted as live traffic (jobs/batch_share.py).
    batch: bool = False
