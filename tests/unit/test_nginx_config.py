"""tests/nginx.py's config: one node's URL proxied to as it is, or a list of nodes as an
`upstream` block (round-robin, a failed node skipped for 5 s, kept-alive connections).

`nginx -t` checks both texts where nginx is installed; the rest needs no nginx.
"""

from __future__ import annotations

import pytest

from tests.nginx import Nginx


def test_one_upstream_url_is_proxied_to_as_it_is(tmp_path):
    text = Nginx("http://127.0.0.1:8001", tmp_path, port=9000).config()
    assert "proxy_pass http://127.0.0.1:8001;" in text
    assert "upstream acs_nodes" not in text
    assert "listen 127.0.0.1:9000;" in text


def test_a_list_of_urls_is_an_upstream_block(tmp_path):
    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002/"]
    text = Nginx(urls, tmp_path, read_timeout_s=2.5, port=9000).config()
    block = text.split("upstream acs_nodes {", 1)[1].split("}", 1)[0]
    assert [line.strip() for line in block.strip().splitlines()] == [
        "server 127.0.0.1:8001 max_fails=1 fail_timeout=5s;",
        "server 127.0.0.1:8002 max_fails=1 fail_timeout=5s;",
        "keepalive 16;",
        "keepalive_timeout 4s;",  # shorter than a node's own 5 s keep-alive
    ]
    assert "proxy_pass http://acs_nodes;" in text
    assert "proxy_read_timeout 2500ms;" in text


@pytest.mark.parametrize("bad", [[], ["127.0.0.1:8001"], ["http://127.0.0.1:8001/v1"]])
def test_a_list_needs_base_urls(tmp_path, bad):
    with pytest.raises(ValueError):
        Nginx(bad, tmp_path).config()
