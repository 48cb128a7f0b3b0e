"""The Loom operations of /openapi.json: bounds, headers and every error answer.

API server process. The request bodies are the strict pydantic models the routes validate with
(`contract/loom_requests.py`); the answers are hand schemas of `looms/views.py`, the export
document of `looms/export_file.py` and the replay and score answers of `generation_service.py`.
A branch, replay or score passes on the completions pipeline's own refusals (400, 429, 502).
"""

from __future__ import annotations

from typing import Any

from ...contract.loom_requests import (
    TITLE_MAX_CHARS,
    LoomBranchBody,
    LoomCreateBody,
    LoomPatchBody,
    NodePatchBody,
    NodeScoreBody,
    NodeSplitBody,
    NodeTextBody,
)
from ...looms.export_file import FORMAT, VERSION
from ...looms.import_json import import_depth_limit
from ...settings import Settings
from ...storage.loom_records import ORIGINS, STATUSES
from ..openapi_parts import (
    IDEMPOTENCY_KEY,
    REF,
    RETRY,
    error_doc,
    headers_doc,
    json_doc,
    path_param,
)
from .service import IMPORT_PATH, LIST_LIMIT_MAX, LOOMS_PATH

LOOM_PATH = LOOMS_PATH + "/{loom_id}"
NODE_PATH = LOOM_PATH + "/nodes/{node_id}"
_LOOM_ID = path_param("loom_id")
_NODE_ID = path_param("node_id")
_NULLABLE_OBJECT = {"type": ["object", "null"]}
_TIME = {"type": "integer", "description": "Unix seconds"}

LOOM_NODE = {
    "type": "object",
    "required": [
        "id",
        "object",
        "parent_id",
        "children",
        "text",
        "origin",
        "status",
        "bookmarked",
        "generation",
        "tokens",
        "score",
        "error",
        "tags",
        "created_at",
        "updated_at",
    ],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["loom.node"]},
        "parent_id": {"type": ["string", "null"], "description": "null: the root"},
        "children": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The children's ids, in order",
        },
        "text": {"type": "string"},
        "origin": {"type": "string", "enum": list(ORIGINS)},
        "status": {"type": "string", "enum": list(STATUSES)},
        "bookmarked": {"type": "boolean"},
        "generation": {
            **_NULLABLE_OBJECT,
            "description": "A model's Node: model, checkpoint, parameters, seed, branch_seed, "
            "index, n, branch_id, finish_reason, prompt_token_ids, created_at",
        },
        "tokens": {
            "type": ["array", "null"],
            "items": {"type": "object"},
            "description": "Per token: text, id, logprob, offset, top_logprobs; shown when the "
            "branch asked for logprobs, and for an imported Node as its file had them",
        },
        "score": {
            **_NULLABLE_OBJECT,
            "description": "The last score of this Node: model, checkpoint, tokens, "
            "from_recorded_ids, created_at",
        },
        "error": {**_NULLABLE_OBJECT, "description": "A failed Node: the error envelope"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "created_at": _TIME,
        "updated_at": _TIME,
    },
}

