"""Key secrets: format, visible prefix, hashing, constant-time match."""

from __future__ import annotations

from vllm_acs.storage.api_key_secret import (
    hash_secret,
    looks_like_secret,
    new_secret,
    secret_matches,
    visible_prefix,
)


def test_secrets_have_the_spec_format_and_differ():
    secrets = {new_secret() for _ in range(200)}
    assert len(secrets) == 200
    for secret in secrets:
        assert secret.startswith("acs-bm-") and len(secret) == 7 + 43
        assert looks_like_secret(secret)
        assert visible_prefix(secret) == secret[:15]


def test_only_the_hash_matches():
    secret = new_secret()
    stored = hash_secret(secret)
    assert secret not in stored and len(stored) == 64
    assert secret_matches(secret, stored)
    assert not secret_matches(secret[:-1] + ("A" if secret[-1] != "A" else "B"), stored)


def test_malformed_tokens_are_not_secrets():
    for token in (
        "",
        "acs-bm-",
        "sk-" + "a" * 43,
        "acs-bm-" + "a" * 42,
        "acs-bm-" + "a" * 42 + "!",
    ):
        assert not looks_like_secret(token)
