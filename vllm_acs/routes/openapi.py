"""/openapi.json: the public surface (/v1/* and /health) as the plugin really serves it.

API server process. Built from the same pydantic models the validation uses, so the documented
bounds are the enforced ones; every operation lists its error statuses with the envelope schema
and the X-Acs-* / Retry-After headers.
"""

from __future__ import annotations

from typing import Any

from ..contract.activation_fields import CODEC_SCHEMA
from ..contract.completion_request import CompletionRequest
from ..errors import REQUEST_ID_PATTERN
from ..settings import Settings
from .models.protocol import ModelCard, ModelList

_REF = "#/components/schemas/{model}"

ERROR_ENVELOPE = {
    "type": "object",
    "required": ["error", "request_id"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string", "description": "The spec's error code"},
            },
        },
        "request_id": {"type": "string", "description": "Equals the X-Request-Id header"},
    },
}

COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["text_completion"]},
        "created": {"type": "integer"},
        "model": {"type": "string", "description": "The checkpoint that served the request"},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "text"],
                "properties": {
                    "index": {"type": "integer"},
                    "text": {"type": "string"},
                    "finish_reason": {"type": ["string", "null"]},
                    "stop_reason": {"type": ["string", "integer", "null"]},
                    "logprobs": {"type": ["object", "null"]},
                    "prompt_logprobs": {"type": ["array", "null"]},
                },
            },
        },
        "activations": {
            "type": "object",
            "description": "With output_residual_stream: the residual stream in the codec, "
            "shape [n_layers, prompt tokens + generated tokens - 1, hidden]",
            "properties": {"residual_stream": CODEC_SCHEMA},
        },
        "usage": {
            "type": ["object", "null"],
            "properties": {
                "prompt_tokens": {"type": "integer"},
                "completion_tokens": {"type": "integer"},
                "total_tokens": {"type": "integer"},
            },
        },
    },
}

HEADERS: dict[str, dict[str, Any]] = {
    "X-Request-Id": {
        "description": "The request's trace id (the client's when 1-64 of [A-Za-z0-9_-])",
        "required": True,
        "schema": {"type": "string", "pattern": f"^{REQUEST_ID_PATTERN.pattern}$"},
    },
    "X-Acs-Upstream-Model": {"description": "The checkpoint", "schema": {"type": "string"}},
    "X-Acs-Upstream-Gpu": {"description": "The operator's gpu_shape", "schema": {"type": "string"}},
    "X-Acs-Upstream-Error-Kind": {
        "description": "Mirrors error.code on engine errors",
        "schema": {"type": "string"},
    },
    "X-Acs-Max-Tokens-Clamped": {
        "description": "requested=N,applied=M,reason=budget|deadline|deadline+budget,"
        "source=client|default",
        "schema": {"type": "string"},
    },
    "Retry-After": {"description": "Seconds before a retry", "schema": {"type": "string"}},
    "retry-after-ms": {"description": "Milliseconds before a retry", "schema": {"type": "string"}},
    "x-should-retry": {
        "description": "false: resending cannot fix it",
        "schema": {"type": "string"},
    },
}

_ERROR_TEXT = {
    400: "Invalid request (invalid_request, bad_json, model_not_found, context_length_exceeded, "
    "deadline_infeasible, full_vocab_prompt_too_long, activation_prompt_too_long, "
    "position_steering_unavailable, chat_completions_unsupported, vllm_invalid_request, "
    "vllm_context_length)",
    401: "No valid key (missing_authorization, invalid_api_key, key_revoked, key_disabled, "
    "account_suspended, account_not_approved)",
    403: "scope_denied: the key lacks the route's scope",
    404: "Unknown route or id",
    413: "request_too_large",
    429: "budget_exceeded, activation_quota_exceeded (no Retry-After), queue_full, rate_limited, "
    "spend_cap (Retry-After)",
    500: "internal_error",
    502: "The inference engine failed (vllm_oom, vllm_engine_dead, upstream_server_error; "
    "capture_incomplete (retry after Retry-After), capture_rows_missing (not retryable))",
}


