"""What every member of a finetune run shares: settings, checkpoint, featurised data, and the model each starts from.

:func:`resolve_setup` checks the cluster, then reads and checks everything once on the driver (:func:`read_setup`,
all that a dry run does, without Ray); :func:`fold_splits` splits and scales one fold; :func:`model_config` /
:func:`member_initial_state` give a member's architecture and starting weights. Tune trials use the same
functions, so a trial and a finetune member with the same settings train the same model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from kermt.checkpoint import Checkpoint, load_into_model, merge_finetune_config, read_checkpoint
from kermt.checkpoint.reader import FRESH_HEAD_PREFIXES
from kermt.config import ENCODER_ARCHITECTURE_KEYS, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.splits import Split
from kermt.errors import UserError
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.heads import initialize_weights
from kermt.presets import FROM_SCRATCH
from kermt.random_streams import Stream, stream_seed
from kermt.run_layout import RunLayout
from ray_app.common.concurrency import check_workers_fit
from ray_app.common.run_ids import new_run_id
from ray_app.common.settings import Source
from ray_app.common.storage import check_gpus, resolve_max_failures, resolve_storage
from ray_app.finetune.config import FinetuneConfig
from ray_app.finetune.inputs import settle_task
from ray_app.finetune.prepare import ScaledSplits, SourceData, check_train_labels, load_source, scale_splits, \
    split_for_fold, subset, wants_feature_scaling

if TYPE_CHECKING:  # Ray is imported where the cluster is used: a dry run reads the setup without it
    import ray
ENCODER_KEYS = ENCODER_ARCHITECTURE_KEYS
READOUT_KEYS = ("self_attention", "attn_hidden", "attn_out")
HEAD_KEYS = ("ffn_hidden_size", "ffn_num_layers", "ffn_num_task_specific_layers", "ffn_task_specific_hidden_size",
             "features_ffn")


@dataclass(frozen=True)
class RunSetup:
    config: FinetuneConfig
    sources: dict[str, Source]
    save_dir: Path
    run_id: str
    dataset_type: str
    metric: str
    task_names: list[str]
    checkpoint: Checkpoint | None
    data: SourceData
    val: SourceData | None
    test: SourceData | None
    # Both read from the cluster by resolve_setup; a dry run (read_setup alone) leaves them unset
    storage: str = ""  # Ray Train storage: --storage_path, or save_dir/ray_results on a single-node cluster
    max_failures: int = 0  # --max_failures, or the cluster's default (storage.resolve_max_failures)
    # ``checkpoint``'s tensors, once shared (see with_shared_checkpoint)
    checkpoint_tensors: ray.ObjectRef | None = None
    calibration: SourceData | None = None  # --calibration_path, featurised (ray_app.finetune.calibrate)

    @property
    def layout(self) -> RunLayout:
        """Where this run's files go (kermt.run_layout)."""
        return RunLayout(self.save_dir)

    def without_inputs(self) -> "RunSetup":
        """This setup without the featurised input files: what a member's trial gets. It reads its fold's splits
        from the object store instead, so the molecules are not shipped twice."""
        return replace(self, data=None, val=None, test=None, calibration=None)

    def with_shared_checkpoint(self) -> "RunSetup":
        """This setup with the checkpoint's tensors put in the object store once: every member coordinator, trial
        and worker then carries a reference and reads one copy per node (``source_checkpoint``), instead of each
        unpickling its own copy of the source weights (25 members of the 70M release: 25 copies on the head)."""
        from ray_app.common.shared_tensors import put_tensors

        ckpt = self.checkpoint
        if ckpt is None or self.checkpoint_tensors is not None:
            return self
        tensors = put_tensors({**{f"state_dict/{k}": t for k, t in ckpt.state_dict.items()},
                               **{f"passthrough/{k}": t for k, t in ckpt.passthrough.items()}})
        # training_state (upstream's optimizer state, as large as the weights) is only ever named, never used
        header = replace(ckpt, state_dict={}, passthrough={}, training_state=dict.fromkeys(ckpt.training_state))
        return replace(self, checkpoint=header, checkpoint_tensors=tensors)

    def source_checkpoint(self) -> Checkpoint | None:
        """The checkpoint with its tensors (read-only views of the shared copy once shared)."""
        if self.checkpoint is None or self.checkpoint_tensors is None:
            return self.checkpoint
        from ray_app.common.shared_tensors import get_tensors

        parts: dict[str, dict[str, torch.Tensor]] = {"state_dict": {}, "passthrough": {}}
        for key, tensor in get_tensors(self.checkpoint_tensors).items():
            part, name = key.split("/", 1)
            parts[part][name] = tensor
        return replace(self.checkpoint, **parts)


