"""Settings every data-parallel training command shares (`kermt finetune`, `kermt tune`, `kermt pretrain`).

The learning-rate schedule and the Ray placement are one pydantic base so that both commands spell, validate and
document them the same way. The global batch (molecules per optimizer step) is fixed for a run whatever number of
workers shares it: that is what lets an elastic run (``--num_workers MIN-MAX``) resize and still compute what an
uninterrupted run does.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kermt.presets import UPSTREAM_FINETUNE

_TRAINING = UPSTREAM_FINETUNE.training  # upstream's finetune and pretrain parsers agree on these


def parse_worker_range(value: Any, setting: str = "num_workers", unit: str = "worker") -> tuple[int, int]:
    """``2`` or ``"2"`` -> (2, 2); ``"1-4"`` -> (1, 4). A ValueError names what is wrong (``setting``, ``unit``:
    the flag and what it counts, e.g. ``num_replicas``/``replica`` for `kermt serve`)."""
    text = str(value).strip()
    low, dash, high = text.partition("-")
    try:
        bounds = (int(low), int(high) if dash else int(low))
    except ValueError:
        raise ValueError(f"{setting} {text!r}: give a number of {unit}s (2) or a range MIN-MAX (1-4)") from None
    if bounds[0] < 1:
        raise ValueError(f"{setting} {text!r}: at least 1 {unit}")
    if bounds[0] > bounds[1]:
        raise ValueError(f"{setting} {text!r}: MIN {bounds[0]} is larger than MAX {bounds[1]}; give MIN-MAX with "
                         "MIN <= MAX")
    return bounds


class DataParallelSettings(BaseModel):
    """Schedule and Ray settings of a data-parallel training run. Field names are the flag names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # schedule (upstream's Noam-style warmup then exponential decay, per optimizer step)
    epochs: int = Field(30, ge=1, description="training epochs")
    batch_size: int = Field(_TRAINING.batch_size, ge=1, description="molecules per worker per step at MAX workers")
    global_batch_size: Optional[int] = Field(
        None, ge=1, description="molecules per optimizer step over all workers, split over whoever runs (default: "
        "batch_size x num_workers, x MAX for a MIN-MAX range); results do not depend on the number of workers")
    warmup_epochs: float = Field(2.0, ge=0, description="epochs of linear warmup from init_lr to max_lr")
    init_lr: float = Field(1e-4, gt=0, description="learning rate at the start of warmup")
    max_lr: float = Field(1e-3, gt=0, description="learning rate at the end of warmup")
    final_lr: float = Field(1e-4, gt=0, description="learning rate at the last step (exponential decay from max_lr)")
    weight_decay: float = Field(_TRAINING.weight_decay, ge=0, description="Adam weight decay")
    # Ray
    num_workers: Union[str, int] = Field(
        1, description="data-parallel training workers: N, or MIN-MAX for elastic training (Ray Train starts with "
        "what fits, at least MIN, and resizes as nodes come and go)")
    use_gpu: bool = Field(False, description="one GPU per worker")
    address: Optional[str] = Field(None, description="Ray cluster (default: RAY_ADDRESS, else a local cluster)")
    max_failures: Optional[int] = Field(
        None, ge=-1, description="lost workers/nodes a run recovers from, resuming at its last checkpoint "
        "(-1: unlimited; default: 3 on a multi-node cluster, 0 on one machine)")
    storage_path: Optional[str] = Field(
        None, description="Ray Train checkpoints and Tune state: s3://..., gs://..., any pyarrow URI, or "
        "file:///shared/path (default: save_dir on a single-node cluster; required on a multi-node one)")

    @field_validator("num_workers", mode="before")
    @classmethod
    def _worker_count(cls, value: Any) -> int | str:
        low, high = parse_worker_range(value)
        return low if low == high else f"{low}-{high}"  # a plain count stays a number in config.yaml / run.json

    @model_validator(mode="after")
    def _check_schedule(self) -> "DataParallelSettings":
        if not self.init_lr <= self.max_lr:
            raise ValueError(f"init_lr {self.init_lr} must not exceed max_lr {self.max_lr}")
        return self

    @property
    def worker_range(self) -> tuple[int, int]:
        """(MIN, MAX) training workers; equal for a fixed count."""
        return parse_worker_range(self.num_workers)

    @property
    def min_workers(self) -> int:
        return self.worker_range[0]

    @property
    def max_workers(self) -> int:
        return self.worker_range[1]

    @property
    def elastic(self) -> bool:
        return self.min_workers != self.max_workers

    @property
    def step_batch_size(self) -> int:
        """The global batch: molecules per optimizer step, whatever number of workers shares it."""
        return self.global_batch_size or self.batch_size * self.max_workers
