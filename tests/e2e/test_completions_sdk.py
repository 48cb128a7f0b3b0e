"""The official openai SDK against a real `vllm-acs serve` on the tiny model."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

PROMPT = "The sky is"


def greedy(client, model_id: str, prompt, max_tokens: int = 6) -> str:
    result = client.completions.create(
        model=model_id, prompt=prompt, max_tokens=max_tokens, temperature=0
    )
    return result.choices[0].text


def test_completion_answers_with_the_checkpoint_and_usage(openai_client, model_id, checkpoint):
    result = openai_client.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=5, temperature=0
    )
    assert result.object == "text_completion"
    assert result.model == checkpoint
    assert len(result.choices) == 1
    choice = result.choices[0]
    assert choice.index == 0
    assert choice.finish_reason == "length"
    assert choice.text
    # "The sky is" is three tokens plus the BOS the tokenizer adds.
    assert result.usage.prompt_tokens == 4
    assert result.usage.completion_tokens == 5
    assert result.usage.total_tokens == 9


def test_omitted_model_uses_the_default(openai_client, model_id, checkpoint):
    result = openai_client.completions.create(
        model=None,
        prompt=PROMPT,
        max_tokens=3,
        temperature=0,  # type: ignore[arg-type]
    )
    assert result.model == checkpoint
    assert result.choices[0].text == greedy(openai_client, model_id, PROMPT, 3)


def test_stream_with_include_usage(openai_client, model_id):
    stream = openai_client.completions.create(
        model=model_id,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert len(content) >= 1
    assert "".join(c.choices[0].text for c in content) == greedy(openai_client, model_id, PROMPT)
    assert content[-1].choices[0].finish_reason == "length"
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.prompt_tokens == 4
    assert last.usage.completion_tokens == 6


def test_logprobs_list_each_generated_token(openai_client, model_id):
    result = openai_client.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3
    )
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == 4
    assert len(logprobs.token_logprobs) == 4
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert "".join(logprobs.tokens) == result.choices[0].text
    for token, top in zip(logprobs.tokens, logprobs.top_logprobs, strict=True):
        # vLLM lists the sampled token plus k alternatives; greedy means it is among the top k.
        assert 3 <= len(top) <= 4
        assert token in top
        assert top[token] == max(top.values())


def test_prompt_logprobs_through_extra_body(openai_client, model_id):
    result = openai_client.completions.create(
        model=model_id,
        prompt=PROMPT,
        max_tokens=1,
        temperature=0,
        extra_body={"prompt_logprobs": 2},
    )
    prompt_logprobs = result.choices[0].model_extra["prompt_logprobs"]
    assert len(prompt_logprobs) == 4  # one per prompt token; the first has no prediction
    assert prompt_logprobs[0] is None
    for position in prompt_logprobs[1:]:
        assert 2 <= len(position) <= 3
        assert all(entry["logprob"] <= 0 for entry in position.values())


def test_echo_puts_the_prompt_in_front(openai_client, model_id):
    result = openai_client.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=3, temperature=0, echo=True
    )
    assert result.choices[0].text == PROMPT + greedy(openai_client, model_id, PROMPT, 3)


def test_n_with_two_prompts_orders_choices_prompt_major(openai_client, model_id):
    prompts = ["The sky is", "Numbers like"]
    result = openai_client.completions.create(
        model=model_id, prompt=prompts, max_tokens=4, n=2, seed=7, echo=True
    )
    assert [c.index for c in result.choices] == [0, 1, 2, 3]
    # Choice p*n + i belongs to prompt p: with echo, each choice starts with its prompt.
    for p, prompt in enumerate(prompts):
        for i in range(2):
            assert result.choices[p * 2 + i].text.startswith(prompt)
    assert result.usage.completion_tokens == 16


def test_token_id_prompt_matches_the_text_prompt(openai_client, model_id, tiny_model_dir):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model_dir)(PROMPT)["input_ids"]
    result = openai_client.completions.create(
        model=model_id, prompt=ids, max_tokens=6, temperature=0
    )
    assert result.usage.prompt_tokens == len(ids)
    assert result.choices[0].text == greedy(openai_client, model_id, PROMPT)


def test_same_seed_same_tokens(openai_client, model_id):
    def sample(seed: int) -> str:
        result = openai_client.completions.create(
            model=model_id, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=seed
        )
        return result.choices[0].text

    first = sample(1234)
    assert sample(1234) == first
    # Twelve tokens sampled at temperature 1 from a ~1000-token vocabulary: other seeds differ.
    assert len({sample(s) for s in (1, 2, 3)} | {first}) > 1


def test_stream_without_include_usage_has_no_usage_chunk(openai_client, model_id):
    # The plugin meters every stream from vLLM's usage chunk; the client did not ask for it here.
    chunks = list(
        openai_client.completions.create(
            model=model_id, prompt=PROMPT, max_tokens=6, temperature=0, stream=True
        )
    )
    assert chunks and all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == greedy(openai_client, model_id, PROMPT)