def user_set(setup_sources: dict[str, Source], key: str) -> bool:
    """Whether the user gave ``key`` (a flag or a config file), not its default."""
    return setup_sources.get(key, "default") != "default"


def features_width(splits: ScaledSplits) -> int:
    """Molecule-feature columns the head takes (0 without features)."""
    return splits.train.features.shape[1] if splits.train.features is not None else 0


def model_config(setup: RunSetup, features_size: int) -> FinetuneModelConfig:
    """Architecture from the checkpoint (a contradicting flag is an error); training settings from the user."""
    c, ckpt = setup.config, setup.checkpoint
    head = {"num_tasks": len(setup.task_names), "dataset_type": setup.dataset_type, "features_size": features_size,
            "dropout": c.dropout, "variance": c.loss == "mve", **{k: getattr(c, k) for k in HEAD_KEYS}}
    head["features_ffn"] &= features_size > 0  # the from-scratch default; a run without features has nothing to feed
    readout = {k: getattr(c, k) for k in READOUT_KEYS}
    encoder = {k: getattr(c, k) for k in ENCODER_KEYS if getattr(c, k) is not None}
    encoder.update(dropout=c.dropout, **({} if c.padding is None else {"padding": c.padding}))
    if ckpt is None:
        enc = replace(FROM_SCRATCH, **encoder)  # upstream finetune's architecture, where the user gave none
        return FinetuneModelConfig(enc, ReadoutConfig(**readout), HeadConfig(**{"activation": enc.activation, **head}),
                                   c.use_mtl_loss)
    if ckpt.spec.kind == "finetuned":  # only what the user actually set may (and must) agree with the checkpoint
        readout = {k: v for k, v in readout.items() if user_set(setup.sources, k)}
        head = {k: v for k, v in head.items() if k in ("num_tasks", "dataset_type", "features_size", "dropout")
                or user_set(setup.sources, "loss" if k == "variance" else k)}
    return merge_finetune_config(ckpt.spec, encoder=encoder, readout=readout, head=head,
                                 use_mtl_loss=c.use_mtl_loss, source=str(ckpt.path))


@dataclass(frozen=True)
class StartingWeights:
    """How a member's starting weights are made, without holding them: its training workers build them (each on
    its own node, from the shared checkpoint), so a coordinator never holds a model before training ends."""

    setup: RunSetup  # without inputs; its checkpoint shared
    seed: int
    member: int = 0

    def build(self, config: FinetuneModelConfig) -> tuple[dict[str, torch.Tensor], str]:
        return member_initial_state(self.setup, config, self.seed, self.member)


def member_initial_state(setup: RunSetup, config: FinetuneModelConfig, seed: int,
                         member: int = 0) -> tuple[dict[str, torch.Tensor], str]:
    """The member's starting weights: head initialised as upstream (seeded), encoder from the checkpoint (the
    member's own when the config names one per member: FinetuneConfig.member_checkpoints)."""
    torch.manual_seed(seed)
    model = KermtFinetuneModel(config)
    # Upstream's init (1-D -> 0, else xavier) for the head only; a from-scratch encoder keeps PyTorch's init,
    # since upstream's would zero every LayerNorm gain (docs/upstream-compatibility.md#initialisation).
    for name, module in model.named_children():
        if name != "kermt":
            initialize_weights(module)
    if setup.checkpoint is None:
        return model.state_dict(), "trained from scratch (no checkpoint)"
    own = setup.config.member_checkpoints
    ckpt = read_checkpoint(own[member], trust_pickle=setup.config.trust_checkpoint) if own else \
        setup.source_checkpoint()  # a member's own is read where it trains, as the shared one is
    fresh = FRESH_HEAD_PREFIXES if ckpt.spec.kind != "finetuned" else ("mtl_log_sigma",)
    report = load_into_model(model, ckpt.state_dict, fresh, ckpt.ignored_entries())
    return model.state_dict(), (f"starts from {own[member]}\n" if own else "") + report.summary()


