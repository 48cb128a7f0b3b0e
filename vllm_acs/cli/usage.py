"""`vllm-acs usage`: tokens per key, model and month, and per account. Operator's shell."""

from __future__ import annotations

import argparse
from typing import Any

from .common import Register, out, table


async def _usage(args: argparse.Namespace, storage: Any) -> int:
    per_key = await storage.usage.per_key_model_month(args.month)
    per_account = await storage.usage.per_account_month(args.month)
    tokens = ["requests", "prompt_tokens", "completion_tokens", "total_tokens"]
    lines = table(per_key, ["period", "account_id", "key_prefix", "model", *tokens])
    lines += ["", *table(per_account, ["period", "account_id", *tokens])]
    out(args, {"per_key_model_month": per_key, "per_account_month": per_account}, "\n".join(lines))
    return 0


def add_usage_command(sub: Any, command: Register) -> None:
    usage = sub.add_parser("usage", help="tokens per key, model and month; account totals")
    usage.add_argument("--month", help="YYYY-MM (default: every month)")
    command(usage, _usage)