def _headers(*names: str) -> dict[str, Any]:
    return {name: {"$ref": f"#/components/headers/{name}"} for name in ("X-Request-Id", *names)}


def _error(status: int, *headers: str) -> dict[str, Any]:
    return {
        "description": _ERROR_TEXT[status],
        "headers": _headers(*headers),
        "content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorEnvelope")}}},
    }


def _json(description: str, schema_name: str, *headers: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": _headers(*headers),
        "content": {"application/json": {"schema": {"$ref": _REF.format(model=schema_name)}}},
    }


def _completions_operation() -> dict[str, Any]:
    upstream = ("X-Acs-Upstream-Model", "X-Acs-Upstream-Gpu")
    ok = _json("A completion", "Completion", *upstream, "X-Acs-Max-Tokens-Clamped")
    ok["content"]["text/event-stream"] = {
        "schema": {
            "type": "string",
            "description": "SSE chunks ending with data: [DONE]; with output_residual_stream, "
            'one chunk with "choices": [] and "activations" comes before the usage chunk',
        }
    }
    return {
        "operationId": "createCompletion",
        "summary": "Generate continuations of a prompt",
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": _REF.format(model="CompletionRequest")}}
            },
        },
        "parameters": [
            {
                "name": "X-Acs-Workload",
                "in": "header",
                "required": False,
                "description": "interactive | batch: recorded in the usage log, changes nothing",
                "schema": {"type": "string"},
            }
        ],
        "responses": {
            "200": ok,
            "400": _error(400, *upstream, "X-Acs-Upstream-Error-Kind", "x-should-retry"),
            "401": _error(401),
            "403": _error(403),
            "413": _error(413, "x-should-retry"),
            "429": _error(429, "Retry-After", "retry-after-ms", "x-should-retry"),
            "500": _error(500, "x-should-retry"),
            "502": _error(
                502,
                *upstream,
                "X-Acs-Upstream-Error-Kind",
                "Retry-After",
                "retry-after-ms",
                "x-should-retry",
            ),
        },
    }


def build_openapi(settings: Settings, version: str) -> dict[str, Any]:
    schemas = CompletionRequest.model_json_schema(ref_template=_REF)
    components: dict[str, Any] = {"CompletionRequest": schemas}
    components.update(schemas.pop("$defs", {}))
    for model in (ModelList, ModelCard):
        schema = model.model_json_schema(ref_template=_REF)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    components["ErrorEnvelope"] = ERROR_ENVELOPE
    components["Completion"] = COMPLETION
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "vllm_acs research API",
            "version": version,
            "description": f"Bodies above {settings.body_limit_bytes} bytes are refused (413).",
        },
        "paths": {
            "/v1/completions": {"post": _completions_operation()},
            "/v1/chat/completions": {
                "post": {
                    "operationId": "chatCompletionsUnsupported",
                    "summary": "Not supported: always 400 chat_completions_unsupported",
                    "responses": {
                        "400": _error(400),
                        "401": _error(401),
                        "413": _error(413),
                        "500": _error(500),
                    },
                }
            },
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "responses": {
                        "200": _json("The models", "ModelList"),
                        "401": _error(401),
                        "500": _error(500),
                    },
                }
            },
            "/v1/models/{model_id}": {
                "get": {
                    "operationId": "getModel",
                    "parameters": [
                        {
                            "name": "model_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": _json("One model", "ModelCard"),
                        "401": _error(401),
                        "404": _error(404),
                        "500": _error(500),
                    },
                }
            },
            "/health": {
                "get": {
                    "operationId": "health",
                    "security": [],
                    "responses": {
                        "200": {"description": "The engine is up"},
                        "503": {"description": "The engine is down"},
                    },
                }
            },
        },
        "security": [{"apiKey": []}],
        "components": {
            "schemas": components,
            "headers": HEADERS,
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Authorization: Bearer acs-bm-...; every /v1 route needs it",
                }
            },
        },
    }
