"""The HTTP side of `kermt serve`: a FastAPI app behind Ray Serve's ingress, one model deployment per model.

Routes: ``POST /predict`` (the default model), ``POST /models/{name}/predict``, ``GET /models``, ``GET /healthz``,
and FastAPI's ``/docs`` (OpenAPI). Bodies are validated by pydantic (:mod:`ray_app.serve.schemas`): malformed
JSON, a non-list ``smiles`` or a non-string item is a 422 whose ``detail`` names the field; more than
``max_request_molecules`` SMILES is a 413; an unknown model a 404. Only the ingress parses HTTP; the model
replicas get plain strings. This module imports no torch, so the ingress replica starts light.
"""

# no `from __future__ import annotations`: FastAPI reads the routes' body types from the live annotations
from fastapi import FastAPI, HTTPException
from ray import serve
from ray.serve.handle import DeploymentHandle

from ray_app.serve.schemas import ModelInfo, ModelsResponse, PredictJob, PredictRequest, PredictResponse

api = FastAPI(title="kermt serve", description="Predictions of trained KERMT models")


@serve.deployment
@serve.ingress(api)
class Gateway:
    """Routes requests to the model deployments; holds nothing heavier than their descriptions."""

    def __init__(self, models: dict[str, DeploymentHandle], infos: list[ModelInfo], max_request_molecules: int):
        self.models, self.infos = models, {info.name: info for info in infos}
        self.default = next(info.name for info in infos if info.default)
        self.max_request_molecules = max_request_molecules

    @api.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok", "models": list(self.models)}

    @api.get("/models", response_model=ModelsResponse)
    async def list_models(self) -> ModelsResponse:
        return ModelsResponse(models=list(self.infos.values()))

    @api.post("/predict", response_model=PredictResponse)
    async def predict_default(self, request: PredictRequest) -> PredictResponse:
        return await self._predict(self.default, request)

    @api.post("/models/{name}/predict", response_model=PredictResponse)
    async def predict_model(self, name: str, request: PredictRequest) -> PredictResponse:
        return await self._predict(name, request)

    async def _predict(self, name: str, request: PredictRequest) -> PredictResponse:
        if name not in self.models:
            raise HTTPException(404, f"no model {name!r}; this app serves {sorted(self.models)} (GET /models)")
        if len(request.smiles) > self.max_request_molecules:
            raise HTTPException(413, f"smiles: {len(request.smiles)} molecules in one request, at most "
                                f"{self.max_request_molecules} (--max_request_molecules); split the request")
        if not request.smiles:
            return PredictResponse(model=name, predictions=[])
        entries = await self.models[name].predict.remote(PredictJob(tuple(request.smiles), request.uncertainty))
        return PredictResponse(model=name, predictions=entries)


__all__ = ["Gateway"]
