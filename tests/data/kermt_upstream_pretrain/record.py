"""Record upstream KERMT's pretraining oracles (see README.md in this directory). Needs an upstream checkout at the
fixtures' commit; run from the repository root:

    .venv/bin/python tests/data/kermt_upstream_pretrain/record.py --upstream /path/to/KERMT

Only upstream's code runs here: its package is imported with bench/upstream_env.py's stubs, and our ``kermt`` is
never imported (both packages are called ``kermt``).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import torch
from rdkit import Chem

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
FIXTURES = ROOT / "tests/data/kermt_upstream"
sys.path.insert(0, str(ROOT / "bench"))

from upstream_env import upstream_env  # noqa: E402 - bench/ is put on sys.path above

sys.path.remove(str(ROOT / "bench"))


def import_upstream(upstream: Path, scratch: Path) -> None:
    """Put upstream's checkout (and the cuik_molmaker stub) first on sys.path, with our repository off it."""
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    sys.path[:0] = upstream_env(upstream, scratch)["PYTHONPATH"].split(":")
    # KermtTask.forward marks NVTX ranges, which CPU-only torch refuses; they are profiler labels, nothing more
    torch.cuda.nvtx.range_push = torch.cuda.nvtx.range_pop = lambda *args, **kwargs: None


def fixture_smiles() -> list[str]:
    with open(FIXTURES / "smiles.csv", newline="") as handle:
        return [row["smiles"] for row in csv.DictReader(handle)]


def fg_labels(smiles: list[str]) -> np.ndarray:
    """Upstream's ``fgtasklabel`` generator on each SMILES string, as scripts/save_features.py calls it: [M, 85]."""
    from kermt.data.molfeaturegenerator import get_features_generator
    import kermt.data.task_labels  # noqa: F401 - imported to register fgtasklabel

    generator = get_features_generator("fgtasklabel")
    labels = np.stack([generator(s) for s in smiles])
    assert set(np.unique(labels)) <= {0.0, 1.0}
    return labels.astype(np.uint8)


# Cases of the pretraining-step oracle: mode, checkpoint, seeds, loss settings, which gradients to keep.
# "hybrid_weighted" moves every loss weight off its default and turns on normalize_gradient, so a weight applied to
# the wrong term cannot hide. To keep the file small, "hybrid" keeps no gradients (hybrid_weighted has them all) and
# "cmim" keeps those outside its encoder (its encoder's gradient path is hybrid's latent branch).
STEP_CASES = {
    "vocab": dict(mode="vocab", ckpt="ckpt_pretrain_vocab.pt", label_seed=0, forward_seed=1, loss={},
                  grads="all"),
    "hybrid": dict(mode="hybrid", ckpt="ckpt_pretrain_hybrid.pt", label_seed=2, forward_seed=3, loss={},
                   grads="none"),
    "hybrid_weighted": dict(
        mode="hybrid", ckpt="ckpt_pretrain_hybrid.pt", label_seed=4, forward_seed=5,
        loss=dict(dist_coff=0.15, vocab_loss_weight=0.5, reconstruction_loss_weight=0.7, normalize_gradient=True),
        grads="all",
    ),
    "cmim": dict(mode="cmim", ckpt="ckpt_pretrain_hybrid.pt", label_seed=6, forward_seed=7, loss={},
                 grads="heads"),
}
LOSS_DEFAULTS = dict(dist_coff=0.1, vocab_loss_weight=1.0, reconstruction_loss_weight=1.0, normalize_gradient=False,
                     normalize_loss=False)  # the fixture checkpoints' saved values
