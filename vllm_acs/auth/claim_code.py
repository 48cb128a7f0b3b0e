"""Claim codes: an applicant's one-time credential, `acs-claim-` + 43 url-safe characters (256
random bits), shown once when they apply and stored only as its SHA-256; and the hash of a client
address that the per-address limit counts by.

Pure functions, used by the API server and the CLI. A code that carries 256 random bits cannot be
brute-forced through a plain fast hash, and it is looked up by that hash (no timing to compare).
"""

from __future__ import annotations

import hashlib
import re
import secrets

CLAIM_CODE_PREFIX = "acs-claim-"
CLAIM_CODE_LENGTH = len(CLAIM_CODE_PREFIX) + 43
_CODE_RE = re.compile(r"acs-claim-[A-Za-z0-9_-]{43}")


def new_claim_code() -> str:
    return CLAIM_CODE_PREFIX + secrets.token_urlsafe(32)


def looks_like_claim_code(value: str) -> bool:
    return _CODE_RE.fullmatch(value) is not None


def hash_claim_code(code: str) -> str:
    return hashlib.sha256(code.encode("ascii")).hexdigest()


def hash_address(address: str) -> str:
    """The client address as the limit counts it, not as it was: no address is stored."""
    return hashlib.sha256(b"acs-application-address:" + address.encode("utf-8")).hexdigest()
