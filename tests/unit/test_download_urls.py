"""Signed download URLs: valid until their expiry (an explicit clock), refused once expired,
altered (path, expiry or signature) or unsigned; the secret made once in home is kept."""

from __future__ import annotations

import stat
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlsplit

import pytest

from vllm_acs.harvest.download_urls import UrlRefused, UrlSigner, load_or_create_secret

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
PATH = "/downloads/job_1/shard_00000.safetensors"


def _parts(url: str) -> tuple[str, str, str]:
    split = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(split.query).items()}
    return split.path, query["expires"], query["signature"]


def test_a_signed_url_is_good_until_it_expires():
    signer = UrlSigner(b"secret")
    path, expires, signature = _parts(signer.sign(PATH, NOW + timedelta(days=7)))
    assert path == PATH
    signer.check(path, expires, signature, NOW)
    signer.check(path, expires, signature, NOW + timedelta(days=7) - timedelta(seconds=1))
    with pytest.raises(UrlRefused, match="expired"):
        signer.check(path, expires, signature, NOW + timedelta(days=7))


def test_an_altered_or_unsigned_url_is_refused():
    signer = UrlSigner(b"secret")
    path, expires, signature = _parts(signer.sign(PATH, NOW + timedelta(days=7)))
    for args in [
        (PATH.replace("00000", "00001"), expires, signature),
        (path, str(int(expires) + 3600), signature),
        (path, expires, "0" + signature[1:]),
        (path, None, signature),
        (path, expires, None),
        (path, "soon", signature),
    ]:
        with pytest.raises(UrlRefused):
            signer.check(*args, NOW)
    with pytest.raises(UrlRefused, match="does not match"):
        UrlSigner(b"another deployment").check(path, expires, signature, NOW)


def test_the_secret_is_made_once_and_kept_private(tmp_path):
    first = load_or_create_secret(None, tmp_path)
    assert len(first) == 64 and load_or_create_secret(None, tmp_path) == first
    mode = (tmp_path / "url-secret").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert load_or_create_secret("operator's", tmp_path) == b"operator's"
    assert [p.name for p in tmp_path.iterdir()] == ["url-secret"]
