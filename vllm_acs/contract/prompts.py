"""The four prompt forms of /v1/completions, told apart and counted in tokens.

API server process. Text is counted with the model's own tokenizer (the one vLLM uses); token ids
count as ids. Mixed lists, `[]`, `[[]]` and a batch holding an empty id list are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest
from ..served_model import Tokenize


@dataclass(frozen=True)
class PromptBatch:
    texts: list[str] | None  # None when the client sent token ids
    token_ids: list[list[int]]
    batched: bool  # a list of prompts, even of one

    @property
    def count(self) -> int:
        return len(self.token_ids)

    @property
    def total_tokens(self) -> int:
        return sum(len(ids) for ids in self.token_ids)

    @property
    def has_empty_text(self) -> bool:
        return self.texts is not None and any(t == "" for t in self.texts)

    def as_token_ids(self) -> list[int] | list[list[int]]:
        return self.token_ids if self.batched else self.token_ids[0]


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ids(ids: list[Any], vocab_size: int, where: str) -> list[int]:
    if not ids:
        raise InvalidRequest(f"'{where}' must not be an empty token list.", param="prompt")
    for token in ids:
        if not _is_token_id(token):
            raise InvalidRequest(f"'{where}' mixes token ids with other values.", param="prompt")
        if not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"'{where}' holds token id {token}, outside the vocabulary [0, {vocab_size}).",
                param="prompt",
            )
    return ids


def parse_prompt(
    prompt: Any, tokenize: Tokenize, add_special_tokens: bool, vocab_size: int
) -> PromptBatch:
    """Classifies `prompt` into one of the four forms and counts its tokens."""
    if isinstance(prompt, str):
        return PromptBatch([prompt], [tokenize(prompt, add_special_tokens)], batched=False)
    if not isinstance(prompt, list):
        raise InvalidRequest(
            "Invalid type for 'prompt': expected a string, a list of strings, a list of token "
            "ids or a list of token-id lists.",
            param="prompt",
        )
    if not prompt:
        raise InvalidRequest("'prompt' must not be an empty list.", param="prompt")
    if all(isinstance(p, str) for p in prompt):
        ids = [tokenize(text, add_special_tokens) for text in prompt]
        return PromptBatch(list(prompt), ids, batched=True)
    if all(_is_token_id(p) for p in prompt):
        return PromptBatch(None, [_check_ids(prompt, vocab_size, "prompt")], batched=False)
    if all(isinstance(p, list) for p in prompt):
        ids = [_check_ids(p, vocab_size, f"prompt[{i}]") for i, p in enumerate(prompt)]
        return PromptBatch(None, ids, batched=True)
    raise InvalidRequest(
        "'prompt' is a mixed list: use only strings, only token ids, or only token-id lists.",
        param="prompt",
    )
