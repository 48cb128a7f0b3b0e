"""nginx itself accepts the configs tests/nginx.py writes (one node, and a list of nodes).

An e2e test: it needs Debian's nginx, which `make services` installs (scripts/ensure-nginx.sh)
like PostgreSQL and Redis; without it the test fails with that instruction.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.nginx import Nginx, nginx_binary

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("upstream", ["http://127.0.0.1:8001", ["http://127.0.0.1:8001"] * 2])
def test_nginx_accepts_the_config(tmp_path, upstream):
    proxy = Nginx(upstream, tmp_path)
    proxy.config_path.write_text(proxy.config())
    done = subprocess.run(
        [nginx_binary(), "-t", "-p", str(tmp_path), "-c", str(proxy.config_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
