"""The models operations of /openapi.json: the list, one model, and a model's status.

API server process.
"""

from __future__ import annotations

from typing import Any

from ..openapi_parts import REF, RETRY, error_doc, json_doc, path_param
from .protocol import ModelCard, ModelList, ModelStatus

MODEL_ID = {
    **path_param("model_id"),
    "description": "A short id from GET /v1/models (e.g. tiny-llama)",
}


def model_schemas() -> dict[str, Any]:
    components: dict[str, Any] = {}
    for model in (ModelList, ModelCard, ModelStatus):
        schema = model.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


def model_paths() -> dict[str, Any]:
    return {
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "responses": {
                    "200": json_doc("The models", "ModelList"),
                    "401": error_doc(401),
                    "500": error_doc(500),
                },
            }
        },
        "/v1/models/{model_id}": {
            "get": {
                "operationId": "getModel",
                "parameters": [MODEL_ID],
                "responses": {
                    "200": json_doc("One model", "ModelCard"),
                    "401": error_doc(401),
                    "404": error_doc(404),
                    "500": error_doc(500),
                },
            }
        },
        "/v1/models/{model_id}/status": {
            "get": {
                "operationId": "getModelStatus",
                "summary": "Whether a live node of the deployment serves the model, and how many",
                "description": "warm: at least one live node serves the model (nodes > 0). "
                "A model whose nodes all stopped heartbeating answers warm: false, nodes: 0 "
                "until the registry forgets them; a model no node ever served here is a 404.",
                "parameters": [MODEL_ID],
                "responses": {
                    "200": json_doc("The model's status", "ModelStatus"),
                    "401": error_doc(401),
                    "404": error_doc(404),
                    "500": error_doc(500),
                    "503": error_doc(503, *RETRY),
                },
            }
        },
    }
