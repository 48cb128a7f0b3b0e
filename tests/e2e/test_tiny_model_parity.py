"""The tiny model means the same thing to transformers and to vLLM: same greedy next token."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

PROMPTS = ["The sky is", "Once upon a time", "def main():", "Researchers read the", "Grass"]


def test_transformers_greedy_next_token_equals_vllm(openai_client, model_id, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id
        with torch.no_grad():
            expected = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        # vLLM scores the prompt followed by transformers' pick: rank 1 means vLLM's greedy
        # next token is the same id (compared as ids, so partial UTF-8 tokens are no trouble).
        result = openai_client.completions.create(
            model=model_id,
            prompt=[*ids, expected],
            max_tokens=1,
            temperature=0,
            extra_body={"prompt_logprobs": 1},
        )
        last = result.choices[0].model_extra["prompt_logprobs"][-1]
        assert last[str(expected)]["rank"] == 1, prompt
