"""The HTTP side of `kermt serve`: a FastAPI app behind Ray Serve's ingress, one model deployment per model.

Routes: ``POST /predict`` (the default model), ``POST /models/{name}/predict``, ``GET /models``, ``GET /healthz``,
and FastAPI's ``/docs`` (OpenAPI). Bodies are validated by pydantic (:mod:`ray_app.serve.schemas`): malformed
JSON, a non-list ``smiles`` or a non-string item is a 422 whose ``detail`` names the field; more than
``max_request_molecules`` SMILES is a 413; an unknown model a 404. Only the ingress parses HTTP; the model
replicas get plain strings. This module imports no torch, so the ingress replica starts light.

``GET /`` is the page for chemists (:mod:`ray_app.serve.page`); with ``--api_key_env`` every route but the page,
``/healthz`` and the OpenAPI description needs ``Authorization: Bearer <key>`` (401 otherwise).
"""

# no `from __future__ import annotations`: FastAPI reads the routes' body types from the live annotations
import asyncio
from collections.abc import Sequence
from functools import partial
from typing import Optional, Union

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import Response
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

from kermt.errors import UserError
from kermt.run_layout import CALIBRATION_FILE, CLASS_CALIBRATION_FILE
from kermt.uncertainty import Calibration, ClassCalibration
from ray_app.serve.auth import check_bearer
from ray_app.serve.coalesce import Coalescer
from ray_app.serve.depict import depictions
from ray_app.serve.page import asset_response, page_response
from ray_app.serve.schemas import ModelInfo, ModelsResponse, PredictJob, PredictRequest, PredictResponse

api = FastAPI(title="kermt serve", description="Predictions of trained KERMT models")


