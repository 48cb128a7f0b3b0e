"""GET /v1/models and GET /v1/models/{model_id}: what this node serves (replaces vLLM's route).

API server process.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ...errors import ModelNotFound
from ...served_model import NodeModels
from ..error_response import error_response
from .protocol import ModelCard, ModelList
from .service import model_card, model_list


def build_router(models: NodeModels) -> APIRouter:
    router = APIRouter(tags=["models"])

    @router.get("/v1/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return model_list(models.all())

    @router.get("/v1/models/{model_id}", response_model=ModelCard)
    async def get_model(request: Request, model_id: str) -> ModelCard | JSONResponse:
        model = models.get(model_id)
        if model is None:
            return error_response(
                request, ModelNotFound(f"The model '{model_id}' does not exist.", param="model_id")
            )
        return model_card(model)

    return router
