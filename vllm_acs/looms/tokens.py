"""A Node's token data cut at a character offset, at a token boundary.

Pure (API server process). Token data is the Node's token ids and its per-token entries (`text`,
`id`, `logprob`, `top_logprobs`, and from a branch `offset`: where the token's text starts in
the Node's text). A token's own `text` may not be its share of the Node's text (a multi-byte
character cut between tokens), so a branch's tokens are cut where a token's `offset` is the
offset; tokens without offsets (an import) where their texts, joined, are the Node's text and
one ends there. Otherwise neither part keeps token data: only the text is known to line up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenData:
    token_ids: list[int] | None = None
    tokens: list[dict[str, Any]] | None = None


def boundary(text: str, tokens: list[dict[str, Any]], offset: int) -> int | None:
    """The number of tokens before `offset` when a token boundary is there; else None."""
    if tokens and all("offset" in t for t in tokens):
        starts = [t["offset"] for t in tokens]
        if offset == len(text):
            return len(tokens)
        return next((k for k, start in enumerate(starts) if start == offset), None)
    pieces = [str(t.get("text", "")) for t in tokens]
    if "".join(pieces) != text:
        return None
    end = 0
    for index, piece in enumerate(pieces):
        if end == offset:
            return index
        end += len(piece)
    return len(pieces) if end == offset else None


def split_token_data(
    text: str,
    token_ids: list[int] | None,
    tokens: list[dict[str, Any]] | None,
    offset: int,
) -> tuple[TokenData, TokenData]:
    if tokens is None or token_ids is None or len(tokens) != len(token_ids):
        return TokenData(), TokenData()
    cut = boundary(text, tokens, offset)
    if cut is None:
        return TokenData(), TokenData()
    tail = [_moved(t, offset) for t in tokens[cut:]]
    return TokenData(token_ids[:cut], tokens[:cut]), TokenData(token_ids[cut:], tail)


def _moved(token: dict[str, Any], by: int) -> dict[str, Any]:
    """A token of the new child: its offset counted from the child's first character."""
    if token.get("offset") is None:
        return token
    return {**token, "offset": token["offset"] - by}
