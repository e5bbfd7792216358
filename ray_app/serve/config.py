"""Settings of `kermt serve`: which models, where to listen, how replicas batch and scale.

``--checkpoint_dir`` is the default model (``POST /predict``), named ``--name``; ``--model NAME=DIR_OR_URI ...``
adds more (``POST /models/NAME/predict``). Each is a finetune run's directory (every member: an ensemble), one
``.pt`` file or a native checkpoint directory, local or a URI (s3://, hf://, ...).
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kermt.presets import PREDICT_BATCH_SIZE
from ray_app.common.data_parallel import parse_worker_range
from ray_app.common.molecule_flags import max_heavy_atoms_field

Ingress = Literal["ray", "haproxy"]  # ray_app.serve.ingress says what each is
DEFAULT_HOST = "127.0.0.1"  # loopback unless --host says otherwise (then --api_key_env, else a warning)


def parse_replica_range(value: Any) -> tuple[int, int]:
    """``2`` -> (2, 2); ``"1-4"`` -> (1, 4): model replicas, a range autoscales between its bounds."""
    return parse_worker_range(value, "num_replicas", "replica")


def parse_model_entry(entry: str) -> tuple[str, str]:
    """``NAME=DIR_OR_URI`` -> (NAME, DIR_OR_URI)."""
    name, equals, source = entry.partition("=")
    if not equals or not name.strip() or not source.strip():
        raise ValueError(f"model {entry!r}: give NAME=DIR_OR_URI (e.g. solubility=runs/sol)")
    if "/" in name:
        raise ValueError(f"model {entry!r}: the name {name!r} appears in URLs (/models/NAME/predict); no '/'")
    return name.strip(), source.strip()


class ServeConfig(BaseModel):
    """`kermt serve`. Field names are the flag names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checkpoint_dir: Optional[str] = Field(None, description="the default model: a finetune run's directory "
                                          "(ensemble), a .pt file or a native checkpoint directory (path or URI)")
    name: str = Field("default", description="name of the --checkpoint_dir model (/models/NAME/predict)")
    model: Optional[list[str]] = Field(None, description="more models: NAME=DIR_OR_URI ... (one flag, several "
                                       "entries); without --checkpoint_dir the first is the default")
    host: str = Field(DEFAULT_HOST, description="address to listen on (0.0.0.0: every interface)")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port")
    ingress: Ingress = Field("ray", description="what answers HTTP: ray, Serve's Python proxy; "
                                               "haproxy, Ray Serve's high-throughput mode (HAProxy, and ingress "
                                               "replicas that answer HTTP themselves), for the local cluster this "
                                               "command starts (a running cluster: set it on its nodes, "
                                               "docs/serving.md)")
    num_replicas: Union[str, int] = Field(1, description="replicas per model: N, or MIN-MAX to autoscale")
    # autoscaling (--num_replicas MIN-MAX), Ray Serve's own knobs under its names and defaults
    target_ongoing_requests: float = Field(2.0, gt=0, description="autoscaling: calls in flight per replica it "
                                           "aims at (more: add replicas); a call carries the requests the "
                                           "ingress gathered while the model was busy")
    upscale_delay_s: float = Field(30.0, ge=0, description="autoscaling: how long load must stay high to add one")
    downscale_delay_s: float = Field(600.0, ge=0, description="autoscaling: how long load must stay low to remove one")
    look_back_period_s: float = Field(30.0, gt=0, description="autoscaling: the window load is averaged over")
    num_featurizers: int = Field(0, ge=0, description="Featurizer replicas (RDKit, on CPUs), shared by every "
                                 "model; 0: each model replica featurises its own requests")
    featurizer_cpus: float = Field(1.0, gt=0, description="CPUs each Featurizer replica reserves")
    use_gpu: bool = Field(False, description="each model replica on a GPU (its members on cuda)")
    num_gpus_per_replica: float = Field(1.0, gt=0, description="GPUs per model replica with --use_gpu "
                                        "(fractions ok: several replicas share one GPU)")
    max_batch_size: int = Field(16, ge=1, description="requests one model replica call takes together")
    batch_wait_timeout_s: float = Field(0.01, ge=0, description="how long a replica waits to fill a batch")
    batch_size: int = Field(PREDICT_BATCH_SIZE, ge=1, description="the batch rule of kermt predict --batch_size: each "
                            "request's numbers are kermt predict's for a file of its SMILES with this --batch_size")
    max_batch_atoms: int = Field(4096, ge=1, description="atoms per model forward: the molecules of a replica batch "
                                 "of requests share forwards up to this many atoms (the memory a forward needs)")
    max_heavy_atoms: int = max_heavy_atoms_field()
    max_request_molecules: int = Field(1000, ge=1, description="SMILES one request may hold (more: HTTP 413)")
    max_embed_molecules: int = Field(100, ge=1, description="SMILES one request with \"embed\": true may hold "
                                     "(each embedding is 2 x the hidden size floats: 1,600 for hidden size 800, ~35 kB "
                                     "of JSON; more: HTTP 413)")
    max_attribution_molecules: int = Field(20, ge=1, description="SMILES one request with \"attributions\": true may "
                                           "hold (they cost about 40 predictions each: 0.2 molecules/s for the "
                                           "800-wide preset on one CPU thread; more: HTTP 413)")
    api_key_env: Optional[str] = Field(None, description="require 'Authorization: Bearer KEY' on the API, KEY read "
                                       "from this environment variable (/healthz and the page stay open)")
    trust_checkpoint: bool = Field(False, description="allow full unpickling of checkpoints (runs their code)")
    address: Optional[str] = Field(None, description="Ray cluster (default: RAY_ADDRESS, else a local cluster)")
    app_name: str = Field("kermt", description="the Serve application's name on the cluster (one app per name)")

    @field_validator("num_replicas", mode="before")
    @classmethod
    def _replicas(cls, value: Any) -> int | str:
        low, high = parse_replica_range(value)
        return low if low == high else f"{low}-{high}"

    @model_validator(mode="after")
    def _models(self) -> "ServeConfig":
        if self.checkpoint_dir is None and not self.model:
            raise ValueError("give --checkpoint_dir DIR (the default model) or --model NAME=DIR ...")
        names = [name for name, _ in self.model_sources()]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"model names {repeated} are given twice (--name and --model must differ)")
        return self

    def model_sources(self) -> list[tuple[str, str]]:
        """(name, path or URI) of every model, the default first."""
        own = [(self.name, self.checkpoint_dir)] if self.checkpoint_dir is not None else []
        return own + [parse_model_entry(entry) for entry in self.model or ()]

    @property
    def replica_range(self) -> tuple[int, int]:
        return parse_replica_range(self.num_replicas)


__all__ = ["DEFAULT_HOST", "ServeConfig", "parse_model_entry", "parse_replica_range"]
