"""A from-scratch architecture far too large for its data: one warning line before Ray starts (issue 38).

An architecture the user chose is trained as given; the line only says how large it is for the data, so that a
typo (``--hidden_size 12000``) or a release-size model on a few hundred molecules is seen in the first second, not
after an hour of overfitting. Runs from a checkpoint never get it: a pretrained encoder's size is not the data's
to carry.

The count is the one a run builds (``run_setup.model_config``, on the meta device: shapes only); the training
molecules are the data file's rows times the train fraction of its split, which is what the split gives before
invalid SMILES are dropped (they are found only when the file is featurised on the cluster).
"""

from __future__ import annotations

from pathlib import Path

from kermt.registry import GENERATOR_WIDTHS
from kermt.data.tables import MoleculeTable
from ray_app.common.settings import Source
from ray_app.finetune.config import FinetuneConfig

# More parameters than this per training molecule is "far too large" (issue 38's own bound): a bound so loose that
# only a mistake, or a model meant for another data set, crosses it.
PARAMETERS_PER_MOLECULE_LIMIT = 1000


def oversized_model_line(config: FinetuneConfig, sources: dict[str, Source], data: MoleculeTable) -> str | None:
    """The warning for an explicit from-scratch architecture with more than PARAMETERS_PER_MOLECULE_LIMIT
    parameters per training molecule of ``data`` (the training file, read by check_finetune_inputs); else None."""
    from ray_app.finetune.run_setup import ENCODER_KEYS, HEAD_KEYS, READOUT_KEYS, user_set

    if config.checkpoint_path or config.pretrained_release:
        return None
    given = [key for key in (*ENCODER_KEYS, *READOUT_KEYS, *HEAD_KEYS) if user_set(sources, key)]
    if not given:  # the default architecture is the recipe's to size, not the user's
        return None
    molecules = training_molecules(config, len(data))
    parameters = from_scratch_parameters(config, sources, data)
    if parameters <= PARAMETERS_PER_MOLECULE_LIMIT * max(molecules, 1):
        return None
    flags = " ".join(f"--{key}" if value is True else f"--{key} {value}"
                     for key, value in ((key, getattr(config, key)) for key in given))
    return (f"warning: the from-scratch model ({flags}) has {parameters:,} parameters, over "
            f"{PARAMETERS_PER_MOLECULE_LIMIT:,} per training molecule (about {molecules:,} of {data.path}'s "
            f"{len(data):,} rows): likely to overfit; it is trained as given, but a smaller one suits this data")


def training_molecules(config: FinetuneConfig, rows: int) -> int:
    """The training split's size for a file of ``rows`` rows, as the run's split sizes it (prepare.split_fractions)."""
    from ray_app.finetune.prepare import split_fractions

    train = split_fractions(config, bool(config.separate_val_path), bool(config.separate_test_path))[0]
    return round(train * rows)


def from_scratch_parameters(config: FinetuneConfig, sources: dict[str, Source], data: MoleculeTable) -> int:
    """Trainable parameters of the model a from-scratch run of ``config`` on ``data`` builds."""
    import torch

    from kermt.nn.finetune import KermtFinetuneModel
    from ray_app.finetune.inputs import settle_task
    from ray_app.finetune.run_setup import RunSetup, model_config

    dataset_type, metric = settle_task(config, data.targets, [], data.target_names)
    setup = RunSetup(config, sources, Path(config.save_dir), "", dataset_type, metric, data.target_names, None,
                     None, None, None)  # what model_config reads: settings, tasks, no checkpoint
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = KermtFinetuneModel(model_config(setup, features_size(config, len(data))))
    return sum(p.numel() for p in model.parameters())


def features_size(config: FinetuneConfig, rows: int) -> int:
    """Molecule-feature columns the head takes: the generators' widths, or the --features_path files' columns."""
    from kermt.data.feature_files import load_features_files

    if config.features_generator:
        return sum(GENERATOR_WIDTHS[name] for name in config.features_generator)
    if config.features_path:
        return load_features_files(config.features_path, expected_rows=rows)[0].shape[1]
    return 0
