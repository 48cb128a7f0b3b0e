"""The stored answer of POST /v1/keys: the new secret sealed by the caller's own secret."""

from __future__ import annotations

import json

from vllm_acs.account.sealed_answer import seal_created_key, unseal_created_key

CALLER = "acs-bm-" + "c" * 43
NEW = "acs-bm-" + "n" * 43
ANSWER = json.dumps({"id": "key_1", "prefix": NEW[:15], "key": NEW, "state": "active"})


def test_the_stored_answer_holds_no_secret_and_the_caller_opens_it():
    stored = seal_created_key(ANSWER, CALLER, "idem-1")
    assert NEW not in stored and NEW[7:] not in stored
    assert json.loads(stored)["key"] is None
    assert json.loads(unseal_created_key(stored, CALLER, "idem-1")) == json.loads(ANSWER)


def test_another_secret_or_idempotency_key_cannot_open_it():
    stored = seal_created_key(ANSWER, CALLER, "idem-1")
    for secret, idempotency_key in ((CALLER[:-1] + "d", "idem-1"), (CALLER, "idem-2")):
        opened = json.loads(unseal_created_key(stored, secret, idempotency_key))
        assert opened["key"] is None and "sealed_key" not in opened
    assert json.loads(unseal_created_key(stored, None, "idem-1"))["key"] is None


def test_without_a_caller_secret_nothing_is_kept():
    stored = seal_created_key(ANSWER, None, "idem-1")
    assert NEW not in stored and "sealed_key" not in json.loads(stored)


def test_an_error_answer_passes_unchanged():
    error = json.dumps({"error": {"code": "scope_denied"}})
    assert seal_created_key(error, CALLER, "k") == error
    assert unseal_created_key(error, CALLER, "k") == error
    assert seal_created_key("not json", CALLER, "k") == "not json"
