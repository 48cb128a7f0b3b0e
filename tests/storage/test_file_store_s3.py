"""The S3 file store beyond the shared contract, on a real SeaweedFS: presigned GET URLs that plain
HTTP fetches (whole, a Range, refused once expired or altered, never past SigV4's 7 days, signed
for the public endpoint when there is one), the settings that choose it, and the harvest files'
retention sweep on it, and a store that does not answer (a 503, not a 500)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.unit.asgi_apps import request
from vllm_acs.middleware.error_envelope import ErrorEnvelopeMiddleware
from vllm_acs.middleware.request_id import RequestIdMiddleware
from vllm_acs.settings import Settings, SettingsError
from vllm_acs.storage.files_s3 import S3FileStore
from vllm_acs.storage.outages import outage_of

DATA = bytes(range(256)) * 40


@pytest.fixture
def store(seaweedfs) -> S3FileStore:
    return S3FileStore.from_settings(seaweedfs.settings(seaweedfs.prefix("presign")))


def _url(store: S3FileStore, name: str, lifetime: timedelta) -> str | None:
    now = datetime.now(timezone.utc)
    urls = asyncio.run(store.download_urls([name], now + lifetime, now))
    return None if urls is None else urls[0]


def test_a_presigned_url_serves_the_file_and_its_ranges(store):
    asyncio.run(store.write("harvests/job_1/shard_00000.safetensors", DATA))
    url = _url(store, "harvests/job_1/shard_00000.safetensors", timedelta(hours=1))
    assert url is not None
    # The file's own name ends the path: download_harvest names its files by it.
    assert urlsplit(url).path.endswith("/harvests/job_1/shard_00000.safetensors")
    whole = httpx.get(url)
    assert whole.status_code == 200 and whole.content == DATA
    part = httpx.get(url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == DATA[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(DATA)}"
    resumed = httpx.get(url, headers={"Range": f"bytes={len(DATA) - 10}-"})
    assert resumed.status_code == 206 and resumed.content == DATA[-10:]
    assert httpx.get(url, headers={"Range": f"bytes={len(DATA)}-"}).status_code == 416
    # Many at once, in order (a harvest's manifest, stats and every shard).
    now = datetime.now(timezone.utc)
    names = ["harvests/job_1/manifest.json", "harvests/job_1/shard_00000.safetensors"]
    urls = asyncio.run(store.download_urls(names, now + timedelta(hours=1), now))
    assert urls is not None and [urlsplit(u).path.split("/", 3)[3] for u in urls] == names
    assert httpx.get(urls[1]).content == DATA


def test_an_expired_or_altered_url_is_refused(store):
    asyncio.run(store.write("f/data", DATA))
    url = _url(store, "f/data", timedelta(seconds=1))
    assert url is not None
    altered = url.replace("X-Amz-Signature=", "X-Amz-Signature=0")
    assert httpx.get(altered).status_code == 403
    time.sleep(2.1)
    expired = httpx.get(url)
    # The store's own refusal (S3's XML error), not the API's envelope: the client reads the
    # harvest again for fresh URLs.
    assert expired.status_code == 403 and expired.text.lstrip().startswith("<?xml")
    assert "<Code>AccessDenied</Code>" in expired.text
    # Past its expiry the store gives no URL at all (the node answers its own, refused).
    assert _url(store, "f/data", timedelta(seconds=-1)) is None


def test_a_url_never_outlives_sigv4s_seven_days(store):
    asyncio.run(store.write("f/data", DATA))
    url = _url(store, "f/data", timedelta(days=30))
    assert url is not None
    assert parse_qs(urlsplit(url).query)["X-Amz-Expires"] == [str(7 * 24 * 3600)]
    assert httpx.get(url).status_code == 200  # more than 7 days would be a 400


def test_urls_name_the_public_endpoint_and_download_from_it(seaweedfs):
    """The nodes reach the store at 127.0.0.1, the researchers at `localhost`: the same server
    by another name, as an internal and a public address would be."""
    internal = seaweedfs.endpoint
    public = internal.replace("://127.0.0.1:", "://localhost:")
    settings = seaweedfs.settings(seaweedfs.prefix("public"), s3_public_endpoint=public)
    store = S3FileStore.from_settings(settings)
    asyncio.run(store.write("harvests/job_1/shard_00000.safetensors", DATA))  # by s3_endpoint
    url = _url(store, "harvests/job_1/shard_00000.safetensors", timedelta(hours=1))
    assert url is not None and urlsplit(url).netloc == urlsplit(public).netloc
    download = httpx.get(url)
    assert download.status_code == 200 and download.content == DATA
    # SigV4 signed the public host: the same URL by the internal address is refused.
    assert httpx.get(url.replace(public, internal, 1)).status_code == 403
    # Unset, the URLs name s3_endpoint (what the other tests download).
    plain = S3FileStore.from_settings(seaweedfs.settings(settings.s3_prefix))
    plain_url = _url(plain, "harvests/job_1/shard_00000.safetensors", timedelta(hours=1))
    assert plain_url is not None and urlsplit(plain_url).netloc == urlsplit(internal).netloc
    loaded = Settings.load({"VLLM_ACS_S3_PUBLIC_ENDPOINT": public})
    assert loaded.s3_public_endpoint == public


def test_the_prefix_keeps_deployments_apart(seaweedfs):
    one = S3FileStore.from_settings(seaweedfs.settings(seaweedfs.prefix("one")))
    two = S3FileStore.from_settings(seaweedfs.settings(seaweedfs.prefix("two")))
    asyncio.run(one.write("harvests/job_1/a", b"1"))
    assert asyncio.run(two.size("harvests/job_1/a")) is None
    assert asyncio.run(two.children("harvests")) == []


@pytest.mark.parametrize(
    ("values", "wanted"),
    [
        ({"s3_endpoint": "127.0.0.1:8333"}, "VLLM_ACS_S3_ENDPOINT"),
        ({"s3_public_endpoint": "s3.lab.example:443"}, "PUBLIC_ENDPOINT"),
        ({"s3_access_key_id": "only-the-id"}, "go together"),
        ({"s3_prefix": "a/../b"}, "PREFIX"),
    ],
)
def test_settings_it_cannot_use_are_refused(values, wanted):
    with pytest.raises(SettingsError, match=wanted):
        S3FileStore.from_settings(Settings(s3_bucket="b", **values))


def test_open_storage_chooses_the_bucket_when_one_is_set(seaweedfs, tmp_path):
    from vllm_acs.storage import open_storage
    from vllm_acs.storage.files import LocalFileStore

    async def files_of(settings: Settings) -> object:
        storage = await open_storage(settings)
        await storage.close()
        return storage.files

    assert isinstance(asyncio.run(files_of(Settings(home=tmp_path))), LocalFileStore)
    chosen = asyncio.run(files_of(seaweedfs.settings(seaweedfs.prefix(), home=tmp_path)))
    assert isinstance(chosen, S3FileStore)
    with pytest.raises(SettingsError):
        asyncio.run(files_of(Settings(home=tmp_path / "x", s3_bucket="b", s3_endpoint="ftp://")))
    assert not (tmp_path / "x").exists()  # refused before the database was made


def test_the_retention_sweep_on_s3(store):
    from vllm_acs.harvest.retention import sweep_files

    class _NoRows:
        async def get(self, job_id: str, key_id: str | None = None) -> None:
            return None

    async def scenario() -> list[int]:
        await store.write("harvests/job_orphan/manifest.json", b"{}")
        await store.write("harvests/job_orphan/_state/stats_00001.safetensors", b"x")
        now = datetime.now(timezone.utc)
        counts = [await sweep_files(store, _NoRows(), now)]  # within the hour's grace
        counts.append(await sweep_files(store, _NoRows(), now + timedelta(hours=2)))
        assert await store.modified_at("harvests/job_orphan") is None
        counts.append(await sweep_files(store, _NoRows(), now + timedelta(hours=3)))
        return counts

    assert asyncio.run(scenario()) == [0, 1, 0]


def test_names_reach_the_bucket_under_the_prefix(seaweedfs, store: S3FileStore):
    """The object's key is prefix + name: what an operator sees in the bucket."""
    import obstore
    from obstore.store import S3Store

    asyncio.run(store.write("harvests/job_1/manifest.json", b"{}"))
    prefix = store.store.prefix
    bare = S3Store(
        seaweedfs.bucket,
        endpoint=seaweedfs.endpoint,
        region="us-east-1",
        access_key_id=seaweedfs.access_key_id,
        secret_access_key=seaweedfs.secret_access_key,
        client_options={"allow_http": True},
    )

    async def head() -> dict:
        return await obstore.head_async(bare, f"{prefix}/harvests/job_1/manifest.json")

    assert asyncio.run(head())["size"] == 2


def test_a_store_that_does_not_answer_is_an_outage_not_a_bug(seaweedfs):
    """The error an unreachable store raises is what the envelope answers `503
    harvest_unavailable` (with Retry-After) rather than `500`."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nobody listens there once the socket is closed
    settings = dataclasses.replace(
        seaweedfs.settings(seaweedfs.prefix("down")), s3_endpoint=f"http://127.0.0.1:{port}"
    )
    store = S3FileStore.from_settings(settings)
    with pytest.raises(Exception) as failed:
        asyncio.run(store.write("harvests/job_x/manifest.json", b"{}"))
    assert type(failed.value).__module__.startswith("obstore")
    assert outage_of(failed.value) == "files"

    async def route(scope, receive, send) -> None:
        raise failed.value

    answer = request(RequestIdMiddleware(ErrorEnvelopeMiddleware(route)), "POST", "/v1/harvest")
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "harvest_unavailable"
    assert answer.headers["retry-after"] == "2"
