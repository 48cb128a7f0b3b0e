"""ResponseUsage: the tokens an answer used, from vLLM's usage or by counting stream chunks."""

from __future__ import annotations

import json

from vllm_acs.middleware.response_usage import ResponseUsage


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def test_non_streamed_usage_is_read_from_the_tail_even_in_pieces():
    body = json.dumps(
        {
            "choices": [{"text": "x" * 100_000}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": None},
        }
    ).encode()
    meter = ResponseUsage(stream=False)
    meter.status = 200
    for start in range(0, len(body), 999):
        meter.feed(body[start : start + 999])
    assert meter.tokens(prompt_tokens=99) == (7, 3)


def test_streamed_usage_chunk_wins_over_counting():
    meter = ResponseUsage(stream=True)
    meter.status = 200
    stream = (
        b"".join(
            [_event({"choices": [{"index": 0, "text": "a"}]})] * 4
            + [_event({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4}})]
        )
        + b"data: [DONE]\n\n"
    )
    for i in range(0, len(stream), 7):  # events split across messages
        meter.feed(stream[i : i + 7])
    assert meter.tokens(prompt_tokens=2) == (2, 4)


def test_a_cut_stream_counts_what_was_delivered():
    meter = ResponseUsage(stream=True)
    meter.status = 200
    meter.feed(_event({"choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]}))
    meter.feed(_event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}))
    meter.feed(b'data: {"choices": [{"index": 0, "te')  # cut mid-event
    assert meter.tokens(prompt_tokens=5) == (5, 2)


def test_errors_and_missing_answers_cost_nothing():
    meter = ResponseUsage(stream=False)
    assert meter.tokens(prompt_tokens=5) == (0, 0)
    meter.status = 502
    meter.feed(b'{"error": {"code": "vllm_engine_dead"}}')
    assert meter.tokens(prompt_tokens=5) == (0, 0)
