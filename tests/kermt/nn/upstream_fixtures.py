"""Test helpers: the upstream fixture batch, checkpoint state dicts and model configs built from saved args.

Fixture checkpoints are trusted test data produced by upstream; they hold ``argparse.Namespace`` objects, so they
are unpickled with ``weights_only=False`` here (tests only; the library's safe loader lives in kermt.checkpoint).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch

from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.batch import BatchMolGraph
from tests.conftest import FIXTURE_DIR

BATCH_FIELDS = ("f_atoms", "f_bonds", "a2b", "b2a", "b2revb", "a_scope", "b_scope", "a2a")


@lru_cache(maxsize=None)
def outputs() -> dict[str, np.ndarray]:
    with np.load(FIXTURE_DIR / "outputs.npz") as data:
        return {key: data[key] for key in data.files}


@lru_cache(maxsize=None)
def _graph_arrays() -> dict[str, np.ndarray]:
    with np.load(FIXTURE_DIR / "graph.npz", allow_pickle=False) as data:
        return {key: data[key] for key in data.files if key.startswith("batch_")}


def fixture_batch() -> BatchMolGraph:
    """The 26-molecule batch exactly as upstream's collator built it."""
    arrays = _graph_arrays()
    return BatchMolGraph(**{name: torch.from_numpy(arrays[f"batch_{name}"].copy()) for name in BATCH_FIELDS})


@lru_cache(maxsize=None)
def load_upstream_checkpoint(name: str) -> dict[str, Any]:
    """``{"args": dict, "state_dict": upstream keys rewritten as upstream's loader does, "data_scaler": ...}``."""
    ckpt = torch.load(FIXTURE_DIR / name, map_location="cpu", weights_only=False)
    state = {}
    for key, value in ckpt["state_dict"].items():
        key = key.replace("grover", "kermt").replace("latent_dist.", "")
        state.setdefault(key, value)  # hybrid ckpts hold the encoder twice (same tensors)
    return {"args": vars(ckpt["args"]), "state_dict": state, "data_scaler": ckpt.get("data_scaler")}


def encoder_config_from_args(args: dict[str, Any], output_type: str = "both") -> EncoderConfig:
    return EncoderConfig(
        hidden_size=args["hidden_size"],
        depth=args["depth"],
        num_attn_head=args["num_attn_head"],
        num_mt_block=args["num_mt_block"],
        activation=args["activation"],
        bias=args["bias"],
        undirected=args["undirected"],
        dropout=args["dropout"],
        embedding_output_type=output_type,
    )


def finetune_config_from_args(args: dict[str, Any]) -> FinetuneModelConfig:
    head = HeadConfig(
        num_tasks=args["num_tasks"],
        dataset_type=args["dataset_type"],
        features_size=args["features_size"] or 0,
        ffn_hidden_size=args["ffn_hidden_size"],
        ffn_num_layers=args["ffn_num_layers"],
        ffn_num_task_specific_layers=args.get("ffn_num_task_specific_layers", 0),
        ffn_task_specific_hidden_size=args.get("ffn_task_specific_hidden_size"),
        dropout=args["dropout"],
        activation=args["activation"],
    )
    readout = ReadoutConfig(
        self_attention=args["self_attention"], attn_hidden=args["attn_hidden"], attn_out=args["attn_out"]
    )
    return FinetuneModelConfig(encoder=encoder_config_from_args(args, "atom"), readout=readout, head=head)


def encoder_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``kermt.`` part of a state dict, with that prefix removed (keys of a KermtEmbedding)."""
    return {key[len("kermt.") :]: value for key, value in state.items() if key.startswith("kermt.")}


def read_key_list(name: str) -> list[tuple[str, tuple[int, ...]]]:
    """``(key, shape)`` rows of a ``keys_*.txt`` fixture (comment lines skipped)."""
    rows = []
    for line in (FIXTURE_DIR / name).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        key, shape = line.split("\t")[:2]
        rows.append((key, tuple(int(d) for d in shape.strip("()").split(",") if d.strip())))
    return rows
