"""Request cases for /v1/completions taken from shared/spec (DECISIONS.md, api-reference-v2,
cheatsheets): each says what the client sends and what it must see."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OK = 200


@dataclass(frozen=True)
class Case:
    name: str
    body: Any = None  # a JSON value, or bytes sent as they are
    status: int = OK
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)  # expected response headers
    absent_headers: tuple[str, ...] = ()
    method: str = "POST"
    path: str = "/v1/completions"
    request_headers: dict[str, str] = field(default_factory=dict)


def _p(**fields: Any) -> dict[str, Any]:
    """A small valid request with `fields` on top."""
    return {"model": "tiny-llama", "prompt": "The sky is", "max_tokens": 2, **fields}


def _bad(name: str, body: Any, param: str | None = None, code: str = "invalid_request") -> Case:
    return Case(name, body, 400, code, param)


NO_RETRY = {"x-should-retry": "false"}
UPSTREAM = {"x-acs-upstream-model": "vllm-acs/tiny-llama", "x-acs-upstream-gpu": "cpu-test"}

CASES: list[Case] = [
    # Unknown fields: the message names the field, a literal extra_body included.
    _bad("literal extra_body", _p(extra_body={"top_k": 2}), "extra_body"),
    _bad("unknown field", _p(foo=1), "foo"),
    _bad("best_of unsupported", _p(best_of=2), "best_of"),
    _bad("logit_bias unsupported", _p(logit_bias={"1": 5}), "logit_bias"),
    _bad("suffix unsupported", _p(suffix="x"), "suffix"),
    _bad("vllm_xargs not public", _p(vllm_xargs={"a": 1}), "vllm_xargs"),
    # max_tokens
    _bad("max_tokens string", _p(max_tokens="16"), "max_tokens"),
    _bad("max_tokens boolean", _p(max_tokens=True), "max_tokens"),
    _bad("max_tokens float", _p(max_tokens=1.5), "max_tokens"),
    _bad("max_tokens zero", _p(max_tokens=0), "max_tokens"),
    _bad("max_tokens negative", _p(max_tokens=-1), "max_tokens"),
    _bad("max_tokens over schema bound", _p(max_tokens=1_000_001), "max_tokens"),
    Case("max_tokens one", _p(max_tokens=1), headers=UPSTREAM),
    # temperature
    _bad("temperature 200", _p(temperature=200), "temperature"),
    _bad("temperature negative", _p(temperature=-0.1), "temperature"),
    _bad("temperature boolean", _p(temperature=True), "temperature"),
    _bad("temperature string", _p(temperature="1"), "temperature"),
    Case("temperature integer accepted", _p(temperature=1)),
    Case("temperature zero", _p(temperature=0)),
    Case("temperature 2", _p(temperature=2)),
    Case("temperature 5", _p(temperature=5)),
    Case("temperature 100", _p(temperature=100, max_tokens=1)),
    # top_p
    _bad("top_p zero", _p(top_p=0), "top_p"),
    _bad("top_p above one", _p(top_p=1.5), "top_p"),
    _bad("top_p string", _p(top_p="0.5"), "top_p"),
    Case("top_p one", _p(top_p=1)),
    Case("top_p half", _p(top_p=0.5)),
    # top_k
    _bad("top_k zero", _p(top_k=0), "top_k"),
    _bad("top_k minus two", _p(top_k=-2), "top_k"),
    _bad("top_k float", _p(top_k=1.0), "top_k"),
    _bad("top_k boolean", _p(top_k=True), "top_k"),
    Case("top_k disabled", _p(top_k=-1)),
    Case("top_k five", _p(top_k=5)),
    _bad("top_k 2^64", _p(top_k=2**64), "top_k"),  # once a 500 from the engine
    Case("top_k 2^63-1", _p(top_k=2**63 - 1)),
    # min_p and penalties
    _bad("min_p above one", _p(min_p=1.5), "min_p"),
    _bad("min_p negative", _p(min_p=-0.5), "min_p"),
    Case("min_p", _p(min_p=0.1)),
    _bad("presence_penalty 2.5", _p(presence_penalty=2.5), "presence_penalty"),
    Case("presence_penalty -2", _p(presence_penalty=-2)),
    _bad("frequency_penalty -2.1", _p(frequency_penalty=-2.1), "frequency_penalty"),
    _bad("frequency_penalty boolean", _p(frequency_penalty=False), "frequency_penalty"),
    Case("frequency_penalty 1.5", _p(frequency_penalty=1.5)),
    _bad("repetition_penalty zero", _p(repetition_penalty=0), "repetition_penalty"),
    _bad("repetition_penalty 2.5", _p(repetition_penalty=2.5), "repetition_penalty"),
    Case("repetition_penalty 1.1", _p(repetition_penalty=1.1)),
    # seed
    _bad("seed negative", _p(seed=-1), "seed"),
    _bad("seed 2^63", _p(seed=2**63), "seed"),
    _bad("seed boolean", _p(seed=True), "seed"),
    Case("seed 2^63-1", _p(seed=2**63 - 1)),
    # n
    _bad("n zero", _p(n=0), "n"),
    _bad("n seventeen", _p(n=17), "n"),
    _bad("n boolean", _p(n=True), "n"),
    Case("n two", _p(n=2, temperature=1)),
    # stop
    _bad("five stops", _p(stop=["a", "b", "c", "d", "e"]), "stop"),
    _bad("stop integer", _p(stop=3), "stop"),
    _bad("stop list of integers", _p(stop=[1]), "stop"),
    Case("four stops", _p(stop=["a", "b", "c", "d"])),
    Case("stop string", _p(stop="\n")),
    # logprobs
    _bad("logprobs boolean", _p(logprobs=True), "logprobs"),
    _bad("logprobs 101", _p(logprobs=101), "logprobs"),
    _bad("logprobs negative", _p(logprobs=-1), "logprobs"),
    Case("logprobs zero", _p(logprobs=0)),
    Case("logprobs five", _p(logprobs=5)),
    Case("logprobs at the model cap", _p(logprobs=100, max_tokens=1)),
    # prompt_logprobs
    _bad("prompt_logprobs -2", _p(prompt_logprobs=-2), "prompt_logprobs"),
    _bad("prompt_logprobs 101", _p(prompt_logprobs=101), "prompt_logprobs"),
    Case("prompt_logprobs full vocabulary", _p(prompt_logprobs=-1, max_tokens=1)),
    Case(
        "full vocabulary over 256 prompt tokens",
        _p(prompt=[5] * 257, prompt_logprobs=-1, max_tokens=1),
        400,
        "full_vocab_prompt_too_long",
        "prompt_logprobs",
    ),
    Case(
        "full vocabulary counts prompt tokens x n",
        _p(prompt=[5] * 130, prompt_logprobs=-1, n=2, temperature=1),
        400,
        "full_vocab_prompt_too_long",
        "prompt_logprobs",
    ),
    Case("full vocabulary at exactly 256", _p(prompt=[5] * 256, prompt_logprobs=-1, max_tokens=1)),
    _bad(
        "prompt_logprobs top-k with stream", _p(prompt_logprobs=5, stream=True), "prompt_logprobs"
    ),
    _bad("full vocabulary with stream", _p(prompt_logprobs=-1, stream=True), "prompt_logprobs"),
    Case("prompt_logprobs zero with stream", _p(prompt_logprobs=0, stream=True)),
    # booleans
    _bad("echo string", _p(echo="true"), "echo"),
    _bad("echo integer", _p(echo=1), "echo"),
    _bad("stream string", _p(stream="true"), "stream"),
    _bad("add_special_tokens integer", _p(add_special_tokens=1), "add_special_tokens"),
    Case("echo true", _p(echo=True)),
    # stream_options
    _bad(
        "stream_options without stream",
        _p(stream_options={"include_usage": True}),
        "stream_options",
    ),
    _bad(
        "stream_options with stream false",
        _p(stream=False, stream_options={"include_usage": True}),
        "stream_options",
    ),
    _bad(
        "stream_options unknown key",
        _p(stream=True, stream_options={"include_usage": True, "x": 1}),
        "stream_options.x",
    ),
    _bad(
        "stream_options non-boolean",
        _p(stream=True, stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
    ),
    _bad("stream_options not an object", _p(stream=True, stream_options=[1]), "stream_options"),
    Case("stream with usage", _p(stream=True, stream_options={"include_usage": True})),
    Case(
        "continuous usage stats",
        _p(stream=True, stream_options={"continuous_usage_stats": True, "include_usage": True}),
    ),
    # prompt forms
    _bad("prompt missing", {"model": "tiny-llama", "max_tokens": 2}, "prompt"),
    _bad("prompt empty list", _p(prompt=[]), "prompt"),
    _bad("prompt list holding an empty list", _p(prompt=[[]]), "prompt"),
    _bad("batch holding an empty id list", _p(prompt=[[1, 2], []]), "prompt"),
    _bad("mixed ids and text", _p(prompt=[1, "two"]), "prompt"),
    _bad("mixed text and ids", _p(prompt=["one", 2]), "prompt"),
    _bad("mixed ids and id lists", _p(prompt=[1, [2]]), "prompt"),
    _bad("prompt integer", _p(prompt=5), "prompt"),
    _bad("prompt object", _p(prompt={"text": "x"}), "prompt"),
    _bad("prompt booleans are not ids", _p(prompt=[True, False]), "prompt"),
    _bad("token id outside the vocabulary", _p(prompt=[1, 99999]), "prompt"),
    _bad("negative token id", _p(prompt=[-1]), "prompt"),
    Case("empty string means BOS only", _p(prompt="")),
    Case(
        "empty string without special tokens is the engine's refusal",
        _p(prompt="", add_special_tokens=False),
        400,
        "vllm_invalid_request",
        headers={**UPSTREAM, "x-acs-upstream-error-kind": "vllm_invalid_request", **NO_RETRY},
    ),
    Case("token ids", _p(prompt=[0, 461, 497, 333])),
    Case("batch of token ids", _p(prompt=[[0, 461], [0, 497, 333]])),
    Case("batch of texts", _p(prompt=["The sky is", "Grass"])),
    Case("add_special_tokens false", _p(add_special_tokens=False)),
    # max_tokens required, injected, deadline, output-work cap
    _bad("batch without max_tokens", {"prompt": ["a", "b"]}, "max_tokens"),
    _bad("n > 1 without max_tokens", {"prompt": "a", "n": 2, "temperature": 1}, "max_tokens"),
    Case(
        "deadline infeasible",
        _p(max_tokens=15601),
        400,
        "deadline_infeasible",
        "max_tokens",
        headers=NO_RETRY,
    ),
    Case(
        "output-work cap",
        _p(prompt=["a", "b", "c"], n=16, max_tokens=700, temperature=1),
        400,
        "invalid_request",
        "max_tokens",
    ),
    Case(
        "context length with a text prompt",
        _p(prompt="sky " * 2100, max_tokens=1),
        400,
        "context_length_exceeded",
        "prompt",
    ),
    Case(
        "context length counts token ids as ids",
        _p(prompt=[5] * 2048, max_tokens=1),
        400,
        "context_length_exceeded",
        "prompt",
    ),
    Case(
        "context length with the streaming deadline lifted",
        _p(max_tokens=15601, stream=True),
        400,
        "context_length_exceeded",
    ),
    Case("prompt filling the context but one", _p(prompt=[5] * 2047, max_tokens=1)),
    # model
    _bad("unknown model", _p(model="llama-8b"), "model", "model_not_found"),
    _bad("checkpoint is not an id", _p(model="vllm-acs/tiny-llama"), "model", "model_not_found"),
    _bad("model integer", _p(model=5), "model"),
    Case("model omitted", {"prompt": "The sky is", "max_tokens": 2}, headers=UPSTREAM),
    # bodies that are not a request object
    Case("bad JSON", b'{"prompt": ', 400, "bad_json"),
    Case("empty body", b"", 400, "bad_json"),
    Case("not UTF-8", b"\xff\xfe", 400, "bad_json"),
    _bad("array body", []),
    _bad("null body", None),
    _bad("string body", "prompt"),
    # routes, methods, size
    Case(
        "chat completions",
        {"messages": []},
        400,
        "chat_completions_unsupported",
        path="/v1/chat/completions",
    ),
    Case(
        "GET completions", None, 405, "method_not_allowed", method="GET", headers={"allow": "POST"}
    ),
    Case("unknown route", None, 404, "not_found", method="GET", path="/v1/nope"),
    Case("vLLM's responses route is not public", {}, 404, "not_found", path="/v1/responses"),
    Case("unknown model id", None, 404, "model_not_found", method="GET", path="/v1/models/x"),
    Case(
        "DELETE models",
        None,
        405,
        "method_not_allowed",
        method="DELETE",
        path="/v1/models",
        headers={"allow": "GET, HEAD"},
    ),
    Case(
        "body over 8 MiB",
        b'{"prompt": "' + b"a" * (8 * 1024 * 1024) + b'"}',
        413,
        "request_too_large",
        headers=NO_RETRY,
    ),
    # headers
    Case("workload header accepted", _p(), request_headers={"X-Acs-Workload": "batch"}),
    Case("no clamp header without a clamp", _p(), absent_headers=("x-acs-max-tokens-clamped",)),
    Case("budget clamp refused", _p(), request_headers={"X-Acs-Budget-Clamp": "refuse"}),
    Case("budget clamp allowed", _p(), request_headers={"X-Acs-Budget-Clamp": "allow"}),
    Case(
        "budget clamp header of an unknown value",
        _p(),
        400,
        "invalid_request",
        "X-Acs-Budget-Clamp",
        request_headers={"X-Acs-Budget-Clamp": "Refuse"},
    ),
    Case(
        "engine refusal passed on with its code",
        _p(n=2, temperature=0),
        400,
        "vllm_invalid_request",
        headers={"x-acs-upstream-error-kind": "vllm_invalid_request", **NO_RETRY},
    ),
]
