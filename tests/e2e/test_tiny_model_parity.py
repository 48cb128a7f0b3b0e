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
        result = openai_client.completions.create(
            model=model_id,
            prompt=prompt,
            max_tokens=1,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        assert result.choices[0].model_extra["token_ids"] == [expected], prompt
