"""Signed download URLs: a file's path with its expiry and an HMAC of both, made with the
deployment's secret, so a download needs no API key and cannot be stretched or redirected.

API server process: the harvest answer signs, the download route checks. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from ..private_paths import make_private_folder

SECRET_FILE = "url-secret"


class UrlRefused(Exception):
    """The URL is expired or was not signed by this deployment; `reason` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def load_or_create_secret(configured: str | None, home: Path) -> bytes:
    """The operator's secret, else one made once and kept (0600) in `home`."""
    if configured:
        return configured.encode()
    path = home / SECRET_FILE
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    make_private_folder(home)
    # Written whole under a temporary name, then linked in place: of two processes starting at
    # once, one link wins and both read the same complete secret.
    temporary = home / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "wb") as handle:
        handle.write(secrets.token_hex(32).encode())
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(temporary)
    return path.read_bytes().strip()


class UrlSigner:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _signature(self, path: str, expires: int) -> str:
        message = f"{path}\n{expires}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def sign(self, path: str, expires_at: datetime) -> str:
        """`path?expires=<unix seconds>&signature=<hex>` (path as the route sees it)."""
        expires = int(expires_at.timestamp())
        return f"{quote(path)}?expires={expires}&signature={self._signature(path, expires)}"

    def check(self, path: str, expires: str | None, signature: str | None, now: datetime) -> None:
        """Raises UrlRefused unless the URL was signed here and has not expired."""
        if expires is None or signature is None or not expires.isdigit():
            raise UrlRefused("This download URL is not signed; ask the job again for its URLs.")
        wanted = self._signature(path, int(expires))
        if not hmac.compare_digest(wanted, signature):
            raise UrlRefused("This download URL's signature does not match; it was altered.")
        if now.astimezone(timezone.utc).timestamp() >= int(expires):
            raise UrlRefused("This download URL has expired.")
