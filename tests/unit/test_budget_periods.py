"""Budget lines, UTC periods and the clamp arithmetic of the Hold (pure functions)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from vllm_acs.auth.principal import KeyLimits, Principal
from vllm_acs.settings import Settings, SettingsError
from vllm_acs.storage import check_counters_backend
from vllm_acs.storage.periods import (
    BUDGET_MESSAGES,
    BudgetLine,
    budget_lines,
    counter_with_period,
    max_tokens_that_fit,
)


def _line(kind: str, limit: int, name: str = "key_monthly") -> BudgetLine:
    return BudgetLine(name, "key:k:month", "month", kind, limit)  # type: ignore[arg-type]


def test_only_budgets_with_a_limit_apply_and_each_has_a_message():
    who = Principal(
        "k", "acs-bm-x", "a", limits=KeyLimits(daily_tokens=5, account_monthly_tokens=9)
    )
    assert [line.name for line in budget_lines(who)] == ["key_daily", "account_monthly"]
    assert set(BUDGET_MESSAGES) == {
        "key_monthly",
        "key_daily",
        "key_monthly_input",
        "key_monthly_output",
        "account_monthly",
    }


def test_periods_are_utc_months_and_days():
    late = datetime(2026, 11, 30, 23, 30, tzinfo=timezone(timedelta(hours=-5)))  # Dec 1 UTC
    assert counter_with_period("key:k:month", "month", late) == "key:k:month:2026-12"
    assert counter_with_period("key:k:day", "day", late) == "key:k:day:2026-12-01"


@pytest.mark.parametrize(
    ("lines", "prompt", "choices", "max_tokens", "expected"),
    [
        ([(_line("total", 100), 0)], 10, 1, 50, (50, None)),
        ([(_line("total", 100), 0)], 10, 3, 50, (30, None)),
        ([(_line("total", 100), 89)], 10, 1, 50, (1, None)),
        ([(_line("total", 100), 90)], 10, 1, 50, (0, "key_monthly")),
        ([(_line("input", 10, "key_monthly_input"), 0)], 10, 1, 50, (50, None)),
        ([(_line("input", 10, "key_monthly_input"), 1)], 10, 1, 50, (0, "key_monthly_input")),
        ([(_line("output", 10), 0), (_line("total", 1000), 0)], 10, 2, 50, (5, None)),
        ([(_line("total", 10), 20)], 0, 1, 5, (0, "key_monthly")),
    ],
)
def test_max_tokens_that_fit(lines, prompt, choices, max_tokens, expected):
    assert max_tokens_that_fit(lines, prompt, choices, max_tokens) == expected


def test_more_than_one_api_process_needs_redis():
    check_counters_backend(Settings(), 1)
    check_counters_backend(Settings(redis_url="redis://127.0.0.1:6379/0"), 4)
    with pytest.raises(SettingsError, match="VLLM_ACS_REDIS_URL"):
        check_counters_backend(Settings(), 2)
