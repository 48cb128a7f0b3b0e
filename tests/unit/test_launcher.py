"""launcher.py: the environment and default flags `vllm-acs serve` gives vLLM."""

from __future__ import annotations

from vllm_acs.launcher import (
    LIVE_FIRST_SCHEDULER,
    parse_serve_args,
    plugin_environment,
    with_default_args,
)


def test_acs_is_added_to_the_plugin_allowlist():
    env: dict[str, str] = {}
    plugin_environment(env)
    assert env["VLLM_PLUGINS"] == "acs"
    env = {"VLLM_PLUGINS": "other"}
    plugin_environment(env)
    assert env["VLLM_PLUGINS"] == "other,acs"
    plugin_environment(env)
    assert env["VLLM_PLUGINS"] == "other,acs"


PRIORITY = ["--scheduling-policy", "priority", "--scheduler-cls", LIVE_FIRST_SCHEDULER]


def test_defaults_apply_unless_the_operator_gives_the_flag():
    docs = "--enable-offline-docs"
    assert with_default_args(["m"]) == ["m", "--max-logprobs", "-1", docs, *PRIORITY]
    assert with_default_args(["m", "--max-logprobs", "5"]) == [
        "m",
        "--max-logprobs",
        "5",
        docs,
        *PRIORITY,
    ]
    given = [
        "m",
        "--max-logprobs=5",
        "--no-enable-offline-docs",
        "--scheduling-policy=fcfs",
        "--scheduler-cls=my.Scheduler",
    ]
    assert with_default_args(given) == given


def test_live_requests_first_unless_the_operator_chose_a_policy():
    """vLLM's priority policy and the live-first scheduler are the defaults of `vllm-acs serve`
    (batch work enters the engine at a lower priority, and goes in small chunks beside live
    requests); an operator's own policy or scheduler, in either spelling, is kept."""
    assert with_default_args(["m"])[-4:] == PRIORITY
    for given in (["--scheduling-policy", "fcfs"], ["--scheduling-policy=fcfs"]):
        args = with_default_args(["m", *given])
        assert "priority" not in args
        assert args[1 : 1 + len(given)] == given
    for given in (["--scheduler-cls", "my.Scheduler"], ["--scheduler-cls=my.Scheduler"]):
        args = with_default_args(["m", *given])
        assert LIVE_FIRST_SCHEDULER not in args
        assert args[1 : 1 + len(given)] == given
    args = parse_serve_args(["m"])
    assert args.scheduling_policy == "priority"
    assert args.scheduler_cls == LIVE_FIRST_SCHEDULER
    assert parse_serve_args(["m", "--scheduling-policy", "fcfs"]).scheduling_policy == "fcfs"


def test_compilation_is_left_to_the_operator():
    """The op runs inside compiled graphs: no --enforce-eager is added, and the operator's own
    compilation flags pass through unchanged."""
    for flags in (["--enforce-eager"], ["-O", "0"], ["--compilation-config", '{"mode": 3}'], []):
        assert with_default_args(["m", *flags]) == [
            "m",
            *flags,
            "--max-logprobs",
            "-1",
            "--enable-offline-docs",
            *PRIORITY,
        ]
