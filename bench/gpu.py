"""Release-size throughput on one device: train-step and predict molecules per second, fp32 and bf16, ours next to
upstream's on the same device, in the same process, with the same weights and the same dynamic depths.

    python bench/gpu.py --upstream /work/upstream_kermt                 # on a GPU machine (default --device cuda)
    python bench/gpu.py --device cpu --quick --upstream /work/upstream_kermt   # a smoke run anywhere

Release architecture: bench/train_step.py (hidden 800, depth 6, 4 heads, self-attention readout, FFN 700 x 3, 200
rdkit_2d_normalized features, 1 task, dropout 0). Molecules: the finetune fixture split's drug-like SMILES.
Batches are collated before timing (ours with the model's neighbour-sum operators, as the data loader builds them);
what is timed is what runs per batch on the training or predicting process: the host-to-device copy (ours from
pinned memory, as the finetune workers' prefetch; upstream moves its batch inside its forward), forward, and for a
train step the loss, backward and Adam step (ours: kermt.train.optim.build_optimizer, fused on CUDA; upstream: torch's
default Adam), for predict the copy of the predictions back to the host. The loss is the same for both (the mean
square of both views), so the two models do the same work. bf16: ours under kermt.nn.precision.autocast; upstream
has no bf16 option, so it runs under plain torch.autocast. Rates are medians over alternating rounds.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rdkit import Chem

from train_step import RELEASE, SMILES_CSV, load_upstream, release_config  # bench/ is on sys.path here

from kermt.chem.descriptors import molecule_features
from kermt.chem.molgraph import mol_to_graph
from kermt.data.batch import BatchMolGraph
from kermt.data.collate import collate_graphs
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.precision import autocast
from kermt.train.optim import build_optimizer

MODES = ("train", "predict")
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Batch:
    """One collated batch in both forms: ours (graph with operators, pinned on CUDA) and upstream's."""

    graph: BatchMolGraph
    features: torch.Tensor
    upstream_graph: tuple
    upstream_features: list

    @property
    def molecules(self) -> int:
        return self.graph.num_molecules


def device_line(device: torch.device) -> str:
    """What ran: the device's name, torch, CUDA and cuDNN versions, TF32, threads."""
    if device.type == "cuda":
        name = f"{torch.cuda.get_device_name(device)} (cuda:{device.index or 0})"
        extra = (f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, TF32 matmul "
                 f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}")
    else:
        name = f"{platform.processor() or platform.machine()} CPU"
        extra = f"{torch.get_num_threads()} threads, CUDA {torch.version.cuda or 'none (CPU build)'}"
    return f"device: {name}; torch {torch.__version__}, {extra}; python {platform.python_version()}"


def make_batches(count: int, batch_size: int, model: KermtFinetuneModel, training: bool, pin: bool) -> list[Batch]:
    """``count`` batches of ``batch_size`` molecules, cycling through the fixture SMILES if they run out."""
    smiles = pd.read_csv(SMILES_CSV)["smiles"].tolist()
    needed = min(count * batch_size, len(smiles))
    mols = [Chem.MolFromSmiles(s) for s in smiles[:needed]]
    graphs = [mol_to_graph(m) for m in mols]
    features = torch.from_numpy(np.nan_to_num(molecule_features(mols, ("rdkit_2d_normalized",)))).float()
    spec = model.kermt.aggregation_spec(training)
    batches = []
    for index in range(count):
        rows = [(index * batch_size + i) % needed for i in range(batch_size)]
        graph = collate_graphs([graphs[r] for r in rows], operators=spec)
        plain = collate_graphs([graphs[r] for r in rows])
        batch_features = features[rows]
        pinned = (graph.pin_memory(), batch_features.pin_memory()) if pin else (graph, batch_features)
        batches.append(Batch(*pinned, plain.components(), list(batch_features.numpy())))
    return batches