def member_seed(fold_seed: int, member: int) -> int:
    return stream_seed(fold_seed, Stream.MEMBER_SEED, member, high=2**31 - 1)


def resolve_setup(config: FinetuneConfig, sources: dict[str, Source],
                  workers_flag: str = "--num_workers") -> RunSetup:
    """Check the storage and that the cluster can hold a run's workers, then :func:`read_setup` (the data
    featurised on the cluster), with the checkpoint's tensors shared. ``workers_flag``: how the command spells the
    workers of one run, for the message when they cannot fit."""
    storage = resolve_storage(config.storage_path, RunLayout(Path(config.save_dir).resolve()).storage)
    check_gpus(config.use_gpu)  # all three refused before any file is read
    check_workers_fit(config.min_workers, config.use_gpu, workers_flag)
    setup = read_setup(config, sources)
    return replace(setup, storage=storage, max_failures=resolve_max_failures(config.max_failures)
                   ).with_shared_checkpoint()


def read_setup(config: FinetuneConfig, sources: dict[str, Source]) -> RunSetup:
    """Read the checkpoint and every data file (featurised on the cluster, or here under --dry_run: see
    ``prepare.load_source``), settle dataset type and metric. Needs no cluster; storage and max_failures are the
    cluster's, left unset."""
    checkpoint = read_checkpoint(checkpoint_path(config), trust_pickle=config.trust_checkpoint,
                                 dataset_type=config.dataset_type) if (
        config.checkpoint_path or config.pretrained_release) else None
    data = load_source(config.data_path, config, None, config.features_path)
    task_names = data.target_names
    val = load_source(config.separate_val_path, config, task_names, config.separate_val_features_path) if (
        config.separate_val_path) else None
    test = load_source(config.separate_test_path, config, task_names, config.separate_test_features_path,
                       blinded_ok=True) if config.separate_test_path else None
    labelled = [(s.path, s.targets) for s in (data, val, test) if s is not None]
    dataset_type, metric = settle_task(config, data.targets, labelled, task_names)
    if config.loss == "mve" and dataset_type != "regression":
        raise UserError(f"--loss mve is for regression; {config.data_path} is {dataset_type} (drop --loss mve)")
    run_id = new_run_id()  # a fresh run; run_finetune reuses an interrupted run's id (ray_app/finetune/resume.py)
    return RunSetup(config, sources, Path(config.save_dir).resolve(), run_id, dataset_type, metric, task_names,
                    checkpoint, data, val, test)


def task_line(setup: RunSetup) -> str:
    """``dataset_type=regression (inferred from the labels) metric=rmse tasks=['y']``: what the run trains."""
    inferred = " (inferred from the labels)" if setup.config.dataset_type is None else ""
    return f"dataset_type={setup.dataset_type}{inferred} metric={setup.metric} tasks={setup.task_names}"


def checkpoint_path(config: FinetuneConfig) -> str:
    if config.pretrained_release:
        from ray_app.common.release import fetch_release

        return str(fetch_release(config.model_dir))
    assert config.checkpoint_path is not None
    return config.checkpoint_path


def fold_splits(setup: RunSetup, fold: int) -> tuple[Split, ScaledSplits]:
    config = setup.config
    split = split_for_fold(config, setup.data, fold, setup.val is not None, setup.test is not None)
    parts = {"train": subset(setup.data, split.train)}
    check_train_labels(config, setup.data, parts["train"][1], fold, setup.val is not None and setup.test is not None)
    parts["val"] = subset(setup.val, list(range(len(setup.val)))) if setup.val else subset(setup.data, split.val)
    parts["test"] = subset(setup.test, list(range(len(setup.test)))) if setup.test else subset(setup.data, split.test)
    for name, (molecules, _) in parts.items():
        if len(molecules) == 0 and name != "test":
            raise UserError(f"fold {fold}: the {name} split is empty; check {config.split_flag} or the separate "
                            "files")
    return split, scale_splits(parts, setup.dataset_type, wants_feature_scaling(config))
