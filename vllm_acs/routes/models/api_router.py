"""GET /v1/models and GET /v1/models/{model_id}: every live model of the deployment (this
node's, and the other nodes' of the model registry, which forward them), replacing vLLM's route;
GET /v1/models/{model_id}/status: whether a live node serves the model, and how many do.

API server process.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ...deployment.registry import NodeRegistry
from ...errors import ModelNotFound, echoed
from ...served_model import NodeModels, ServedModel
from ..error_response import error_response
from .protocol import ModelCard, ModelList, ModelStatus
from .service import model_card, model_list


def build_router(
    models: NodeModels, registry: Callable[[], NodeRegistry | None] = lambda: None
) -> APIRouter:
    router = APIRouter(tags=["models"])

    async def live() -> list[ServedModel]:
        deployment = registry()
        return models.all() if deployment is None else await deployment.models()

    async def serving(model_id: str) -> int | None:
        deployment = registry()
        if deployment is None:  # no registry (yet): only this node's own model is known
            return 1 if models.get(model_id) is not None else None
        return await deployment.serving(model_id)

    def not_found(request: Request, model_id: str) -> JSONResponse:
        return error_response(
            request,
            ModelNotFound(f"The model '{echoed(model_id)}' does not exist.", param="model_id"),
        )

    @router.get("/v1/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return model_list(await live())

    @router.get("/v1/models/{model_id}", response_model=ModelCard)
    async def get_model(request: Request, model_id: str) -> ModelCard | JSONResponse:
        model = next((m for m in await live() if m.id == model_id), None)
        if model is None:
            return not_found(request, model_id)
        return model_card(model)

    @router.get("/v1/models/{model_id}/status", response_model=ModelStatus)
    async def get_model_status(request: Request, model_id: str) -> ModelStatus | JSONResponse:
        nodes = await serving(model_id)
        if nodes is None:
            return not_found(request, model_id)
        return ModelStatus(id=model_id, warm=nodes > 0, nodes=nodes)

    return router