@serve.deployment
@serve.ingress(api)
class Gateway:
    """Routes requests to the model deployments, one call for the requests that waited while a model's calls were
    busy (:mod:`ray_app.serve.coalesce`); holds nothing heavier than the models' descriptions."""

    def __init__(self, models: dict[str, DeploymentHandle], infos: list[ModelInfo], max_request_molecules: int,
                 calibrations: Optional[dict[str, dict[str, Union[Calibration, ClassCalibration]]]] = None,
                 api_key_sha256: Optional[str] = None, featurizer: Optional[DeploymentHandle] = None, *,
                 max_embed_molecules: int, max_attribution_molecules: int, calls_per_model: int,
                 max_requests_per_call: int):
        self.models, self.infos = models, {info.name: info for info in infos}
        # one handle call carries every request that waited while the model's calls were busy
        self.coalescers = {name: Coalescer(partial(self._call_model, name), max_calls=calls_per_model,
                                           max_items=max_requests_per_call) for name in models}
        self.featurizer = featurizer  # None: each model replica featurises its own requests
        self.default = next(info.name for info in infos if info.default)
        self.max_request_molecules = max_request_molecules
        # the extras that cost a request more than its predictions, each with its own cap (its ServeConfig flag)
        self.caps = {"embed": (max_embed_molecules, "--max_embed_molecules"),
                     "attributions": (max_attribution_molecules, "--max_attribution_molecules")}
        self.calibrations = calibrations or {}
        self.api_key_sha256 = api_key_sha256  # the key itself never leaves the driver

    @api.get("/", include_in_schema=False)
    async def page(self, request: Request) -> Response:
        return page_response(request.scope.get("root_path", ""))

    @api.get("/static/{asset}", include_in_schema=False)
    async def static(self, asset: str) -> Response:
        return asset_response(asset)

    @api.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok", "models": list(self.models), "auth": self.api_key_sha256 is not None}

    @api.get("/models", response_model=ModelsResponse)
    async def list_models(self, authorization: Optional[str] = Header(None)) -> ModelsResponse:
        check_bearer(authorization, self.api_key_sha256)
        return ModelsResponse(models=list(self.infos.values()))

    @api.post("/predict", response_model=PredictResponse)
    async def predict_default(self, request: PredictRequest,
                              authorization: Optional[str] = Header(None)) -> PredictResponse:
        check_bearer(authorization, self.api_key_sha256)
        return await self._predict(self.default, request)

    @api.post("/models/{name}/predict", response_model=PredictResponse)
    async def predict_model(self, name: str, request: PredictRequest,
                            authorization: Optional[str] = Header(None)) -> PredictResponse:
        check_bearer(authorization, self.api_key_sha256)
        return await self._predict(name, request)

    async def _predict(self, name: str, request: PredictRequest) -> PredictResponse:
        if name not in self.models:
            raise HTTPException(404, f"no model {name!r}; this app serves {sorted(self.models)} (GET /models)")
        if len(request.smiles) > self.max_request_molecules:
            raise HTTPException(413, f"smiles: {len(request.smiles)} molecules in one request, at most "
                                f"{self.max_request_molecules} (--max_request_molecules); split the request")
        self._check_interval(name, request.interval)
        self._check_domain(name, request.domain)
        self._check_caps(request)
        if not request.smiles:
            return PredictResponse(model=name, predictions=[])
        job = PredictJob(tuple(request.smiles), request.uncertainty, request.interval, request.domain,
                         request.embed, request.attributions)
        try:
            entries = await self.coalescers[name].submit(job)
        except (RayActorError, ActorUnavailableError):  # the replica died with the request (Serve starts another)
            raise HTTPException(503, f"model {name!r}: the replica predicting this request stopped (Serve is "
                                "replacing it); send the request again", headers={"Retry-After": "1"}) from None
        if request.depict:
            entries = await asyncio.to_thread(self._with_depictions, entries,
                                              self.infos[name].tasks if request.attributions else ())
        return PredictResponse(model=name, predictions=entries)

    async def _call_model(self, name: str, jobs: Sequence[PredictJob]) -> list[list[dict]]:
        """One call to model ``name``: each job's entries."""
        # the featurizer's response is passed on unfetched: its molecules go from that replica to the model's
        molecules = (self.featurizer.featurize.remote([job.smiles for job in jobs],
                                                      tuple(self.infos[name].features_generator),
                                                      self.infos[name].standardize)
                     if self.featurizer is not None else None)
        return await self.models[name].predict.remote(list(jobs), molecules)

    def _check_caps(self, request: PredictRequest) -> None:
        """A 413 for a request asking an extra (``embed``, ``attributions``) for more molecules than its cap."""
        for field, (cap, flag) in self.caps.items():
            if getattr(request, field) and len(request.smiles) > cap:
                raise HTTPException(413, f"{field}: {len(request.smiles)} molecules in one request with \"{field}\": "
                                    f"true, at most {cap} ({flag}); split the request")

    def _check_interval(self, name: str, level: Optional[float]) -> None:
        """A 400 naming the field before the request reaches a model batch (an error there would fail the batch)."""
        if level is None:
            return
        if name not in self.calibrations:
            raise HTTPException(400, f"interval: model {name!r} has no calibration (serve the --save_dir of a "
                                f"`kermt finetune` run, whose folds hold {CALIBRATION_FILE} or "
                                f"{CLASS_CALIBRATION_FILE}); drop interval")
        try:
            for calibration in self.calibrations[name].values():
                calibration.quantile(level)
        except UserError as error:
            raise HTTPException(400, f"interval: {error}") from None

    def _check_domain(self, name: str, wanted: bool) -> None:
        info = self.infos[name]
        if wanted and not info.domain:
            raise HTTPException(400, f"domain: model {name!r} has no applicability domain ({info.domain_missing}); "
                                "drop domain")

    @staticmethod
    def _with_depictions(entries: list[dict], attributed_tasks: Sequence[str]) -> list[dict]:
        """Each entry with ``svg``: its molecule drawn (sanitised), null when RDKit cannot read it; with
        ``attributed_tasks`` also ``attribution_svg``: per task, its atoms coloured by their shares. A method, not
        a module function: Serve ships the ingress class by value, and a module-level helper did not travel."""
        return [{**entry, **depictions(entry, attributed_tasks)} for entry in entries]


__all__ = ["Gateway"]
