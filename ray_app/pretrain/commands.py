"""Entry points of `kermt corpus` and `kermt pretrain` (``ray_app.cli`` dispatches here).

Only the settings are imported here, so `--help` loads no RDKit, torch, pyarrow or Ray: each command imports its
builder or runner once the flags are known to be good (pretrain checks its inputs before it imports Ray).
"""

from __future__ import annotations

from ray_app.common.command import run_command
from ray_app.common.remote_files import local_files
from ray_app.common.settings import Source
from ray_app.pretrain.config import PretrainConfig
from ray_app.pretrain.corpus_config import CorpusConfig


def main_corpus(argv: list[str]) -> int:
    """`kermt corpus ARGS`."""
    return run_command("kermt corpus", CorpusConfig, argv, _corpus)


def _corpus(config: CorpusConfig, _sources: dict[str, Source]) -> None:
    from ray_app.pretrain.corpus import run_corpus

    run_corpus(config)


def main_pretrain(argv: list[str]) -> int:
    """`kermt pretrain ARGS`. Replayable: config.yaml and run.json name absolute paths."""
    return run_command("kermt pretrain", PretrainConfig, argv, _pretrain, replayable=True)


def _pretrain(config: PretrainConfig, sources: dict[str, Source]) -> None:
    from ray_app.pretrain.inputs import check_pretrain_inputs

    # URIs: --continue_from and vocab files downloaded, --save_dir mirrored (ray_app/common/remote_files); the
    # corpus is read from its URI by the training workers, shard by shard.
    with local_files(config, keep_remote=("data_path",)) as local:
        inputs = check_pretrain_inputs(local)  # corpus, vocabularies, checkpoint: before Ray starts
        from ray_app.pretrain.run import run_pretrain  # Ray is imported only once the input is known to be good

        run_pretrain(local, sources, inputs, recorded=config)


__all__ = ["main_corpus", "main_pretrain"]