_SUMMARY_PROPERTIES: dict[str, Any] = {
    "id": {"type": "string"},
    "object": {"type": "string", "enum": ["loom"]},
    "title": {"type": ["string", "null"]},
    "node_count": {"type": "integer", "minimum": 1},
    "created_at": _TIME,
    "updated_at": _TIME,
}
LOOM_SUMMARY = {
    "type": "object",
    "required": list(_SUMMARY_PROPERTIES),
    "properties": _SUMMARY_PROPERTIES,
}
LOOM = {
    "type": "object",
    "required": [*_SUMMARY_PROPERTIES, "nodes"],
    "properties": {
        **_SUMMARY_PROPERTIES,
        "nodes": {
            "type": "array",
            "items": {"$ref": REF.format(model="LoomNode")},
            "description": "Every Node, the root first, parents before children",
        },
    },
}
LOOM_LIST = {
    "type": "object",
    "required": ["object", "data", "first_id", "last_id", "has_more"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {
            "type": "array",
            "items": {"$ref": REF.format(model="LoomSummary")},
            "description": "Newest first",
        },
        "first_id": {"type": ["string", "null"]},
        "last_id": {"type": ["string", "null"], "description": "The next page's `after`"},
        "has_more": {"type": "boolean"},
    },
}
LOOM_DELETED = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["loom.deleted"]},
        "deleted": {"type": "boolean", "enum": [True]},
    },
}
NODE_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "items": {"$ref": REF.format(model="LoomNode")}},
    },
}
NODE_DELETED = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["loom.node.deleted"]},
        "deleted": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The ids of the Node and every Node under it",
        },
    },
}
LOOM_BRANCH = {
    "type": "object",
    "required": ["object", "loom_id", "nodes"],
    "properties": {
        "object": {"type": "string", "enum": ["loom.branch"]},
        "loom_id": {"type": "string"},
        "parent_id": {"type": "string", "description": "Absent when the Loom was deleted"},
        "nodes": {
            "type": "array",
            "items": {"$ref": REF.format(model="LoomNode")},
            "description": "The children the branch added (empty continuations are not)",
        },
    },
}
LOOM_REPLAY = {
    "type": "object",
    "required": ["object", "node_id", "identical", "text", "token_ids", "finish_reason", "seed"],
    "properties": {
        "object": {"type": "string", "enum": ["loom.replay"]},
        "node_id": {"type": "string"},
        "identical": {"type": "boolean", "description": "The regenerated text is the Node's"},
        "text": {"type": "string"},
        "token_ids": {"type": ["array", "null"], "items": {"type": "integer"}},
        "finish_reason": {"type": ["string", "null"]},
        "seed": {"type": ["integer", "null"]},
    },
}
# One server-sent event of a streamed branch (OpenAPI 3.1: the schema of each event).
LOOM_BRANCH_EVENT = {
    "type": "object",
    "required": ["data"],
    "description": "`event: started` (data: {nodes}: the children, generating), `event: delta` "
    "per piece of text (data: {node_id, index, text}), then `event: done` (data: the "
    "LoomBranch answer) or `event: error` (data: the error envelope); the stream then ends",
    "properties": {
        "event": {"type": "string", "enum": ["started", "delta", "done", "error"]},
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
}
_NULLABLE_NUMBER = {"type": ["number", "null"]}
_SCORE_TOKEN = {
    "type": "object",
    "required": ["id", "text", "logprob", "rank", "top_logprobs"],
    "properties": {
        "id": {"type": "integer"},
        "text": {"type": ["string", "null"]},
        "logprob": {**_NULLABLE_NUMBER, "description": "null for the first token"},
        "rank": {"type": ["integer", "null"]},
        "top_logprobs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "text", "logprob"],
                "properties": {
                    "id": {"type": "integer"},
                    "text": {"type": ["string", "null"]},
                    "logprob": _NULLABLE_NUMBER,
                },
            },
        },
    },
}
LOOM_SCORE = {
    "type": "object",
    "required": ["object", "node_id", "model", "prompt_token_ids", "nodes"],
    "properties": {
        "object": {"type": "string", "enum": ["loom.score"]},
        "node_id": {"type": "string"},
        "model": {"type": "string"},
        "prompt_token_ids": {"type": "array", "items": {"type": "integer"}},
        "nodes": {
            "type": "array",
            "description": "Each Node of the path with its tokens' scores (also stored on it)",
            "items": {
                "type": "object",
                "required": ["node_id", "model", "checkpoint", "tokens", "from_recorded_ids"],
                "properties": {
                    "node_id": {"type": "string"},
                    "model": {"type": "string"},
                    "checkpoint": {"type": "string"},
                    "tokens": {"type": "array", "items": _SCORE_TOKEN},
                    "from_recorded_ids": {
                        "type": "boolean",
                        "description": "false: the Node's text, tokenized",
                    },
                    "created_at": _TIME,
                },
            },
        },
    },
}
_EXPORT_NODE_PROPERTIES: dict[str, Any] = {
    "id": {"type": "string"},
    "parent_id": {"type": ["string", "null"]},
    "children": {
        "type": "array",
        "items": {"type": "string"},
        "description": "The children's ids, in order (an import reads the order of `nodes`)",
    },
    "text": {"type": "string"},
    "origin": {"type": "string", "enum": list(ORIGINS)},
    "status": {"type": "string", "enum": list(STATUSES)},
    "bookmarked": {"type": "boolean"},
    "generation": _NULLABLE_OBJECT,
    "token_ids": {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0}},
    "tokens": {"type": ["array", "null"], "items": {"type": "object"}},
    "score": _NULLABLE_OBJECT,
    "error": _NULLABLE_OBJECT,
    "tags": {"type": "array", "items": {"type": "string"}},
}
LOOM_EXPORT = {
    "type": "object",
    "required": ["format", "version", "title", "exported_at", "source_loom_id", "nodes"],
    "properties": {
        "format": {"type": "string", "enum": [FORMAT]},
        "version": {"type": "integer", "enum": [VERSION]},
        "title": {"type": ["string", "null"]},
        "exported_at": _TIME,
        "source_loom_id": {"type": "string"},
        "nodes": {
            "type": "array",
            "description": "The root first, parents before children, siblings in order",
            "items": {
                "type": "object",
                "required": list(_EXPORT_NODE_PROPERTIES),
                "properties": _EXPORT_NODE_PROPERTIES,
            },
        },
    },
}