def timed(run: Callable[[Batch, int], None], batches: list[Batch], warmup: int, device: torch.device) -> float:
    """Molecules per wall-second of ``run`` over ``batches[warmup:]`` (the first ``warmup`` ones warm up)."""
    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for index, batch in enumerate(batches[:warmup]):
        run(batch, index)
    synchronize()
    start = time.perf_counter()
    for index, batch in enumerate(batches[warmup:], start=warmup):
        run(batch, index)
    synchronize()
    return sum(b.molecules for b in batches[warmup:]) / (time.perf_counter() - start)


def two_view_loss(atom_view: torch.Tensor, bond_view: torch.Tensor) -> torch.Tensor:
    return atom_view.float().square().mean() + bond_view.float().square().mean()


def ours_runner(model: KermtFinetuneModel, mode: str, precision: str, device: torch.device):
    optimizer = build_optimizer(model, 1e-4, 0.0, 1.0) if mode == "train" else None

    def train(batch: Batch, index: int) -> None:
        np.random.seed(index)  # depth_rng None draws from numpy's global RNG, as upstream: the same depths
        graph = batch.graph.to(device, non_blocking=True)
        features = batch.features.to(device, non_blocking=True)
        with autocast(precision, device):
            out = model(graph, features)
        optimizer.zero_grad(set_to_none=True)
        two_view_loss(out.atom_view, out.bond_view).backward()
        optimizer.step()

    @torch.no_grad()
    def predict(batch: Batch, index: int) -> None:
        graph = batch.graph.to(device, non_blocking=True)
        features = batch.features.to(device, non_blocking=True)
        with autocast(precision, device):
            prediction = model(graph, features).prediction
        prediction.float().cpu()

    model.train(mode == "train")
    return train if mode == "train" else predict


def upstream_runner(model: torch.nn.Module, mode: str, precision: str, device: torch.device):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4) if mode == "train" else None

    def context():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    def train(batch: Batch, index: int) -> None:
        np.random.seed(index)
        with context():
            atom_view, bond_view = model(batch.upstream_graph, batch.upstream_features)
        optimizer.zero_grad(set_to_none=True)
        two_view_loss(atom_view, bond_view).backward()
        optimizer.step()

    @torch.no_grad()
    def predict(batch: Batch, index: int) -> None:
        with context():
            prediction = model(batch.upstream_graph, batch.upstream_features)
        prediction.float().cpu()

    model.train(mode == "train")
    return train if mode == "train" else predict


def release_models(upstream: Path | None, device: torch.device) -> dict[str, torch.nn.Module]:
    """Ours at the release size (PyTorch init + noise: upstream's init makes outputs constant) and upstream's with
    the same weights (its bond-output branches, which ours does not build, keep their own init)."""
    torch.manual_seed(0)
    ours = KermtFinetuneModel(release_config(0.0))
    with torch.no_grad():
        for param in ours.parameters():
            param.add_(0.01 * torch.randn_like(param))
    models = {"ours": ours}
    if upstream is not None:
        try:
            theirs = load_upstream(upstream, "both", 0.0)
        except Exception as error:  # e.g. a package upstream imports is missing here: measure ours alone
            print(f"upstream not measured: its model did not build: {type(error).__name__}: {error}")
            return {name: model.to(device) for name, model in models.items()}
        missing, _ = theirs.load_state_dict(ours.state_dict(), strict=False)
        assert all(".bond_from_" in k or ".ffn_bond_from_" in k for k in missing), missing
        models["upstream"] = theirs
    return {name: model.to(device) for name, model in models.items()}


def measure(models: dict, states: dict, batches: dict, opts, device: torch.device) -> dict:
    """{(mode, precision): {model name: [rates per round], peak MiB}}; every run starts from the same weights."""
    figures = {}
    for mode in MODES:
        for precision in PRECISIONS:
            rates = {name: [] for name in models}
            peaks = {}
            for _ in range(opts.rounds):
                for name, model in models.items():
                    model.load_state_dict(states[name])
                    runner = (ours_runner if name == "ours" else upstream_runner)(model, mode, precision, device)
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    try:
                        rates[name].append(timed(runner, batches[mode, name], opts.warmup, device))
                    except Exception as error:  # upstream under autocast may fail: report it, keep measuring
                        print(f"{mode} {precision} {name}: failed: {type(error).__name__}: {error}")
                        rates[name].append(float("nan"))
                    if device.type == "cuda":
                        peaks[name] = torch.cuda.max_memory_allocated(device) / 2**20
            figures[mode, precision] = {"rates": rates, "peak_mib": peaks}
            print(row(mode, precision, figures[mode, precision]), flush=True)
    return figures


