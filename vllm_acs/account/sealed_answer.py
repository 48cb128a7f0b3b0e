"""The stored answer of `POST /v1/keys` keeps the new secret sealed: a resent create with its
Idempotency-Key gets the same key and its secret back, while the database never holds a secret
it could read (the spec: "we only ever store a hash").

API server process (IdempotencyMiddleware calls these for the keys route). The seal is AES-GCM
(the `cryptography` package) under a key derived with HKDF-SHA256 from the caller's own secret
(which the node never stores), the Idempotency-Key and the new key's id: only a request that
carries the caller's secret again can open it; one that cannot gets `key: null`. Each derived key
seals one answer, so a fixed nonce is safe.
"""

from __future__ import annotations

import base64
import contextlib
import json

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_LABEL = b"vllm-acs sealed key"
_NONCE = bytes(12)  # one derived key per sealed answer: never reused


def _aead(caller_secret: str, idempotency_key: str, key_id: str) -> AESGCM:
    salt = f"{idempotency_key}\n{key_id}".encode()
    derived = HKDF(algorithm=SHA256(), length=32, salt=salt, info=_LABEL).derive(
        caller_secret.encode()
    )
    return AESGCM(derived)


def seal_created_key(body: str, caller_secret: str | None, idempotency_key: str) -> str:
    """The answer as stored: `key` null, `sealed_key` the sealed secret (or nothing when the
    caller sent no secret of its own: then a replay answers `key: null`)."""
    try:
        data = json.loads(body)
    except ValueError:  # not an answer that holds a key
        return body
    secret = data.get("key") if isinstance(data, dict) else None
    if not isinstance(secret, str):
        return body
    data["key"] = None
    if caller_secret:
        aead = _aead(caller_secret, idempotency_key, str(data.get("id")))
        sealed = aead.encrypt(_NONCE, secret.encode(), None)
        data["sealed_key"] = base64.urlsafe_b64encode(sealed).decode()
    return json.dumps(data, separators=(",", ":"))


def unseal_created_key(body: str, caller_secret: str | None, idempotency_key: str) -> str:
    """The stored answer as the first request got it, when the caller's secret opens the seal."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict) or "sealed_key" not in data:
        return body
    sealed = base64.urlsafe_b64decode(data.pop("sealed_key"))
    if caller_secret:
        aead = _aead(caller_secret, idempotency_key, str(data.get("id")))
        with contextlib.suppress(InvalidTag):  # another secret or another Idempotency-Key
            data["key"] = aead.decrypt(_NONCE, sealed, None).decode()
    return json.dumps(data, separators=(",", ":"))
