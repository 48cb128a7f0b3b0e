"""launcher.py: the environment and default flags `vllm-acs serve` gives vLLM."""

from __future__ import annotations

from vllm_acs.launcher import plugin_environment, with_default_args


def test_acs_is_added_to_the_plugin_allowlist():
    env: dict[str, str] = {}
    plugin_environment(env)
    assert env["VLLM_PLUGINS"] == "acs"
    env = {"VLLM_PLUGINS": "other"}
    plugin_environment(env)
    assert env["VLLM_PLUGINS"] == "other,acs"
    plugin_environment(env)
    assert env["VLLM_PLUGINS"] == "other,acs"


def test_defaults_apply_unless_the_operator_gives_the_flag():
    assert with_default_args(["m"]) == ["m", "--max-logprobs", "-1", "--enforce-eager"]
    assert with_default_args(["m", "--max-logprobs", "5", "--enforce-eager"]) == [
        "m",
        "--max-logprobs",
        "5",
        "--enforce-eager",
    ]
    assert with_default_args(["m", "--max-logprobs=5", "--no-enforce-eager"]) == [
        "m",
        "--max-logprobs=5",
        "--no-enforce-eager",
    ]
