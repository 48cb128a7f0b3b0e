"""Splits a streamed response body into whole server-sent events, for middleware that rewrite them.

API server process. An event cut across two body chunks is held back until its end arrives; the
last chunk (`more_body` false) flushes whatever is left.
"""

from __future__ import annotations

EVENT_END = b"\n\n"


class SseEventBuffer:
    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes, more: bool) -> list[bytes]:
        """The whole events this chunk completes (without their blank-line ending)."""
        data = self._pending + chunk
        boundary = data.rfind(EVENT_END)
        cut = len(data) if not more else (boundary + 2 if boundary >= 0 else 0)
        complete, self._pending = data[:cut], data[cut:]
        return [event for event in complete.split(EVENT_END) if event.strip()]
