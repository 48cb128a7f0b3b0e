"""API key secrets: `acs-bm-` + 43 url-safe characters, shown once, stored as a SHA-256 hash.

Pure functions, used by the CLI (creation) and the API server (verification). The visible prefix
is the lookup index; the hash is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

KEY_PREFIX = "acs-bm-"
_SECRET_RE = re.compile(r"acs-bm-[A-Za-z0-9_-]{43}")
# `acs-bm-` plus the first 8 secret characters: 48 random bits, enough to find the row, useless
# to guess the rest.
VISIBLE_PREFIX_LENGTH = len(KEY_PREFIX) + 8


def new_secret() -> str:
    # 32 random bytes are exactly 43 url-safe base64 characters.
    return KEY_PREFIX + secrets.token_urlsafe(32)


def looks_like_secret(value: str) -> bool:
    return _SECRET_RE.fullmatch(value) is not None


def visible_prefix(secret: str) -> str:
    return secret[:VISIBLE_PREFIX_LENGTH]


def hash_secret(secret: str) -> str:
    # The secret carries 256 random bits, so a plain fast hash cannot be brute-forced.
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)