def row(mode: str, precision: str, figure: dict) -> str:
    medians = {name: float(np.median(values)) for name, values in figure["rates"].items()}
    cells = f"{mode:8s}{precision:6s}{medians['ours']:12.4g}"
    if "upstream" in medians:
        cells += f"{medians['upstream']:16.4g}{medians['ours'] / medians['upstream']:9.2f}x"
    if figure["peak_mib"]:
        cells += "   peak MiB " + " / ".join(f"{name} {mib:.0f}" for name, mib in figure["peak_mib"].items())
    return cells


def output_agreement(models: dict, batch: Batch, device: torch.device) -> str:
    """Eval fp32 predictions of ours and upstream's on one batch: the two run the same function."""
    with torch.no_grad():
        ours = models["ours"].eval()(batch.graph.to(device), batch.features.to(device)).prediction
        theirs = models["upstream"].eval()(batch.upstream_graph, batch.upstream_features)
    return (f"eval fp32 predictions, same weights: max |ours - upstream| = {float((ours - theirs).abs().max()):.2e} "
            f"(max |prediction| {float(theirs.abs().max()):.2e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--upstream", type=Path, help="an upstream KERMT checkout to measure next to ours")
    parser.add_argument("--batch-size", type=int, default=32, help="train batch (upstream's finetune default)")
    parser.add_argument("--predict-batch-size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=20, help="timed batches per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 timed batch of 4, 1 round")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    opts = parser.parse_args()
    if opts.quick:
        opts.batch_size = opts.predict_batch_size = 4
        opts.batches, opts.warmup, opts.rounds = 1, 1, 1
    device = torch.device(opts.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"bench/gpu.py: error: --device {opts.device} but torch {torch.__version__} sees no CUDA device")
    print(device_line(device))
    models = release_models(opts.upstream, device)
    states = {name: {k: v.clone() for k, v in model.state_dict().items()} for name, model in models.items()}
    count = opts.warmup + opts.batches
    ours_model = models["ours"]
    batches = {}
    for mode, size in (("train", opts.batch_size), ("predict", opts.predict_batch_size)):
        made = make_batches(count, size, ours_model, mode == "train", pin=device.type == "cuda")
        batches.update({(mode, name): made for name in models})
    atoms = np.mean([b.graph.f_atoms.shape[0] - 1 for b in batches["train", "ours"]]) / opts.batch_size
    print(f"release architecture: hidden {RELEASE['hidden']}, depth {RELEASE['depth']}, {RELEASE['heads']} heads, "
          f"FFN {RELEASE['ffn']} x {RELEASE['ffn_layers']}, {RELEASE['features']} features; train batches of "
          f"{opts.batch_size}, predict batches of {opts.predict_batch_size} ({atoms:.1f} atoms/molecule); "
          f"{opts.batches} timed batches after {opts.warmup} warm-up, median of {opts.rounds} alternating rounds")
    if "upstream" in models:
        print(output_agreement(models, batches["predict", "ours"][0], device))
    upstream_columns = f"{'upstream mol/s':>16s}{'ours/up':>10s}" if "upstream" in models else ""
    print(f"{'':14s}{'ours mol/s':>12s}{upstream_columns}")
    figures = measure(models, states, batches, opts, device)
    if opts.json:
        opts.json.write_text(json.dumps({"device": device_line(device), **{
            f"{mode} {precision}": figure for (mode, precision), figure in figures.items()}}, indent=1))


if __name__ == "__main__":
    main()