def _import_file() -> dict[str, Any]:
    """What POST /v1/looms/import reads: this API's export document or a socketteer/loom file
    (its limits, the operator's, are in the operation's description)."""
    node = {
        "type": "object",
        "required": ["id", "text"],
        "properties": {
            **_EXPORT_NODE_PROPERTIES,
            "id": {"type": "string", "minLength": 1},
            "status": {
                "type": "string",
                "enum": ["ready", "failed", "generating"],
                "description": "generating (exported mid-branch) is imported as failed",
            },
            "children": {"description": "Not read: siblings keep the order of `nodes`"},
            "bookmarked": {"description": "Read as a boolean"},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}},
        },
    }
    export = {
        "type": "object",
        "title": "Loom export document",
        "required": ["format", "version", "nodes"],
        "properties": {
            "format": {"type": "string", "enum": [FORMAT]},
            "version": {"type": "integer", "enum": [VERSION]},
            "title": {"description": "A string becomes the Loom's title (its first 200 chars)"},
            "nodes": {
                "type": "array",
                "minItems": 1,
                "items": node,
                "description": "nodes[0] is the root (origin root, parent_id null); every "
                "other Node's parent is an earlier Node",
            },
        },
    }
    socketteer = {
        "type": "object",
        "title": "socketteer/loom save file",
        "required": ["root"],
        "properties": {
            "root": {
                "type": "object",
                "description": "The nested root Node: text, children (Nodes), meta, tags, "
                "generation; the file's model_responses hold the generations' tokens",
                "properties": {
                    "text": {"type": "string"},
                    "children": {"type": "array", "items": {"type": "object"}},
                },
                "anyOf": [{"required": ["text"]}, {"required": ["children"]}],
            },
        },
    }
    return {
        "description": "A JSON object: this API's export document (GET /v1/looms/{loom_id}/"
        "export) or a socketteer/loom save file; every Node gets a new id",
        "anyOf": [export, socketteer],
    }


def loom_schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in (
        LoomCreateBody,
        LoomPatchBody,
        NodePatchBody,
        NodeSplitBody,
        NodeTextBody,
        NodeScoreBody,
        LoomBranchBody,
    ):
        schema = model.model_json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    schemas.update(
        {
            "Loom": LOOM,
            "LoomSummary": LOOM_SUMMARY,
            "LoomList": LOOM_LIST,
            "LoomDeleted": LOOM_DELETED,
            "LoomNode": LOOM_NODE,
            "LoomNodeList": NODE_LIST,
            "LoomNodeDeleted": NODE_DELETED,
            "LoomBranch": LOOM_BRANCH,
            "LoomBranchEvent": LOOM_BRANCH_EVENT,
            "LoomReplay": LOOM_REPLAY,
            "LoomScore": LOOM_SCORE,
            "LoomExport": LOOM_EXPORT,
            "LoomImportFile": _import_file(),
        }
    )
    return schemas


