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


def test_max_logprobs_defaults_to_full_vocabulary_unless_given():
    assert with_default_args(["m"]) == ["m", "--max-logprobs", "-1"]
    assert with_default_args(["m", "--max-logprobs", "5"]) == ["m", "--max-logprobs", "5"]
    assert with_default_args(["m", "--max-logprobs=5"]) == ["m", "--max-logprobs=5"]