# Names of the values each task's loss function returns, in its order (upstream's trainers log them all).
LOSS_NAMES = {
    "vocab": ("loss", "av_loss", "bv_loss", "fg_loss", "av_dist_loss", "bv_dist_loss", "fg_dist_loss"),
    "cmim": ("loss", "recon_loss", "cmim_loss", "log_p_k1_given_zx", "log_q_z_given_x", "log_P_z", "recon_accuracy"),
    "hybrid": ("loss", "cmim_total", "recon_loss", "cmim_loss", "log_p_k1_given_zx", "log_q_z_given_x", "log_P_z",
               "recon_accuracy", "vocab_loss", "av_loss", "bv_loss", "fg_loss", "av_dist_loss", "bv_dist_loss",
               "fg_dist_loss"),
}


class DepthRecorder:
    """Stands in for ``scipy.stats`` in upstream's layers module and notes every dynamic depth drawn."""

    def __init__(self, stats):
        self.stats, self.depths = stats, []

    def truncnorm(self, *args, **kwargs):
        dist, depths = self.stats.truncnorm(*args, **kwargs), self.depths

        class Recorded:
            def rvs(self, *a, **k):
                value = dist.rvs(*a, **k)
                depths.append(int(value))
                return value

        return Recorded()


def upstream_args(ckpt_args, loss_settings: dict):
    """The checkpoint's saved args for a CPU train step with dropout 0 (deterministic apart from the draws)."""
    from argparse import Namespace

    overrides = dict(cuda=False, dropout=0.0, decoder_dropout=0.0, bond_drop_rate=0, no_cache=True,
                     tensorboard=True)  # tensorboard: the loss functions then also return token accuracy
    return Namespace(**{**vars(ckpt_args), **overrides, **loss_settings})


def build_task(mode: str, ckpt: dict, args, vocab_sizes: dict):
    """Upstream's task class for ``mode`` (as pretrain_ddp.py builds it) with the checkpoint's weights."""
    from kermt.model.models import KERMTEmbedding, KermtCMIMTask, KermtHybridTask, KermtTask

    state = ckpt["state_dict"]
    if mode == "vocab":
        model = KermtTask(args, KERMTEmbedding(args), vocab_sizes["atom"], vocab_sizes["bond"], fg_size=85)
    elif mode == "hybrid":
        model = KermtHybridTask(args, kermt=KERMTEmbedding(args), latent_dim=args.latent_dim,
                                contrastive_temperature=args.contrastive_temperature,
                                smiles_vocab_size=vocab_sizes["smiles"], atom_vocab_size=vocab_sizes["atom"],
                                bond_vocab_size=vocab_sizes["bond"], fg_size=85)
    else:  # cmim: the hybrid checkpoint's latent head and decoder
        model = KermtCMIMTask(args, kermt=KERMTEmbedding(args), latent_dim=args.latent_dim,
                              contrastive_temperature=args.contrastive_temperature,
                              smiles_vocab_size=vocab_sizes["smiles"])
        state = {k: v for k, v in state.items() if k.startswith(("latent_dist.", "decoder."))}
    model.load_state_dict(state, strict=True)
    torch.set_grad_enabled(True)
    return model.train()


def collate(mode: str, smiles: list[str], labels: np.ndarray, vocabs: dict, args) -> dict:
    """Upstream's collator of the mode on the fixture molecules (fg labels as the datapoints' features)."""
    from kermt.data import kermtdataset as data
    from kermt.data.moldataset import MoleculeDatapoint

    items = [(MoleculeDatapoint([s], features=labels[i].astype(np.float64)), i) for i, s in enumerate(smiles)]
    if mode == "vocab":
        return data.KermtCollator({}, vocabs["atom"], vocabs["bond"], args)(items)
    if mode == "hybrid":
        return data.KermtHybridCollator({}, vocabs["smiles"], vocabs["atom"], vocabs["bond"], args)(items)
    return data.KermtDecoderCollator({}, vocabs["smiles"], args)(items)


def load_vocabs() -> dict:
    from kermt.data.torchvocab import MolVocab, SMILESVocab

    return {"atom": MolVocab.load_vocab(str(FIXTURES / "tiny_atom_vocab.json")),
            "bond": MolVocab.load_vocab(str(FIXTURES / "tiny_bond_vocab.json")),
            "smiles": SMILESVocab.load_vocab(str(FIXTURES / "tiny_smiles_vocab.pkl"))}


