"""/openapi.json: the public surface (/v1/* and /health) as the plugin really serves it.

API server process. Built from the same pydantic models the validation uses, so the documented
bounds are the enforced ones; every operation lists its error statuses with the envelope schema
and the X-Acs-* / Retry-After headers.
"""

from __future__ import annotations

from typing import Any

from ..contract.activation_fields import CODEC_SCHEMA
from ..contract.completion_request import CompletionRequest
from ..settings import Settings
from .admin.openapi import admin_paths, admin_schemas
from .applications.openapi import application_paths, application_schemas
from .harvest.openapi import harvest_paths, harvest_schemas
from .jobs.openapi import job_paths, job_schemas
from .keys.openapi import key_paths, key_schemas
from .looms.openapi import loom_paths, loom_schemas
from .models.openapi import model_paths, model_schemas
from .openapi_parts import ERROR_ENVELOPE, HEADERS, REF, error_doc, json_doc
from .usage.openapi import usage_paths, usage_schemas

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


def _completions_operation() -> dict[str, Any]:
    upstream = ("X-Acs-Upstream-Model", "X-Acs-Upstream-Gpu")
    ok = json_doc(
        "A completion. Without stream, a long request's JSON may follow keepalive whitespace "
        "(the 200 is then committed early, and an error arrives as the error envelope in its "
        "body: check for error)",
        "Completion",
        *upstream,
        "X-Acs-Max-Tokens-Clamped",
    )
    # One schema per event, as OpenAPI tools read an event stream (the Loom branch's likewise).
    ok["content"]["text/event-stream"] = {
        "schema": {
            "type": "object",
            "required": ["data"],
            "description": "Unnamed events, each data a Completion chunk as JSON, ending with "
            'data: [DONE]; with output_residual_stream, one chunk with "choices": [] and '
            '"activations" comes before the usage chunk; an error after the 200 is a chunk '
            "holding the error envelope",
            "properties": {
                "event": {"type": "string", "enum": ["message"]},
                "data": {"type": "string"},
            },
        }
    }
    return {
        "operationId": "createCompletion",
        "summary": "Generate continuations of a prompt",
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": REF.format(model="CompletionRequest")}}
            },
        },
        "parameters": [
            {
                "name": "X-Acs-Workload",
                "in": "header",
                "required": False,
                "description": "interactive | batch: recorded in the usage log, changes nothing",
                "schema": {"type": "string"},
            },
            {
                "name": "X-Acs-Budget-Clamp",
                "in": "header",
                "required": False,
                "description": (
                    "allow (the default): a budget that cannot hold max_tokens lowers it and "
                    "says so in X-Acs-Max-Tokens-Clamped; refuse: 429 budget_exceeded instead, "
                    "charging nothing (what the Workbench sends). Anything else is a 400."
                ),
                "schema": {"type": "string", "enum": ["allow", "refuse"], "default": "allow"},
            },
        ],
        "responses": {
            "200": ok,
            "400": error_doc(400, *upstream, "X-Acs-Upstream-Error-Kind", "x-should-retry"),
            "401": error_doc(401),
            "403": error_doc(403),
            "413": error_doc(413, "x-should-retry"),
            "429": error_doc(429, "Retry-After", "retry-after-ms", "x-should-retry"),
            "500": error_doc(500, "x-should-retry"),
            "502": error_doc(
                502,
                *upstream,
                "X-Acs-Upstream-Error-Kind",
                "Retry-After",
                "retry-after-ms",
                "x-should-retry",
            ),
            "504": error_doc(504, *upstream, "X-Acs-Upstream-Error-Kind", "x-should-retry"),
        },
    }


def build_openapi(settings: Settings, version: str) -> dict[str, Any]:
    schemas = CompletionRequest.model_json_schema(ref_template=REF)
    components: dict[str, Any] = {"CompletionRequest": schemas}
    components.update(schemas.pop("$defs", {}))
    components.update(model_schemas())
    components["ErrorEnvelope"] = ERROR_ENVELOPE
    components.update(job_schemas())
    components.update(harvest_schemas())
    components.update(loom_schemas())
    components.update(key_schemas())
    components.update(usage_schemas())
    components.update(application_schemas())
    components.update(admin_schemas())
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
                        "400": error_doc(400),
                        "401": error_doc(401),
                        "413": error_doc(413),
                        "500": error_doc(500),
                    },
                }
            },
            **model_paths(),
            **job_paths(),
            **harvest_paths(),
            **loom_paths(settings),
            **key_paths(),
            **usage_paths(),
            **application_paths(),
            **admin_paths(),
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
