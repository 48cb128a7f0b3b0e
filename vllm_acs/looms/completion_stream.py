"""Reads a streamed `/v1/completions` answer (Server-Sent Events) into `n` growing continuations.

Pure (API server process): the branch job feeds it the body chunks as the replay sends them.
Each choice gathers its text, token ids (vLLM's `return_token_ids`), per-token logprobs with
their alternatives, the prompt's token ids and its finish_reason. An error frame is kept. A
token's `offset` is where its text starts in the continuation: the first token of a chunk starts
where the chunk's text does; the others of a chunk (vLLM merges steps when its reader lags) by
their decoded texts when those make up the chunk's text, else None (not a boundary to cut at).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Continuation:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    tokens: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None


@dataclass(frozen=True)
class Delta:
    index: int
    text: str


class CompletionStream:
    def __init__(self, n: int) -> None:
        self.choices = [Continuation() for _ in range(n)]
        self.prompt_token_ids: list[int] | None = None
        self.error: dict[str, Any] | None = None
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[Delta]:
        """The text each choice gained from this chunk of the body."""
        self._buffer += chunk
        deltas: list[Delta] = []
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            for line in event.splitlines():
                if line.startswith(b"data:"):
                    deltas.extend(self._data(line[5:].strip()))
        return deltas

    def _data(self, data: bytes) -> list[Delta]:
        if not data or data == b"[DONE]":
            return []
        try:
            frame = json.loads(data)
        except ValueError:
            return []
        if not isinstance(frame, dict):
            return []
        if "error" in frame:
            self.error = frame
            return []
        deltas = []
        for choice in frame.get("choices") or []:
            index = int(choice.get("index", 0))
            if not 0 <= index < len(self.choices):
                continue
            deltas.extend(self._choice(index, choice))
        return deltas

    def _choice(self, index: int, choice: dict[str, Any]) -> list[Delta]:
        target = self.choices[index]
        if choice.get("prompt_token_ids") and self.prompt_token_ids is None:
            self.prompt_token_ids = list(choice["prompt_token_ids"])
        ids = list(choice.get("token_ids") or [])
        target.token_ids.extend(ids)
        entries = _tokens(choice.get("logprobs"), ids)
        text = choice.get("text") or ""
        _place(entries, len(target.text), text)
        target.tokens.extend(entries)
        target.text += text
        if choice.get("finish_reason") is not None:
            target.finish_reason = choice["finish_reason"]
            target.stop_reason = choice.get("stop_reason")
        return [Delta(index, text)] if text else []


def _place(entries: list[dict[str, Any]], start: int, text: str) -> None:
    """Each entry's `offset` in the continuation, for a chunk whose text begins at `start`."""
    exact = "".join(str(e["text"]) for e in entries) == text
    position = start
    for k, entry in enumerate(entries):
        entry["offset"] = position if k == 0 or exact else None
        position += len(str(entry["text"]))


def _tokens(logprobs: Any, ids: list[int]) -> list[dict[str, Any]]:
    """Per-token entries of one chunk: `text`, `id`, `logprob`, `top_logprobs` (best first)."""
    if not isinstance(logprobs, dict):
        return []
    texts = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    entries = []
    for k, text in enumerate(texts):
        top = tops[k] if k < len(tops) and isinstance(tops[k], dict) else {}
        alternatives = sorted(top.items(), key=lambda item: -item[1])
        entries.append(
            {
                "text": text,
                "id": ids[k] if k < len(ids) and len(ids) == len(texts) else None,
                "logprob": values[k] if k < len(values) else None,
                "top_logprobs": [{"text": t, "logprob": lp} for t, lp in alternatives],
            }
        )
    return entries