def seeded_forward(model, batch: dict, case: dict) -> tuple[dict, list[int], list[torch.Tensor]]:
    """Upstream's train-mode forward after seeding numpy (dynamic depths) and torch (latent noise) with the case's
    forward_seed: (predictions, depths drawn, noise tensors drawn)."""
    from kermt.model import layers

    recorder, real_stats, real_randn_like, eps = DepthRecorder(layers.stats), layers.stats, torch.randn_like, []

    def randn_like(*args, **kwargs):  # the latent's reparameterisation noise
        eps.append(real_randn_like(*args, **kwargs))
        return eps[-1]

    layers.stats, torch.randn_like = recorder, randn_like
    try:
        np.random.seed(case["forward_seed"])
        torch.manual_seed(case["forward_seed"])
        preds = model(batch["graph_input"] if case["mode"] == "vocab" else batch)
    finally:
        layers.stats, torch.randn_like = real_stats, real_randn_like
    return preds, recorder.depths, eps


def pretrain_step(name: str, case: dict, smiles: list[str], labels: np.ndarray, vocabs: dict) -> dict:
    """One seeded train step of upstream's task: batch draws, loss terms and every parameter's gradient."""
    ckpt = torch.load(FIXTURES / case["ckpt"], map_location="cpu", weights_only=False)  # upstream's own fixture
    settings = {**case, "loss": {**LOSS_DEFAULTS, **case["loss"]}}
    args = upstream_args(ckpt["args"], settings["loss"])
    model = build_task(case["mode"], ckpt, args, {k: len(v) for k, v in vocabs.items()})
    np.random.seed(case["label_seed"])  # the collator's atom / bond masking draws
    batch = collate(case["mode"], smiles, labels, vocabs, args)
    preds, depths, eps = seeded_forward(model, batch, case)
    losses = model.get_loss_func(args)(preds, batch.get("targets"))
    losses[0].backward()
    out = {f"{name}::settings": np.array(json.dumps(settings)), f"{name}::depths": np.array(depths)}
    for loss_name, value in zip(LOSS_NAMES[case["mode"]], losses):
        out[f"{name}::{loss_name}"] = np.float64(float(value))
    if "targets" in batch:
        out[f"{name}::av_labels"] = batch["targets"]["av_task"].numpy()
        out[f"{name}::bv_labels"] = batch["targets"]["bv_task"].numpy()
    if case["mode"] != "vocab":
        out[f"{name}::tokens"] = torch.cat([batch["decoder_input"], batch["decoder_target"][:, -1:]], 1).numpy()
        out[f"{name}::eps"] = torch.cat(eps).numpy()
        out[f"{name}::z"] = preds["z_latent"].detach().numpy()
    for param_name, param in model.named_parameters():
        wanted = case["grads"] == "all" or (case["grads"] == "heads" and ".kermt." not in f".{param_name}")
        if wanted and param.grad is not None:
            out[f"{name}::grad::{param_name}"] = param.grad.numpy().copy()
    return out


VOCAB_INPUT = HERE / "vocab_input.csv"
VOCAB_SOURCE = ROOT / "data/sample/admet_demo.csv"
VOCAB_MOLECULES = 300
UNPARSABLE = "C1CC(=O"  # RDKit returns None: upstream's atom/bond counting skips it, its SMILES tokenizer does not
# --dataset_name -> extra build_vocab.py flags; each run writes <name>_{atom,bond}_vocab.json, <name>_smiles_vocab.pkl
VOCAB_RUNS = {
    "all": [],
    "minfreq2": ["--vocab_min_freq", "2", "--smiles_vocab_min_freq", "2"],
    "max40": ["--vocab_max_size", "40", "--smiles_vocab_max_size", "20"],
}