def _body(model: str, description: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": REF.format(model=model)}}},
    }
    if description is not None:
        body["description"] = description
    return body


def _errors(*statuses: int, body: bool = False, idempotent: bool = False) -> dict[str, Any]:
    """401, 403 and 500 always; 400 and 413 where a body is read; 409 with Retry-After where
    an Idempotency-Key is taken (`running`); plus the route's own."""
    wanted = {401, 403, 500, *statuses, *((400, 413) if body else ())}
    if idempotent:
        wanted.add(409)
    docs = {
        400: error_doc(400, "x-should-retry"),
        401: error_doc(401),
        403: error_doc(403),
        404: error_doc(404),
        409: error_doc(409, *RETRY) if idempotent else error_doc(409, "x-should-retry"),
        413: error_doc(413, "x-should-retry"),
        429: error_doc(429, "x-should-retry"),  # loom_capacity: the key's Looms' bytes
        500: error_doc(500, "x-should-retry"),
    }
    return {str(status): docs[status] for status in sorted(wanted)}


def _pipeline(upstream: bool = False) -> dict[str, Any]:
    """The completions pipeline's refusals a generation passes on as they were."""
    kind = ("X-Acs-Upstream-Error-Kind",) if upstream else ()
    return {
        "400": error_doc(400, "x-should-retry"),
        "429": error_doc(429, *RETRY),
        "502": error_doc(502, *kind, *RETRY),
    }


def _text_limit(settings: Settings) -> str:
    return f"A Node's text holds at most {settings.loom_max_text_chars} characters (400 above)."


def _node_limit(settings: Settings) -> str:
    return (
        f"A Loom holds at most {settings.loom_max_nodes} Nodes and {settings.loom_max_bytes} "
        "bytes of text and records (409 loom_node_limit); a key's Looms together at most "
        f"{settings.loom_bytes_per_key} bytes (429 loom_capacity)."
    )


def _create(settings: Settings) -> dict[str, Any]:
    return {
        "operationId": "createLoom",
        "summary": "A new Loom whose root Node is the prompt (no generation happens)",
        "description": f"{_text_limit(settings)} A key has at most {settings.looms_per_key} "
        "Looms (429 loom_capacity).",
        "parameters": [IDEMPOTENCY_KEY],
        "requestBody": _body("LoomCreateBody"),
        "responses": {
            "201": json_doc("The Loom with its root", "Loom", "Location", "Idempotent-Replayed"),
            **_errors(body=True, idempotent=True),
            "429": error_doc(429, "x-should-retry"),  # loom_capacity
        },
    }


def _list() -> dict[str, Any]:
    return {
        "operationId": "listLooms",
        "summary": "This key's Looms, newest first, without their Nodes",
        "parameters": [
            {
                "name": "limit",
                "in": "query",
                "required": False,
                "description": f"Looms per page (default 20; above {LIST_LIMIT_MAX} is read "
                f"as {LIST_LIMIT_MAX})",
                "schema": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX},
            },
            {
                "name": "after",
                "in": "query",
                "required": False,
                "description": "The `last_id` of the page before; a 400 if it names no Loom of "
                "this key",
                "schema": {"type": "string"},
            },
        ],
        "responses": {
            "200": json_doc("A page of Looms", "LoomList"),
            **_errors(400),
        },
    }


