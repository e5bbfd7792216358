"""Finetune train-step throughput on CPU: forward + backward molecules per CPU-second, ours vs upstream.

Release architecture (hidden 800, depth 6, 4 heads, 1 MTBlock, PReLU, self-attention readout 4/8, FFN 700 x 3,
200 rdkit_2d_normalized features, 1 task), batches of drug-like molecules from the finetune fixture split.
Upstream's KermtFinetuneTask (``--upstream PATH``) runs on the same batches in the same process with the same
weights and the same dynamic depths (both draw from numpy's global RNG, reseeded per step), so the
check printed at the end compares like with like.

    python bench/train_step.py --upstream /work/upstream_kermt --batches 3 --batch-size 32 --threads 2

``--compare-draws`` times our step with dropout drawn per molecule (``kermt.nn.keyed_dropout``: every encoder
stacked) against torch's RNG (the per-encoder loop), and one keyed mask against ``F.dropout`` on a bond tensor.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import subprocess
import sys
import tempfile
import time
import types
from argparse import Namespace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rdkit import Chem
from torch.utils._python_dispatch import TorchDispatchMode

from kermt.chem.descriptors import molecule_features
from kermt.chem.molgraph import mol_to_graph
from kermt import config as kermt_config
from kermt.data.batch import BatchMolGraph
from kermt.data.collate import collate_graphs
from kermt.nn import keyed_dropout
from kermt.nn.finetune import KermtFinetuneModel

ROOT = Path(__file__).resolve().parents[1]
SMILES_CSV = ROOT / "tests/data/kermt_upstream_splits/finetune/train.csv"
RELEASE = dict(hidden=800, depth=6, heads=4, ffn=700, ffn_layers=3, attn_hidden=4, attn_out=8, features=200)


def release_config(dropout: float, config: types.ModuleType = kermt_config):
    """The release architecture, built with ``config`` (a kermt.config module: ours, or the baseline's)."""
    EncoderConfig, FinetuneModelConfig = config.EncoderConfig, config.FinetuneModelConfig
    HeadConfig, ReadoutConfig = config.HeadConfig, config.ReadoutConfig
    return FinetuneModelConfig(
        encoder=EncoderConfig(hidden_size=RELEASE["hidden"], depth=RELEASE["depth"], num_attn_head=RELEASE["heads"],
                              dropout=dropout),
        readout=ReadoutConfig(self_attention=True, attn_hidden=RELEASE["attn_hidden"], attn_out=RELEASE["attn_out"]),
        head=HeadConfig(num_tasks=1, dataset_type="regression", features_size=RELEASE["features"],
                        ffn_hidden_size=RELEASE["ffn"], ffn_num_layers=RELEASE["ffn_layers"], dropout=dropout),
    )


def make_batches(n_batches: int, batch_size: int) -> list[tuple[BatchMolGraph, torch.Tensor]]:
    smiles = pd.read_csv(SMILES_CSV)["smiles"].tolist()[: n_batches * batch_size]
    mols = [Chem.MolFromSmiles(s) for s in smiles]
    features = torch.from_numpy(np.nan_to_num(molecule_features(mols, ("rdkit_2d_normalized",)))).float()
    batches = []
    for start in range(0, len(mols), batch_size):
        graph = collate_graphs([mol_to_graph(m) for m in mols[start : start + batch_size]])
        graph = dataclasses.replace(graph, molecule_ids=torch.arange(start, start + graph.num_molecules))
        batches.append((graph, features[start : start + batch_size]))
    return batches


def import_from_checkout(path: Path, module_names: list[str]) -> list[types.ModuleType]:
    """Modules of another ``kermt`` package (upstream's, or ours at another commit) found under ``path``.

    Both are called ``kermt``: ours are moved aside from ``sys.modules`` while the others import, then put back,
    so the two implementations live side by side in one process (each module keeps its own globals).
    """
    ours = {name: mod for name, mod in sys.modules.items() if name == "kermt" or name.startswith("kermt.")}
    for name in ours:
        del sys.modules[name]
    sys.path.insert(0, str(path))
    try:
        return [importlib.import_module(name) for name in module_names]
    finally:
        sys.path.remove(str(path))
        sys.modules.update(ours)


def import_upstream_build_model(path: Path):
    """Upstream's ``kermt.util.utils.build_model``, imported from the checkout at ``path``."""
    # cuik_molmaker (GPU featurisation) is imported at module level upstream but unused here; it is not on PyPI
    # in a working form, so a stub module stands in for it.
    def unavailable(name: str):
        if name.startswith("__"):  # module dunders (__file__, __spec__...) must stay missing for inspect
            raise AttributeError(name)
        return lambda *args, **kwargs: None

    stub = types.ModuleType("cuik_molmaker")
    stub.__getattr__ = unavailable  # PEP 562: any attribute resolves to a no-op callable
    stub.mol_features = types.ModuleType("cuik_molmaker.mol_features")
    stub.mol_features.__getattr__ = unavailable
    sys.modules.setdefault("cuik_molmaker", stub)
    sys.modules.setdefault("cuik_molmaker.mol_features", stub.mol_features)
    (utils,) = import_from_checkout(path, ["kermt.util.utils"])
    return utils.build_model


def load_upstream(path: Path, output_type: str, dropout: float) -> torch.nn.Module:
    """Upstream's finetune model at the release architecture, built by its own ``build_model``."""
    upstream_build_model = import_upstream_build_model(path)
    args = Namespace(
        parser_name="finetune", hidden_size=RELEASE["hidden"], bias=False, depth=RELEASE["depth"], dropout=dropout,
        activation="PReLU", undirected=False, dense=False, ffn_hidden_size=RELEASE["ffn"],
        ffn_num_layers=RELEASE["ffn_layers"], self_attention=True, attn_hidden=RELEASE["attn_hidden"],
        attn_out=RELEASE["attn_out"], embedding_output_type=output_type, backbone="gtrans",
        num_attn_head=RELEASE["heads"], num_mt_block=1, cuda=False, features_only=False,
        features_size=RELEASE["features"], features_dim=0, num_tasks=1, dataset_type="regression",
        ffn_num_task_specific_layers=0, ffn_task_specific_hidden_size=None,
    )
    return upstream_build_model(args)


def _ours_step(model, graph, features):
    out = model(graph, features)
    return out.atom_view, out.bond_view


def _upstream_step(model, graph, features):
    return model(graph.components(), list(features.numpy()))


def _ours_step_drawing(draws: str):
    """Our step with dropout drawn ``draws`` ("per_molecule" or "torch"); the masks of a step are drawn in its
    forward, so the backward needs no draws context."""

    def step(model, graph, features):
        with keyed_dropout.dropout_draws(draws, 0, 0, graph):
            return _ours_step(model, graph, features)

    return step


def compare_draws(model, batches: list, rounds: int) -> None:
    """Per-molecule vs torch dropout draws: train steps in alternating rounds, and one mask on a bond tensor."""
    warmup, timed = batches[:1], batches[1:]
    steps = {draws: _ours_step_drawing(draws) for draws in ("per_molecule", "torch")}
    rates = {draws: [] for draws in steps}
    for step in steps.values():
        time_train_steps(model, step, warmup, seed=0)
    for _ in range(rounds):
        for draws, step in steps.items():
            rates[draws].append(time_train_steps(model, step, timed, seed=1)[0])
    medians = {draws: float(np.median(values)) for draws, values in rates.items()}
    print(f"dropout drawn per molecule: {medians['per_molecule']:6.2f} mol/CPU-s, torch's RNG: "
          f"{medians['torch']:6.2f} mol/CPU-s ({medians['per_molecule'] / medians['torch']:.2f}x)")
    graph = timed[0][0]
    x = torch.randn(graph.f_bonds.shape[0], RELEASE["hidden"])
    with keyed_dropout.per_molecule_draws(0, 0, graph):
        keyed = _cpu_seconds(lambda: keyed_dropout.dropout(x, 0.1, True, "bond", keyed_dropout.reserve_streams(1)))
    plain = _cpu_seconds(lambda: torch.nn.functional.dropout(x, 0.1, True))
    print(f"one mask on a {list(x.shape)} bond tensor: keyed {keyed * 1e3:.1f} ms, F.dropout {plain * 1e3:.1f} ms "
          f"({keyed / plain:.1f}x) CPU time, best of 20")


def _cpu_seconds(run, repeats: int = 20) -> float:
    best = float("inf")
    for _ in range(repeats):
        cpu0 = time.process_time()
        run()
        best = min(best, time.process_time() - cpu0)
    return best


def time_train_steps(model, step_fn, batches, seed: int) -> tuple[float, float, list[torch.Tensor]]:
    """(molecules per CPU-second, per wall-second, first-batch outputs) for forward+backward on every batch."""
    model.train()
    molecules, cpu, wall, first = 0, 0.0, 0.0, []
    for i, (graph, features) in enumerate(batches):
        np.random.seed(seed + i)  # same dynamic depths for both models
        torch.manual_seed(seed + i)
        model.zero_grad(set_to_none=True)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        atom_view, bond_view = step_fn(model, graph, features)
        (atom_view.square().mean() + bond_view.square().mean()).backward()
        cpu += time.process_time() - cpu0
        wall += time.perf_counter() - wall0
        molecules += graph.num_molecules
        if i == 0:
            first = [atom_view.detach(), bond_view.detach()]
    return molecules / cpu, molecules / wall, first


class DenseMatmulFlops(TorchDispatchMode):
    """Counts the FLOPs of dense (strided) mm / addmm / bmm calls; sparse neighbour sums are left out."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        packet = func.overloadpacket
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if packet in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm) and all(
            t.layout == torch.strided for t in tensors
        ):
            left, right = tensors[-2], tensors[-1]
            self.flops += 2 * left.numel() * right.shape[-1]
        return out


def step_matmul_flops(model, step_fn, batches) -> float:
    """Dense matmul FLOPs of forward + backward over ``batches`` (same depths as the timed runs)."""
    with DenseMatmulFlops() as counter:
        time_train_steps(model, step_fn, batches, seed=1)
    return counter.flops


def sgemm_flops_per_cpu_second(rows: int, hidden: int, threads: int) -> float:
    """This machine's best matmul rate per CPU-second: best of several [rows, hidden] x [hidden, hidden]
    products at 1 thread and at ``threads`` (one thread wastes no CPU time on synchronisation)."""
    x, w = torch.randn(rows, hidden), torch.randn(hidden, hidden)
    best = 0.0
    for thread_count in sorted({1, threads}):
        torch.set_num_threads(thread_count)
        for _ in range(10):
            cpu0 = time.process_time()
            for _ in range(4):
                torch.mm(x, w)
            best = max(best, 4 * 2 * rows * hidden * hidden / (time.process_time() - cpu0))
    torch.set_num_threads(threads)
    return best


LIBRARY_MODULES = ("kermt.config", "kermt.chem.molgraph", "kermt.data.collate", "kermt.data.dataset",
                   "kermt.nn.finetune", "kermt.train.step", "kermt.train.optim")
FORMER_NAMES = {"kermt.train.step": "kermt.training", "kermt.train.optim": "kermt.optim"}  # before kermt/train/


def load_library(revision: str | None, scratch: Path) -> dict[str, types.ModuleType]:
    """Our library's modules: as imported (``revision`` None) or at a git ``revision`` (``git archive`` of kermt/)."""
    if revision is None:
        return {name: importlib.import_module(name) for name in LIBRARY_MODULES}
    archive = subprocess.run(["git", "archive", revision, "kermt"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive.stdout, check=True)
    at_revision = {}
    for name in LIBRARY_MODULES:
        found = [n for n in (name, FORMER_NAMES.get(name, name)) if (scratch / (n.replace(".", "/") + ".py")).exists()]
        at_revision[name] = found[0]
    return dict(zip(at_revision, import_from_checkout(scratch, list(at_revision.values()))))


def _audited(run, host_tensors=()) -> tuple[int, int, int, str]:
    """(dispatched ops, of which not views, host synchronisations, the synchronising ops by name) of ``run()``."""
    from dispatch_audit import DispatchAudit  # bench/ is on sys.path; it observes any implementation

    with DispatchAudit(host_tensors) as audit:
        run()
    syncs = ", ".join(f"{n} {c}" for n, c in sorted(audit.syncs.items()))
    return audit.op_count, audit.kernel_count, audit.sync_count, syncs


def audit_library(lib: dict, state: dict, mols: list, features: torch.Tensor, targets: torch.Tensor) -> dict:
    """Ops and syncs of one eval forward, one forward+backward and one full train step (a second step: Adam's
    lazy state initialisation is not steady state) at the release size, on one batch."""
    model = lib["kermt.nn.finetune"].KermtFinetuneModel(release_config(0.0, lib["kermt.config"]))
    model.load_state_dict(state)
    graphs = [lib["kermt.chem.molgraph"].mol_to_graph(m) for m in mols]

    def batch(training: bool):
        spec = model.kermt.aggregation_spec(training) if hasattr(model.kermt, "aggregation_spec") else None
        graph = lib["kermt.data.collate"].collate_graphs(graphs, **({"operators": spec} if spec else {}))
        extra = {"global_label_counts": (~torch.isnan(targets)).sum(0).float()} if spec else {}
        return lib["kermt.data.dataset"].MoleculeBatch(graph, features, targets, np.arange(len(mols)), **extra)

    eval_batch, train_batch = batch(False), batch(True)
    model.eval()
    with torch.no_grad():
        model(eval_batch.graph, eval_batch.features)
        results = {"eval forward": _audited(lambda: model(eval_batch.graph, eval_batch.features))}
    model.train()

    def forward_backward():
        out = model(train_batch.graph, train_batch.features, np.random.default_rng(0))
        (out.atom_view.square().mean() + out.bond_view.square().mean()).backward()

    results["forward + backward"] = _audited(forward_backward)
    optim, training = lib["kermt.train.optim"], lib["kermt.train.step"]
    optimizer = optim.build_optimizer(model, 1e-4, 0.0, 1.0)
    # the Adam each library runs on CUDA: ours picks the fused one there (kermt.train.optim.adam_implementation), a
    # library without that choice gets torch's CUDA default, foreach (on CPU: one op chain per tensor)
    on_cuda = {"fused": True, "foreach": False} if hasattr(optim, "adam_implementation") else {"foreach": True}
    for group in optimizer.param_groups:
        group.update(on_cuda)
    scheduler = optim.NoamLR(optimizer, optim.NoamSchedule(2.0, 10, 10, 1e-4, 1e-3, 1e-4), 1.0)
    collectives = []

    def count_collective(tensor):
        collectives.append(tensor)
        return tensor

    # the step's settings class before and after its rename (a baseline revision may have either)
    settings = getattr(training, "FinetuneStepSettings", None) or training.StepSettings

    def step():
        training.train_step(model, optimizer, scheduler, train_batch, settings("regression", 0.1),
                            np.random.default_rng(1), 1, count_collective)

    step()
    collectives.clear()
    from dispatch_audit import optimizer_host_tensors  # bench/ is on sys.path

    results["train step"] = _audited(step, optimizer_host_tensors(optimizer))
    results["train step collectives"] = len(collectives)
    return results


def print_audit(opts, state: dict, batch_size: int) -> None:
    frame = pd.read_csv(SMILES_CSV).head(batch_size)
    mols = [Chem.MolFromSmiles(s) for s in frame["smiles"]]
    features = torch.from_numpy(np.nan_to_num(molecule_features(mols, ("rdkit_2d_normalized",)))).float()
    targets = torch.from_numpy(frame[["y_mean"]].to_numpy(np.float32))
    with tempfile.TemporaryDirectory() as scratch:
        revisions = {"ours": None, **({f"baseline {opts.baseline}": opts.baseline} if opts.baseline else {})}
        audits = {name: audit_library(load_library(rev, Path(scratch)), state, mols, features, targets)
                  for name, rev in revisions.items()}
    print(f"host synchronisations and dispatched aten ops, release size, one batch of {batch_size}:")
    header = "".join(f"{name:>26s}" for name in audits)
    print(f"{'':32s}{header}" + ("   ours / baseline" if len(audits) == 2 else ""))
    for what in ("eval forward", "forward + backward", "train step"):
        cells = [audits[name][what] for name in audits]
        for label, column in ((" ops", 0), (" ops, not views", 1), (" syncs", 2)):
            ratio = f"   {cells[0][column] / cells[1][column]:.2f}" if len(cells) == 2 and cells[1][column] else ""
            print(f"{what + label:32s}" + "".join(f"{cell[column]:26d}" for cell in cells) + ratio)
        for name, cell in zip(audits, cells):
            if cell[2]:
                print(f"{'':34s}{name}: {cell[3]}")
    print(f"{'train step collectives':32s}" + "".join(f"{audits[n]['train step collectives']:26d}" for n in audits))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", type=Path, help="path of an upstream KERMT checkout to compare with")
    parser.add_argument("--upstream-output-type", choices=("both", "atom"), default="both",
                        help="upstream encoder outputs ('both' is what finetuning from a pretrained ckpt runs)")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="alternating timing rounds; medians are compared")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dropout", type=float, default=0.0, help="0 lets the outputs of both models be compared")
    parser.add_argument("--baseline", metavar="REV", help="git revision of this repository whose ops and host "
                        "synchronisations are printed next to ours (its kermt/ is imported in this process)")
    parser.add_argument("--audit-only", action="store_true", help="print the op and sync audit, skip the timing")
    parser.add_argument("--compare-draws", action="store_true", help="time our step with dropout drawn per "
                        "molecule against torch's RNG (dropout 0.1 unless --dropout is given), then stop")
    opts = parser.parse_args()
    if opts.compare_draws and opts.dropout == 0.0:
        opts.dropout = 0.1
    return opts


def time_models(models: dict, warmup: list, timed: list, rounds: int) -> tuple[dict[str, float], dict]:
    """Alternating timing rounds; returns each model's median mol/CPU-s and its first train-mode outputs."""
    rates, first = {name: [] for name in models}, {}
    for model, step_fn in models.values():
        time_train_steps(model, step_fn, warmup, seed=0)
    for round_index in range(rounds):
        for name, (model, step_fn) in models.items():
            cpu_rate, wall_rate, first[name] = time_train_steps(model, step_fn, timed, seed=1)
            rates[name].append(cpu_rate)
            print(f"round {round_index + 1} {name:9s}: {cpu_rate:6.2f} mol/CPU-s  {wall_rate:6.2f} mol/s")
    medians = {name: float(np.median(values)) for name, values in rates.items()}
    for name, median in medians.items():
        print(f"{name:9s} median: {median:6.2f} mol/CPU-s")
    return medians, first


def print_matmul_floor(ours: torch.nn.Module, timed: list, threads: int) -> float:
    """Prints and returns the mol/CPU-s no step doing our dense matmul arithmetic can exceed on this machine."""
    molecules = sum(g.num_molecules for g, _ in timed)
    flops = step_matmul_flops(ours, _ours_step, timed)
    rows = int(np.mean([g.f_bonds.shape[0] for g, _ in timed]))
    sgemm = sgemm_flops_per_cpu_second(rows, RELEASE["hidden"], threads)
    floor = molecules / (flops / sgemm)
    thread_counts = " or ".join(str(n) for n in sorted({1, threads}))
    print(f"matmul floor: ours does {flops / molecules / 1e9:.1f} GFLOP of dense matmul per molecule; at this "
          f"machine's best sgemm rate ({sgemm / 1e9:.1f} GFLOP per CPU-s at {thread_counts} thread(s), "
          f"[{rows} x {RELEASE['hidden']}] x [{RELEASE['hidden']} x {RELEASE['hidden']}]) no step doing that "
          f"arithmetic exceeds {floor:.2f} mol/CPU-s")
    return floor


def main() -> None:
    opts = parse_args()
    torch.set_num_threads(opts.threads)
    torch.manual_seed(0)
    ours = KermtFinetuneModel(release_config(opts.dropout))
    with torch.no_grad():  # PyTorch default init + noise: upstream's init (LayerNorm gains 0) makes outputs constant
        for param in ours.parameters():
            param.add_(0.01 * torch.randn_like(param))
    if opts.compare_draws:
        return compare_draws(ours, make_batches(opts.batches + 1, opts.batch_size), opts.rounds)
    print_audit(opts, ours.state_dict(), opts.batch_size)
    if opts.audit_only:
        return
    batches = make_batches(opts.batches + 1, opts.batch_size)
    warmup, timed = batches[:1], batches[1:]
    print(f"threads {opts.threads}, {len(timed)} timed batches of {opts.batch_size} molecules "
          f"(mean {np.mean([g.f_atoms.shape[0] - 1 for g, _ in timed]) / opts.batch_size:.1f} atoms/molecule), "
          f"{opts.rounds} alternating rounds")
    models = {"ours": (ours, _ours_step)}
    if opts.upstream is not None:
        upstream = load_upstream(opts.upstream, opts.upstream_output_type, opts.dropout)
        missing, _ = upstream.load_state_dict(ours.state_dict(), strict=False)
        assert all(".bond_from_" in k or ".ffn_bond_from_" in k for k in missing), missing
        models["upstream"] = (upstream, _upstream_step)
    medians, first = time_models(models, warmup, timed, opts.rounds)
    floor = print_matmul_floor(ours, timed, opts.threads)
    if "upstream" not in models:
        return
    print(f"speed-up : {medians['ours'] / medians['upstream']:.2f}x per CPU-second (medians); matmul floor = "
          f"{floor / medians['upstream']:.2f}x upstream")
    if opts.dropout == 0.0:
        diff = max(float((a - b).abs().max()) for a, b in zip(first["ours"], first["upstream"]))
        scale = max(float(a.abs().max()) for a in first["upstream"])
        print(f"train-mode outputs, same weights and depths: max |ours - upstream| = {diff:.2e} "
              f"(max |output| {scale:.2e})")


if __name__ == "__main__":
    main()
