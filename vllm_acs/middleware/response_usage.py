"""`ResponseUsage`: the tokens a /v1/completions answer used, read from the bytes as they pass.

API server process, used by AdmissionMiddleware. Non-streamed answers end with vLLM's `usage`
object; streamed ones carry it in the last chunk when asked, and otherwise completion tokens are
counted chunk by chunk, so a stream cut short still settles at what was delivered.
"""

from __future__ import annotations

import json
from typing import Any

_TAIL = 64 * 1024
_USAGE = b'"usage"'
# How the plugin's own residual-stream chunk starts to differ from vLLM's chunks (its keys come
# in this order: activation_response.py), looked for in the first _HEAD bytes of a line.
_ACTIVATIONS_CHUNK = b'"choices":[],"activations":'
_HEAD = 4096


def _usage_of(payload: Any) -> tuple[int, int] | None:
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return prompt, completion
    return None


class ResponseUsage:
    def __init__(self, *, stream: bool) -> None:
        self.stream = stream
        self.status: int | None = None
        self.reported: tuple[int, int] | None = None
        self.streamed_tokens = 0
        self._pending = b""
        self._tail = b""

    def feed(self, body: bytes) -> None:
        if not body:
            return
        if self.stream:
            self._feed_events(body)
        else:
            self._tail = (self._tail + body[-_TAIL:])[-_TAIL:]  # no copy of a large body

    def _feed_events(self, body: bytes) -> None:
        self._pending += body
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            if _ACTIVATIONS_CHUNK in line[:_HEAD]:
                # The plugin's own residual-stream chunk (activation_response.py): it can be
                # megabytes and carries no tokens, so it is neither copied nor parsed here.
                continue
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if not data or data == b"[DONE]":
                continue
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            usage = _usage_of(chunk)
            if usage is not None:
                self.reported = usage
            for choice in chunk.get("choices") or ():
                # vLLM streams one generated token per choice per chunk; the final chunk of a
                # choice carries only its finish_reason and no text.
                if isinstance(choice, dict) and choice.get("text"):
                    self.streamed_tokens += 1

    def _usage_from_tail(self) -> tuple[int, int] | None:
        at = self._tail.rfind(_USAGE)
        if at < 0:
            return None
        rest = self._tail[at + len(_USAGE) :].lstrip()
        if not rest.startswith(b":"):
            return None
        try:
            value, _ = json.JSONDecoder().raw_decode(rest[1:].decode("utf-8", "replace").lstrip())
        except ValueError:
            return None
        return _usage_of({"usage": value})

    def tokens(self, prompt_tokens: int) -> tuple[int, int]:
        """(prompt, completion) to settle at: vLLM's usage when it said so, else what was seen."""
        if not self.stream and self.reported is None:
            self.reported = self._usage_from_tail()
        if self.reported is not None:
            return self.reported
        if self.status is None or self.status >= 400:
            return 0, 0  # nothing was generated for the client
        return prompt_tokens, self.streamed_tokens
