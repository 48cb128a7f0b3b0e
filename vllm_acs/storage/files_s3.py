"""Job files in an S3-compatible object store (AWS S3, SeaweedFS, MinIO...): the `FileStore` of
files.py on obstore's async API, each name an object key under an optional prefix, and presigned
GET URLs so that researchers download a harvest's files from the store, not through a node
(signed for `s3_public_endpoint` when the researchers reach the store by another address).

API server process and the CLI, when `s3_bucket` is set. A PUT is atomic by itself (a reader
sees the old object or the whole new one), which is all a harvest's resume needs of a write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import obstore

from ..settings import Settings, SettingsError
from .files import FileNameError, StoredFile, check_name

if TYPE_CHECKING:
    from obstore.store import S3Store

# SigV4 presigned URLs live at most 7 days from the moment they are signed.
MAX_PRESIGNED = timedelta(days=7)
_DELETE_BATCH = 1000  # DeleteObjects takes at most 1,000 keys


class S3FileStore:
    """Files as objects of one bucket, under `prefix` (no leading or trailing slash)."""

    CHUNK = 1 << 20

    def __init__(self, store: S3Store, signer: S3Store | None = None) -> None:
        self.store = store
        # SigV4 signs the Host a URL names: URLs for researchers who reach the store by another
        # address than the nodes are signed by a store of that address, which only signs.
        self.signer = store if signer is None else signer

    @classmethod
    def from_settings(cls, settings: Settings) -> S3FileStore:
        """The store `s3_*` settings name; SettingsError for settings it cannot use."""
        if not settings.s3_bucket:
            raise SettingsError("VLLM_ACS_S3_BUCKET is not set")
        endpoint = _checked_endpoint("VLLM_ACS_S3_ENDPOINT", settings.s3_endpoint)
        public = _checked_endpoint("VLLM_ACS_S3_PUBLIC_ENDPOINT", settings.s3_public_endpoint)
        if (settings.s3_access_key_id is None) != (settings.s3_secret_access_key is None):
            raise SettingsError(
                "VLLM_ACS_S3_ACCESS_KEY_ID and VLLM_ACS_S3_SECRET_ACCESS_KEY go together: set "
                "both, or neither (then the AWS_* environment or instance credentials are used)"
            )
        prefix = settings.s3_prefix.strip("/")
        if prefix:
            try:
                check_name(prefix)
            except FileNameError:
                raise SettingsError(
                    f"VLLM_ACS_S3_PREFIX must be plain path segments, got {settings.s3_prefix!r}"
                ) from None
        store = _s3_store(settings, endpoint, prefix)
        if public is None or public == endpoint:
            return cls(store)
        return cls(store, signer=_s3_store(settings, public, prefix))

    async def write(self, name: str, data: bytes) -> StoredFile:
        check_name(name)
        await obstore.put_async(self.store, name, data)
        return StoredFile(name, len(data))

    async def read(self, name: str) -> bytes:
        check_name(name)
        result = await obstore.get_async(self.store, name)
        return bytes(await result.bytes_async())

    async def size(self, name: str) -> int | None:
        check_name(name)
        try:
            meta = await obstore.head_async(self.store, name)
        except FileNotFoundError:
            return None
        return int(meta["size"])

    async def read_range(self, name: str, start: int, end: int) -> AsyncIterator[bytes]:
        check_name(name)
        result = await obstore.get_async(self.store, name, options={"range": (start, end + 1)})
        async for chunk in result.stream(min_chunk_size=self.CHUNK):
            yield bytes(chunk)

    async def delete(self, name: str) -> None:
        check_name(name)
        await obstore.delete_async(self.store, name)  # S3 deletes a missing key without error

    async def delete_tree(self, prefix: str) -> None:
        check_name(prefix)
        keys: list[str] = []
        # Prefixes are whole segments: `harvests/job_1` never lists `harvests/job_10/...`.
        async for batch in obstore.list(self.store, prefix, chunk_size=_DELETE_BATCH):
            keys.extend(meta["path"] for meta in batch)
        if await self.size(prefix) is not None:
            keys.append(prefix)
        for first in range(0, len(keys), _DELETE_BATCH):
            await obstore.delete_async(self.store, keys[first : first + _DELETE_BATCH])

    async def children(self, prefix: str) -> list[str]:
        check_name(prefix)
        listed = await obstore.list_with_delimiter_async(self.store, prefix)
        names = [path.rsplit("/", 1)[-1] for path in listed["common_prefixes"]]
        # Not the folder itself, which SeaweedFS lists as an empty object once it is emptied.
        names += [m["path"].rsplit("/", 1)[-1] for m in listed["objects"] if m["path"] != prefix]
        return sorted(set(names))

    async def modified_at(self, name: str) -> datetime | None:
        check_name(name)
        try:
            return (await obstore.head_async(self.store, name))["last_modified"]
        except FileNotFoundError:
            pass
        newest: datetime | None = None
        async for batch in obstore.list(self.store, name, chunk_size=_DELETE_BATCH):
            for meta in batch:
                if newest is None or meta["last_modified"] > newest:
                    newest = meta["last_modified"]
        return newest

    async def download_urls(
        self, names: Sequence[str], expires_at: datetime, now: datetime
    ) -> list[str] | None:
        """Presigned GETs (SigV4) of the objects until `expires_at`, but never for more than the
        7 days SigV4 allows from now; None once `expires_at` has passed. Signed in one call
        (thousands of shards take a fraction of a second)."""
        for name in names:
            check_name(name)
        lifetime = min(expires_at - now, MAX_PRESIGNED)
        seconds = int(lifetime.total_seconds())
        if seconds < 1:
            return None
        if not names:
            return []
        signed = await obstore.sign_async(
            self.signer, "GET", list(names), timedelta(seconds=seconds)
        )
        return list(signed)


def _checked_endpoint(variable: str, endpoint: str | None) -> str | None:
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise SettingsError(f"{variable} must be an http:// or https:// URL, got {endpoint!r}")
    return endpoint


def _s3_store(settings: Settings, endpoint: str | None, prefix: str) -> S3Store:
    from obstore.store import S3Store

    config: dict[str, Any] = {"region": settings.s3_region}
    if endpoint is not None:
        config["endpoint"] = endpoint
    if settings.s3_access_key_id is not None:
        config["access_key_id"] = settings.s3_access_key_id
        config["secret_access_key"] = settings.s3_secret_access_key
    return S3Store(
        settings.s3_bucket,
        prefix=prefix or None,
        config=config,
        # An http:// endpoint (a store on the same private network) says so itself.
        client_options={"allow_http": bool(endpoint and endpoint.startswith("http://"))},
    )
