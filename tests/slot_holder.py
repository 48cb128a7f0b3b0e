"""A streamed completion that keeps its key's running slot for as long as a test holds it open,
however fast the engine.

A node gives a request's slot back once it has sent the whole answer. Plain text is small: the
answer of a few thousand tokens fits in the socket buffers, so a stream that a test merely stops
reading still ends when the engine does, on a fast host before the test's next step (CI failed
that way more than once: 1,500 and then 8,000 plain tokens were over before the requests that
should have found the slot taken). Here each of 4 x 2,000 tokens carries 100 logprobs, about
20 MB of events, and the client reads through a 16 KiB receive buffer: the node's writes stall
until the test reads on (`rest`) or leaves the block (the client closes, the node aborts the
request and gives the slot back).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import httpx

from tests.harness import wait_until

HOLDING = {"max_tokens": 2000, "n": 4, "logprobs": 100, "temperature": 1.0, "stream": True}
RECEIVE_BUFFER_BYTES = 16 * 1024


def held_tokens(prompt_tokens: int) -> int:
    """What admission holds on the key's token budget for a holding stream."""
    return prompt_tokens + HOLDING["n"] * HOLDING["max_tokens"]


class HeldStream:
    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.iter_lines()  # kept: a dropped iterator closes the connection
        # Until the first event: admitted, and the engine is generating.
        next(line for line in self._lines if line.startswith("data: "))

    def rest(self) -> list[str]:
        """Reads on to the end of the stream: its remaining lines."""
        return list(self._lines)


@contextlib.contextmanager
def holding_stream(
    base_url: str, headers: dict[str, str], body: dict[str, Any], *, timeout: float = 120
) -> Iterator[HeldStream]:
    """POST /v1/completions with `body` made a holding stream, open until the block ends."""
    slow_reader = httpx.HTTPTransport(
        socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)]
    )
    with (
        httpx.Client(
            base_url=base_url,
            headers=headers,
            timeout=timeout,
            transport=slow_reader,
            trust_env=False,
        ) as client,
        client.stream("POST", "/v1/completions", json={**body, **HOLDING}) as response,
    ):
        if response.status_code != 200:
            raise AssertionError(f"the holding stream was refused: {response.read()!r}")
        # Bound here, so the stream's line iterator lives as long as the block, whether or not
        # the caller keeps the HeldStream: a collected iterator would close the connection.
        held = HeldStream(response)
        yield held


def wait_for_the_slot(base_url: str, headers: dict[str, str], model: str | None = None) -> None:
    """Until a one-token request of the key is admitted: the slot is back once a holding stream
    was closed (an AssertionError after 30 s)."""
    body = {"prompt": "x", "max_tokens": 1, **({"model": model} if model else {})}
    wait_until(
        lambda: (
            httpx.post(
                f"{base_url}/v1/completions",
                json=body,
                headers=headers,
                timeout=60,
                trust_env=False,
            ).status_code
            == 200
        ),
        "the slot back after the holding stream closed",
    )