def _import(settings: Settings) -> dict[str, Any]:
    limit = settings.loom_import_max_bytes
    return {
        "operationId": "importLoom",
        "summary": "A new Loom made of an export document or a socketteer/loom save file",
        "description": f"Bodies up to {limit} bytes on this route (413 above); at most "
        f"{settings.loom_max_nodes} Nodes of at most {settings.loom_max_text_chars} characters "
        f"each, {settings.loom_import_max_tokens} tokens in all the Nodes together (a "
        "completion that several Nodes share counts for each), nesting at most "
        f"{import_depth_limit(settings.loom_max_nodes)} levels deep (400 bad_json) and a title "
        f"of at most {TITLE_MAX_CHARS} characters (400). A file that cannot become a Loom "
        "(malformed, cyclic, over a limit) is 400 loom_file_invalid, before anything is written. "
        f"{_node_limit(settings)} A key has at most {settings.looms_per_key} Looms (429 "
        "loom_capacity).",
        "parameters": [IDEMPOTENCY_KEY],
        "requestBody": _body("LoomImportFile"),
        "responses": {
            "201": json_doc("The new Loom", "Loom", "Location", "Idempotent-Replayed"),
            **_errors(body=True, idempotent=True),
            "413": {
                **error_doc(413, "x-should-retry"),
                "description": f"request_too_large: the body is over {limit} bytes",
            },
            "429": error_doc(429, "x-should-retry"),  # loom_capacity
        },
    }


def _loom_paths(settings: Settings) -> dict[str, Any]:
    return {
        LOOMS_PATH: {"post": _create(settings), "get": _list()},
        IMPORT_PATH: {"post": _import(settings)},
        LOOM_PATH: {
            "get": {
                "operationId": "getLoom",
                "summary": "The Loom with every Node",
                "description": "Read and encoded a batch of Nodes at a time (a Loom is bounded "
                "by its byte quota, loom_max_bytes).",
                "parameters": [_LOOM_ID],
                "responses": {"200": json_doc("The Loom", "Loom"), **_errors(404)},
            },
            "patch": {
                "operationId": "retitleLoom",
                "parameters": [_LOOM_ID],
                "requestBody": _body("LoomPatchBody"),
                "responses": {
                    "200": json_doc("The Loom, retitled", "Loom"),
                    **_errors(404, body=True),
                },
            },
            "delete": {
                "operationId": "deleteLoom",
                "summary": "The Loom and all its Nodes",
                "parameters": [_LOOM_ID],
                "responses": {
                    "200": json_doc("The Loom is gone", "LoomDeleted"),
                    **_errors(404),
                },
            },
        },
        LOOM_PATH + "/export": {
            "get": {
                "operationId": "exportLoom",
                "summary": "The Loom as a versioned JSON document POST /v1/looms/import reads",
                "parameters": [_LOOM_ID],
                "responses": {
                    "200": json_doc("The export document", "LoomExport"),
                    **_errors(404),
                },
            }
        },
    }


def _node_operation(
    operation_id: str,
    summary: str,
    body: str,
    ok: dict[str, Any],
    *conflicts: int,
    description: str | None = None,
) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "summary": summary,
        **({"description": description} if description else {}),
        "parameters": [_LOOM_ID, _NODE_ID],
        "requestBody": _body(body),
        "responses": {**ok, **_errors(404, *conflicts, body=True)},
    }


def _branch(settings: Settings) -> dict[str, Any]:
    ok = json_doc(
        "The children the branch made, ready (or failed with the error)",
        "LoomBranch",
        "Idempotent-Replayed",
    )
    stream = {
        "description": "stream: true: server-sent events as the children grow",
        "headers": ok["headers"],
        "content": {"text/event-stream": {"schema": {"$ref": REF.format(model="LoomBranchEvent")}}},
    }
    responses = {
        "200": stream,
        "201": ok,
        **_errors(404, 409, body=True, idempotent=True),
        **_pipeline(upstream=True),
    }
    responses["500"] = {
        **error_doc(500, "x-should-retry"),
        "description": "internal_error, or the engine's error while the children generated "
        "(they are failed with it)",
    }
    return {
        "operationId": "branchLoomNode",
        "summary": "n continuations of the path's text, as children of the Node",
        "description": "Validated like a /v1/completions of the path's text (its budgets refuse, "
        "never clamp) and run as a job of this node: a closed connection does not stop it. "
        "Sent again with its Idempotency-Key, the branch's answer once it has ended. "
        + _node_limit(settings),
        "parameters": [
            _LOOM_ID,
            _NODE_ID,
            IDEMPOTENCY_KEY,
            {
                "name": "X-Acs-Workload",
                "in": "header",
                "required": False,
                "description": "interactive | batch: recorded in the usage log, changes nothing",
                "schema": {"type": "string"},
            },
        ],
        "requestBody": _body("LoomBranchBody", "The sampling fields of /v1/completions"),
        "responses": dict(sorted(responses.items())),
    }


