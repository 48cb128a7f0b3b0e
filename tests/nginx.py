"""nginx as a reverse proxy in front of a node (or several), for e2e tests and benchmarks: its own
config, logs and port.

No daemon and no system service: `nginx -p DIR -c DIR/nginx.conf -g 'daemon off;'` runs in the
foreground in its own process group and is stopped at the end. Debian's nginx is installed by
`scripts/ensure-nginx.sh` (`make services` runs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import free_port

STARTUP_TIMEOUT_S = 10.0

CONFIG = """\
worker_processes 1;
error_log {dir}/error.log info;
pid {dir}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    # Which node answered, and when: what a failed test's report shows (the request's time,
    # the node's connect and first-byte times), and what `Nginx.timing` reads.
    log_format timed '$time_iso8601 "$request" $status $body_bytes_sent upstream=$upstream_addr '
                     'rt=$request_time uct=$upstream_connect_time uht=$upstream_header_time '
                     'rid=$http_x_request_id';
    access_log {dir}/access.log timed;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
{upstream_block}    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 64m;
        location / {{
            proxy_pass {proxy_pass};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            # Bodies go to the node as they come, as in examples/deployment/nginx.conf: nothing is
            # spooled to client_body (whose directory nginx's workers, `nobody` under a root
            # master, cannot reach inside a test's private temp directory: a 500 for any body
            # past the 16 KiB buffer, e.g. a harvest's).
            proxy_request_buffering off;
            proxy_read_timeout {read_timeout_ms}ms;
        }}
    }}
}}
"""

# Several nodes: nginx's round-robin over them, as examples/deployment/nginx.conf (a node that
# fails a connection is skipped for 5 s; idle connections to the nodes are kept for reuse, and
# dropped by nginx before a node drops them: see that file).
UPSTREAM_NAME = "acs_nodes"
UPSTREAM = """\
    upstream {name} {{
{servers}        keepalive 16;
        keepalive_timeout 4s;
    }}
"""


def _host_port(base_url: str) -> str:
    """`http://127.0.0.1:8001` (a trailing slash or none) -> `127.0.0.1:8001`."""
    scheme, sep, rest = base_url.partition("://")
    if not sep or scheme != "http":
        raise ValueError(f"an upstream must be an http:// base URL, not {base_url!r}")
    host_port = rest.rstrip("/")
    if not host_port or "/" in host_port:
        raise ValueError(f"an upstream in a list must be a base URL with no path: {base_url!r}")
    return host_port


def nginx_binary() -> str:
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else ""
    )
    if not found:
        raise RuntimeError("nginx is not installed: run scripts/ensure-nginx.sh (make services)")
    return found


@dataclass
class Nginx:
    """nginx proxying `upstream` with a given `proxy_read_timeout`: one node's base URL (proxied
    to as it is), or a list of nodes' base URLs (an `upstream` block, round-robin)."""

    upstream: str | Sequence[str]
    directory: Path
    read_timeout_s: float = 60.0
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.directory / "nginx.conf"

    def config(self) -> str:
        """The text of nginx.conf."""
        if isinstance(self.upstream, str):
            upstream_block, proxy_pass = "", self.upstream
        else:
            if not self.upstream:
                raise ValueError("nginx needs at least one upstream")
            servers = "".join(
                f"        server {_host_port(url)} max_fails=1 fail_timeout=5s;\n"
                for url in self.upstream
            )
            upstream_block = UPSTREAM.format(name=UPSTREAM_NAME, servers=servers)
            proxy_pass = f"http://{UPSTREAM_NAME}"
        return CONFIG.format(
            dir=self.directory,
            port=self.port,
            upstream_block=upstream_block,
            proxy_pass=proxy_pass,
            read_timeout_ms=int(self.read_timeout_s * 1000),
        )

    def start(self) -> Nginx:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config())
        command = [
            nginx_binary(),
            "-p",
            str(self.directory),
            "-c",
            str(self.config_path),
            "-g",
            "daemon off;",
        ]
        self._log = open(self.directory / "nginx.out", "wb")  # noqa: SIM115  # closed in stop()
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"nginx exited with {self.process.returncode}:\n{self.log()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx did not listen on {self.port}:\n{self.log()}")

    def timing(self, request_id: str, wait_s: float = 5.0) -> tuple[float, float]:
        """(seconds the request took, seconds until the node's response header came), as nginx
        measured them for the request with this X-Request-Id: the proxy's own clock, which a
        starved client process cannot skew. nginx logs a request as it ends."""
        deadline = time.monotonic() + wait_s
        while True:
            path = self.directory / "access.log"
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            for line in reversed(lines):
                fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
                if fields.get("rid") == request_id:
                    return float(fields["rt"]), float(fields["uht"])
            if time.monotonic() > deadline:
                raise AssertionError(f"nginx logged no request {request_id!r}:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        parts = []
        for name in ("nginx.out", "error.log", "access.log"):
            path = self.directory / name
            if path.exists():
                parts.append(path.read_text(errors="replace")[-4000:])
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGQUIT (nginx's graceful stop) to its group, SIGKILL after a few seconds."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGQUIT)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
        self._log.close()
        self.process = None


@contextlib.contextmanager
def running_nginx(
    upstream: str | Sequence[str], directory: Path, read_timeout_s: float
) -> Iterator[Nginx]:
    """A started nginx in front of `upstream` (one URL or a list), stopped at the end however it
    ends."""
    proxy = Nginx(upstream=upstream, directory=directory, read_timeout_s=read_timeout_s).start()
    try:
        yield proxy
    finally:
        proxy.stop()
