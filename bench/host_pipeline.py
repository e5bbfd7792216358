"""What the host costs pretraining and screening: batches built in the step (before) against batches built ahead,
with their neighbour-sum operators, by a background thread (now: ``build_step_batch(..., operators=...)`` and
``kermt.data.prefetch``; ``kermt.inference.batches`` for prediction).

    .venv/bin/python bench/host_pipeline.py [--molecules 2000] [--batch-size 32] [--hidden 128] [--threads 1]
                                            [--device cpu|cuda]

One process, ``--threads`` torch threads (a Ray worker with one CPU has one), molecules from upstream's sample
split, the model on ``--device`` (scripts/gpu_check.sh runs it on CUDA at the release width). Printed side by
side, both ways in the same run:

* pretraining (vocab mode, the runner's loop: seed, build this step's batch, step): molecules/s when each batch is
  built inline without operators (the encoder then derives them from the index arrays in its forward) and when the
  batches come from ``prefetch`` with their operators; the host time of building one batch each way; the ops one
  step dispatches and its host synchronisations (``bench/dispatch_audit.py``; on CUDA with fused Adam).
* screening (``Ensemble.predict`` of a finetuned fixture member): molecules/s of the old loop (one batch at a time,
  collated inline without operators, read back before the next) and of ``Ensemble.predict`` (``run_batches``).

On a CPU the model's own time dominates at the release size; the smaller ``--hidden`` shows what the host work is
worth next to a fast device. A GPU step at the release size takes milliseconds, the host batch about as long, so
there the overlap decides the throughput.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.config import EncoderConfig
from kermt.data.corpus import corpus_rows
from kermt.data.featurize import featurize_smiles
from kermt.data.prefetch import prefetch
from kermt.data.sampling import epoch_order, global_batches
from kermt.inference import Ensemble, plan_features, read_members, scale_features, valid_batches
from dispatch_audit import DispatchAudit, optimizer_host_tensors
from kermt.nn.pretrain.config import PretrainHeadsConfig
from kermt.train.optim import build_optimizer
from kermt.nn.pretrain.model import KermtPretrainModel
from kermt.pretrain.batch import PretrainData, build_step_batch
from kermt.pretrain.step import PretrainStep, PretrainStepSettings

ROOT = Path(__file__).resolve().parents[1]
SMILES_CSV = ROOT / "tests/data/kermt_upstream_splits/train_val.csv"
MEMBER = ROOT / "tests/data/kermt_upstream/ckpt_ft_reg.pt"


def pretraining(data: PretrainData, opts: argparse.Namespace, ahead: bool) -> tuple[float, DispatchAudit]:
    """Molecules/s of one pass over the batches (the first two steps, warm-up, not timed), and the dispatched ops
    of one more step on the last batch."""
    atom_vocab, bond_vocab = opts.vocab_sizes
    heads = PretrainHeadsConfig(pretrain_mode="vocab", atom_vocab_size=atom_vocab, bond_vocab_size=bond_vocab)
    torch.manual_seed(0)
    model = KermtPretrainModel(EncoderConfig(hidden_size=opts.hidden, depth=3, num_attn_head=4), heads)
    model.to(opts.device)
    optimizer = build_optimizer(model, 1e-4, 0.0, 1.0)  # fused Adam on CUDA, as the runner's
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    trainer = PretrainStep(model, optimizer, scheduler, PretrainStepSettings(0, dropout_draws="per_molecule"))
    batches = global_batches(epoch_order(len(data), 0, 0), opts.batch_size)
    operators = model.encoder.aggregation_spec(training=True) if ahead else None
    built = (build_step_batch(data, rows, 0, 1, heads, 0, step, operators=operators)
             for step, rows in enumerate(batches))
    steps = prefetch(built, opts.device) if ahead else (batch.to(opts.device) for batch in built)
    started, timed = 0.0, 0
    for step, batch in enumerate(steps):
        if step == 2:
            synchronize(opts.device)
            started = time.perf_counter()
        timed += len(batches[step]) if step >= 2 else 0
        trainer.train(batch, step)
    synchronize(opts.device)
    rate = timed / (time.perf_counter() - started)
    with DispatchAudit(optimizer_host_tensors(optimizer)) as audit:
        trainer.train(batch, len(batches))
    return rate, audit


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def batch_build_ms(data: PretrainData, opts: argparse.Namespace, with_operators: bool) -> float:
    heads = PretrainHeadsConfig(pretrain_mode="vocab", atom_vocab_size=opts.vocab_sizes[0],
                                bond_vocab_size=opts.vocab_sizes[1])
    spec = KermtPretrainModel(EncoderConfig(hidden_size=8, depth=3, num_attn_head=2), heads).encoder \
        .aggregation_spec(training=True) if with_operators else None
    batches = global_batches(epoch_order(len(data), 0, 0), opts.batch_size)[:20]
    started = time.perf_counter()
    for step, rows in enumerate(batches):
        build_step_batch(data, rows, 0, 1, heads, 0, step, operators=spec)
    return 1e3 * (time.perf_counter() - started) / len(batches)


def screening(opts: argparse.Namespace, smiles: list[str]) -> tuple[float, float, float]:
    """Molecules/s of the old inline loop and of Ensemble.predict, and their largest difference."""
    members = read_members([MEMBER])
    ensemble = Ensemble(members, opts.device)
    molecules = featurize_smiles(smiles, plan_features([m.spec for m in members]).generator)
    model, spec = ensemble.models[0], ensemble.specs[0]
    started = time.perf_counter()
    inline = np.full((len(molecules), len(ensemble.task_names)), np.nan)
    with torch.no_grad():
        for rows, part in valid_batches(molecules, opts.batch_size):
            features = scale_features(spec, part.features if part.features.shape[1] else None)
            features = None if features is None else features.to(opts.device)
            graph = part.batch_graph().to(opts.device)
            inline[rows] = model(graph, features).prediction.double().cpu().numpy()
    inline_rate = len(molecules) / (time.perf_counter() - started)
    started = time.perf_counter()
    predicted = ensemble.predict(molecules, opts.batch_size).mean
    pipelined_rate = len(molecules) / (time.perf_counter() - started)
    scaler = spec.data_scaler
    inline = scaler.inverse_transform(inline) if scaler is not None else inline
    return inline_rate, pipelined_rate, float(np.nanmax(np.abs(inline - predicted)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--molecules", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    smiles = pd.read_csv(SMILES_CSV)["smiles"].tolist()[: opts.molecules]
    atom_vocab, bond_vocab = ContextVocab.build(smiles, "atom"), ContextVocab.build(smiles, "bond")
    data = PretrainData.of(corpus_rows(smiles, atom_vocab, bond_vocab, SmilesVocab.build(smiles)))
    opts.vocab_sizes = (len(atom_vocab), len(bond_vocab))
    print(f"{len(smiles)} molecules, batch {opts.batch_size}, hidden {opts.hidden}, {opts.threads} torch thread(s), "
          f"{opts.device}")
    plain, with_ops = batch_build_ms(data, opts, False), batch_build_ms(data, opts, True)
    print(f"pretraining batch on the host: {plain:.1f} ms without operators, {with_ops:.1f} ms with them")
    (before, inline_audit), (after, ahead_audit) = pretraining(data, opts, False), pretraining(data, opts, True)
    print(f"pretraining (vocab): inline {before:.0f} mol/s | prefetched with operators {after:.0f} mol/s "
          f"({after / before:.2f}x)")
    for name, audit in (("inline", inline_audit), ("prefetched", ahead_audit)):
        print(f"  one {name} step: {audit.op_count} dispatched ops ({audit.kernel_count} not views), "
              f"{audit.sync_count} host synchronisations {dict(audit.syncs) or ''}")
    inline, pipelined, distance = screening(opts, smiles)
    print(f"screening (ckpt_ft_reg.pt): inline {inline:.0f} mol/s | run_batches {pipelined:.0f} mol/s "
          f"({pipelined / inline:.2f}x); max |difference| {distance:.1e}")


if __name__ == "__main__":
    main()