def _replay() -> dict[str, Any]:
    return {
        "operationId": "replayLoomNode",
        "summary": "Regenerate a model's Node from what it recorded; says whether it is identical",
        "parameters": [_LOOM_ID, _NODE_ID],
        "responses": dict(
            sorted(
                {
                    "200": json_doc("The regenerated text", "LoomReplay"),
                    **_errors(404, 409),
                    **_pipeline(),
                }.items()
            )
        ),
    }


def _score() -> dict[str, Any]:
    operation = _node_operation(
        "scoreLoomNode",
        "The teacher-forced logprob of every token of the path, stored on its Nodes",
        "NodeScoreBody",
        {"200": json_doc("The path's scores", "LoomScore")},
    )
    operation["responses"] = dict(sorted({**operation["responses"], **_pipeline()}.items()))
    return operation


def _node_paths(settings: Settings) -> dict[str, Any]:
    made = {"201": json_doc("The new Node", "LoomNodeList")}
    grows = f"{_text_limit(settings)} {_node_limit(settings)}"
    return {
        NODE_PATH: {
            "get": {
                "operationId": "getLoomNode",
                "parameters": [_LOOM_ID, _NODE_ID],
                "responses": {"200": json_doc("The Node", "LoomNode"), **_errors(404)},
            },
            "patch": _node_operation(
                "editLoomNode",
                "New text (its tokens, logprobs and score go) or a bookmark",
                "NodePatchBody",
                {"200": json_doc("The Node, changed", "LoomNodeList")},
                409,
                429,
                description=f"{_text_limit(settings)} A Node generating cannot be edited (409). "
                + _node_limit(settings),
            ),
            "delete": {
                "operationId": "deleteLoomNode",
                "summary": "The Node and every Node under it (not the root)",
                "parameters": [_LOOM_ID, _NODE_ID],
                "responses": {
                    "200": json_doc("The deleted Nodes", "LoomNodeDeleted"),
                    **_errors(404, 409),
                },
            },
        },
        NODE_PATH + "/text": {
            "get": {
                "operationId": "getLoomNodePathText",
                "summary": "The text the model continues from this Node: the path's, root first",
                "parameters": [_LOOM_ID, _NODE_ID],
                "responses": {
                    "200": {
                        "description": "The path's text",
                        "headers": headers_doc(),
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_errors(404),
                },
            }
        },
        NODE_PATH + "/branch": {"post": _branch(settings)},
        NODE_PATH + "/split": {
            "post": _node_operation(
                "splitLoomNode",
                "The Node keeps the text before `offset`, a new child the rest (at a token "
                "boundary); the Node's children move under the new child",
                "NodeSplitBody",
                {"201": json_doc("The Node and its new child", "LoomNodeList")},
                409,
                429,
                description=grows,
            )
        },
        NODE_PATH + "/children": {
            "post": _node_operation(
                "addLoomNodeChild",
                "A hand-written child",
                "NodeTextBody",
                made,
                409,
                429,
                description=grows,
            )
        },
        NODE_PATH + "/siblings": {
            "post": _node_operation(
                "addLoomNodeSibling",
                "A hand-written alternative right after the Node (not the root)",
                "NodeTextBody",
                made,
                409,
                429,
                description=grows,
            )
        },
        NODE_PATH + "/replay": {"post": _replay()},
        NODE_PATH + "/score": {"post": _score()},
    }


def loom_paths(settings: Settings) -> dict[str, Any]:
    return {**_loom_paths(settings), **_node_paths(settings)}
