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
    docs = "--enable-offline-docs"
    assert with_default_args(["m"]) == ["m", "--max-logprobs", "-1", docs]
    assert with_default_args(["m", "--max-logprobs", "5"]) == ["m", "--max-logprobs", "5", docs]
    assert with_default_args(["m", "--max-logprobs=5", "--no-enable-offline-docs"]) == [
        "m",
        "--max-logprobs=5",
        "--no-enable-offline-docs",
    ]


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
        ]
