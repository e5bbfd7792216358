"""The Ray Tune function trainable that trains one model: a (fold, member) of `kermt finetune`, or a `kermt tune` trial.

A trial builds the member's TorchTrainer (``members.run_member``), writes the member's files (``members.save_member``)
and reports them as its final Tune checkpoint. It may run on any node: the experiment storage is the one place that
every node and the driver reach, and the driver copies the files from there into ``--save_dir``.

Data: each fold's shards in the run's storage (``ray_app.finetune.fold_data``); every trial receives the list of
each fold's :class:`FoldData` (``tune.with_parameters``: where the shards are, the manifests and the scalers) and
hands its fold's on to its training workers, which read the shards themselves. A `kermt tune` trial also gets the
reference to fold 0's object, put once by its driver, to score its model on the test split.

What differs between finetune members and tune trials (which settings, which fold, what else is reported) is a
:class:`MemberTrial`; ``ray_app.tune`` subclasses it.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import ray
import torch
from ray import tune

from kermt.config import FinetuneModelConfig
from kermt.nn.finetune import KermtFinetuneModel
from ray_app.common import outputs
from ray_app.common.ray_internals import CHECKPOINT_PERSIST_LOGGER, HEAD_NODE_RESOURCE
from ray_app.finetune.fold_data import FoldData
from ray_app.finetune.members import run_member, save_member
from ray_app.finetune.prepare import ScaledSplits
from ray_app.finetune.run_setup import RunSetup

RESULT_FILE = "result.json"  # the trial's final result; also marks its checkpoint as complete
# A trial only coordinates its TorchTrainer, so it asks for no CPU (a fraction of one would keep a 1-CPU training
# worker off that node). It runs on the head, beside the driver: a lost or preempted worker node takes training
# workers with it, which Ray Train recovers, never a trial.
TRIAL_PLACEMENT = {"CPU": 0, HEAD_NODE_RESOURCE: 0.001}
# A coordinator process with torch, Ray and kermt imported, without a model: bench/head_memory.py measured 560 MB
# RSS (350 MB PSS) with the release-size model (188 MB) loaded, so about 370 MB without it.
COORDINATOR_BASE_BYTES = 400 * 2**20


def trial_actor_resources(*model_configs: FinetuneModelConfig) -> dict[str, float]:
    """What one coordinator asks of the head: no CPU, and the memory it holds. It never holds the source weights
    (they stay in the object store, ``RunSetup.with_shared_checkpoint``) nor builds the starting model (its
    workers do); at the end it loads the best model once, from mapped pages of the training state (members.py).
    So: its process, plus twice the largest model's weights (the model, and the pages it was loaded from)."""
    return {**TRIAL_PLACEMENT, "memory": COORDINATOR_BASE_BYTES + 2 * max(map(weight_bytes, model_configs))}


def weight_bytes(config: FinetuneModelConfig) -> int:
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = KermtFinetuneModel(config)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


@dataclass(frozen=True)
class Member:
    """One model to train: the settings it trains with, its fold and member index, its name in log lines."""

    setup: RunSetup
    fold: int
    member: int
    label: str


class MemberTrial:
    """`kermt finetune`'s trials: ``params`` is ``{"job": {"fold": F, "member": M}}``, a point of the (fold, member)
    grid. ``kept``: members an interrupted run of the same settings already saved; a restored Tune run that still
    lists one of them as unfinished reports it without training it again."""

    def __init__(self, kept: frozenset[tuple[int, int]] = frozenset()):
        self.kept = kept

    def member(self, setup: RunSetup, params: dict[str, Any], trial_id: str) -> Member:
        fold, member = params["job"]["fold"], params["job"]["member"]
        return Member(setup, fold, member, f"fold {fold} model {member}")

    def skip(self, member: Member) -> bool:
        return (member.fold, member.member) in self.kept

    def callbacks(self, member: Member) -> list:
        """Ray Train callbacks of the member's TorchTrainer."""
        return []

    def finish(self, member: Member, model, splits: ScaledSplits | None, history: list, directory: Path) \
            -> dict[str, Any]:
        """Extra files into ``directory`` (the member's files are already there); returns the trial's final result.
        ``splits``: the fold's object, when the driver passed the trials their folds' references (None: not)."""
        return {"fold": member.fold, "member": member.member, "epochs_run": len(history)}


def train_member(params: dict[str, Any], setup: RunSetup, fold_data: Sequence[FoldData], trial: MemberTrial,
                 fold_splits: Sequence[ray.ObjectRef] = ()) -> None:
    """Tune function trainable: train the member ``trial`` makes of ``params``; report its files as a checkpoint.

    ``fold_data``: each fold's shards, which the member's workers read; ``fold_splits``: one object reference per
    fold, for a trial whose :meth:`MemberTrial.finish` reads the fold's object (`kermt tune`'s; a finetune passes
    none, so its driver lets go of the folds' objects once their shards are written). A trial that Tune restarts
    after an interruption gets the same Train run name, so Ray Train resumes it from its last epoch checkpoint."""
    # the member's epochs already print; Ray's line for the checkpoint reported below is noise to users
    logging.getLogger(CHECKPOINT_PERSIST_LOGGER).setLevel(logging.WARNING)
    previous = tune.get_checkpoint()
    if previous is not None:  # a restored trial that had already finished: report its result again
        with previous.as_directory() as directory:
            if (Path(directory) / RESULT_FILE).exists():
                tune.report(json.loads((Path(directory) / RESULT_FILE).read_text()))
                return
    member = trial.member(setup, params, tune.get_context().get_trial_id())
    if trial.skip(member):
        tune.report({"kept": True})
        return
    data = fold_data[member.fold]
    model, history = run_member(member.setup, data, member.fold, member.member, callbacks=trial.callbacks(member),
                                label=member.label)
    with tempfile.TemporaryDirectory(prefix="kermt-member-") as staging:
        directory = Path(staging)
        save_member(member.setup, model, data, directory, history, member.fold, member.member)
        splits = ray.get(fold_splits[member.fold]) if fold_splits else None
        # what it read: the same shards (and object) for every member of a fold, each written (and put) once
        result = {**trial.finish(member, model, splits, history, directory), "fold_shards": data.train.directory,
                  **({"splits_object": fold_splits[member.fold].hex()} if fold_splits else {})}
        outputs.atomic_write_text(directory / RESULT_FILE, json.dumps(result) + "\n")
        tune.report(result, checkpoint=tune.Checkpoint.from_directory(staging))


def download_files(checkpoint: tune.Checkpoint | None, target: Path, keep_result: bool = True) -> bool:
    """Copy a finished trial's files (its last Tune checkpoint, wherever the experiment is stored) into ``target``
    atomically (staged beside it, then renamed). Returns whether the checkpoint held a finished trial's files."""
    if checkpoint is None:
        return False
    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    checkpoint.to_directory(str(staging))
    if not (staging / RESULT_FILE).exists():  # a checkpoint of an unfinished trial: nothing to keep yet
        shutil.rmtree(staging, ignore_errors=True)
        return False
    if not keep_result:
        (staging / RESULT_FILE).unlink()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return True