def non_canonical(smiles: str) -> str:
    """The same molecule written otherwise: kekulé, rooted at its last atom (so upstream's cleaning rewrites it)."""
    mol = Chem.MolFromSmiles(smiles)
    Chem.Kekulize(mol, clearAromaticFlags=True)
    return Chem.MolToSmiles(mol, rootedAtAtom=mol.GetNumAtoms() - 1, kekuleSmiles=True)


def write_vocab_input() -> None:
    """One-column SMILES file: the first VOCAB_MOLECULES of the bundled sample data (already RDKit-canonical),
    every third rewritten by :func:`non_canonical`, plus one unparsable row."""
    with open(VOCAB_SOURCE, newline="") as handle:
        rows = [row["smiles"] for _, row in zip(range(VOCAB_MOLECULES), csv.DictReader(handle))]
    rows = [non_canonical(smi) if i % 3 == 1 else smi for i, smi in enumerate(rows)]
    rows.insert(VOCAB_MOLECULES // 2, UNPARSABLE)
    VOCAB_INPUT.write_text("smiles\n" + "".join(f"{smi}\n" for smi in rows))


def run_upstream_script(upstream: Path, scratch: Path, script: str, *flags: str) -> None:
    env = upstream_env(upstream, scratch)
    subprocess.run([sys.executable, f"scripts/{script}", *flags], cwd=upstream, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def build_vocabs(upstream: Path, scratch: Path) -> None:
    """Upstream's scripts/build_vocab.py, its real CLI, once per VOCAB_RUNS entry on the raw input; then upstream's
    documented flow, scripts/clean_smiles.py (drop unparsable rows, canonicalise) and build_vocab.py ("cleaned")."""
    common = ["--vocab_save_folder", str(HERE), "--num_workers", "2"]
    for name, flags in VOCAB_RUNS.items():
        run_upstream_script(upstream, scratch, "build_vocab.py", "--data_path", str(VOCAB_INPUT), *common,
                            "--dataset_name", name, *flags)
    cleaned = scratch / "vocab_input_clean.csv"
    run_upstream_script(upstream, scratch, "clean_smiles.py", "--input", str(VOCAB_INPUT), "--output", str(cleaned),
                        "--restart")
    run_upstream_script(upstream, scratch, "build_vocab.py", "--data_path", str(cleaned), *common,
                        "--dataset_name", "cleaned")


# Optimizer-step oracle: a tiny finetune model (upstream's build_model init, torch seed 0), upstream's
# build_optimizer (+ the MTL log_sigma appended to the head group, as task/train.py does) and build_lr_scheduler.
OPTIM_MODEL = dict(
    parser_name="finetune", hidden_size=4, bias=False, depth=2, dropout=0.0, activation="PReLU", undirected=False,
    dense=False, ffn_hidden_size=5, ffn_num_layers=2, self_attention=True, attn_hidden=3, attn_out=2,
    embedding_output_type="atom", backbone="gtrans", num_attn_head=2, num_mt_block=1, cuda=False,
    features_only=False, features_size=0, features_dim=0, num_tasks=2, dataset_type="regression",
    ffn_num_task_specific_layers=0, ffn_task_specific_hidden_size=None,
)
OPTIM_CASES = {  # warmup_epochs 1.5 x 8 steps: warm-up ends mid-epoch (upstream truncates to int)
    "coff03": dict(init_lr=1e-4, max_lr=1e-3, final_lr=2e-5, warmup_epochs=1.5, epochs=3, train_data_size=70,
                   batch_size=8, world_size=1, fine_tune_coff=0.3, weight_decay=1e-2),
    "frozen_ws2": dict(init_lr=2e-4, max_lr=5e-4, final_lr=1e-4, warmup_epochs=1.0, epochs=3, train_data_size=70,
                       batch_size=8, world_size=2, fine_tune_coff=0.0, weight_decay=0.0),
}
OPTIM_STEPS = 5  # Adam steps taken with fixed gradients
GRAD_SCALE = 1e-2  # fixed gradients ~ N(0, GRAD_SCALE^2): comparable to weight decay x parameter, as in training


def fixed_gradient(step: int, name: str, shape) -> torch.Tensor:
    """The gradient of parameter ``name`` at optimizer step ``step`` (1-based): ``randn(shape) * GRAD_SCALE`` from a
    torch.Generator seeded with crc32 of ``"{step}:{name}"``. Tests regenerate it the same way."""

    generator = torch.Generator().manual_seed(zlib.crc32(f"{step}:{name}".encode()))
    return torch.randn(shape, generator=generator) * GRAD_SCALE


def receives_gradient(name: str, param) -> bool:
    """Trainable, and not one of the encoder's bond-output branches, which a finetune model never uses (upstream
    builds them anyway; they get no gradient in training, so Adam skips them)."""
    return param.requires_grad and "bond_from_" not in name


def optimizer_steps(case: dict) -> dict:
    """Every group's lr after the scheduler's construction and after each scheduler step up to 2 past the end of
    the schedule; parameters after OPTIM_STEPS steps in the train loop's order (gradients set, optimizer.step(),
    scheduler.step())."""
    from argparse import Namespace

    from kermt.util.loss import MTLLoss
    from kermt.util.utils import build_lr_scheduler, build_model, build_optimizer

    torch.manual_seed(0)
    model = build_model(Namespace(**OPTIM_MODEL))
    mtl = MTLLoss(OPTIM_MODEL["num_tasks"])
    params = {**dict(model.named_parameters()), "mtl_loss.log_sigma": mtl.log_sigma}
    out = {f"init::{name}": p.detach().numpy().copy() for name, p in params.items()}
    args = Namespace(**case)
    optimizer = build_optimizer(model, args)
    optimizer.param_groups[1]["params"].append(mtl.log_sigma)
    scheduler = build_lr_scheduler(optimizer, args, world_size=case["world_size"])
    lrs = [[group["lr"] for group in optimizer.param_groups]]
    for step in range(1, case["epochs"] * scheduler.steps_per_epoch + 3):
        if step <= OPTIM_STEPS:
            for name, param in params.items():
                param.grad = fixed_gradient(step, name, param.shape) if receives_gradient(name, param) else None
            optimizer.step()
        scheduler.step()
        lrs.append([group["lr"] for group in optimizer.param_groups])
        if step == OPTIM_STEPS:
            out.update({f"after::{name}": p.detach().numpy().copy() for name, p in params.items()})
    out["lr"] = np.array(lrs, dtype=np.float64)
    out["steps_per_epoch"] = np.int64(scheduler.steps_per_epoch)
    return out


def optimizer_oracle() -> dict:
    record = {"model_args": np.array(json.dumps(OPTIM_MODEL)), "optim_steps": np.int64(OPTIM_STEPS),
              "grad_scale": np.float64(GRAD_SCALE)}
    for name, case in OPTIM_CASES.items():
        record[f"{name}::settings"] = np.array(json.dumps(case))
        for key, value in optimizer_steps(case).items():
            record[key if key.startswith("init::") else f"{name}::{key}"] = value
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", type=Path, required=True)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        write_vocab_input()
        build_vocabs(opts.upstream.resolve(), Path(scratch))
        import_upstream(opts.upstream.resolve(), Path(scratch))
        smiles = fixture_smiles()
        record = {"smiles": np.array(smiles), "fg_labels": fg_labels(smiles)}
        vocabs = load_vocabs()
        for name, case in STEP_CASES.items():
            record.update(pretrain_step(name, case, smiles, record["fg_labels"], vocabs))
        np.savez_compressed(HERE / "pretrain_step.npz", **record)
        optim = optimizer_oracle()
        np.savez_compressed(HERE / "optim_step.npz", **optim)
    print(f"wrote {len(record)} arrays to pretrain_step.npz, {len(optim)} to optim_step.npz in {HERE}")


if __name__ == "__main__":
    main()
