"""CPU-seconds to import the modules that every Ray process of a run loads, for two trees side by side.

Every Ray Train worker, Tune trial, Ray Data actor and Serve replica is a fresh Python process that imports the
app's modules before its first step, and a test suite or a short finetune starts dozens of them: on a 2-core
machine their imports are a visible share of the wall time. CPU time (user + system of the importing process), not
wall time, so the figure holds on a loaded machine; the minimum of ``--repeats`` fresh processes per module.

    python bench/import_cost.py --before /path/to/old/checkout             # this tree against another
    python bench/import_cost.py --before "$(git worktree add -f --detach /tmp/old HEAD~3 >/dev/null; echo /tmp/old)"
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

MODULES = (  # what each kind of process imports first
    "ray_app.finetune.train_loop",  # a Ray Train worker of a finetune
    "ray_app.finetune.trainable",  # a Tune trial (a finetune member, a tune trial)
    "kermt.inference",  # a prediction actor, a Serve replica
    "kermt.data.featurize",  # a featurising task
    "ray_app.cli",  # `kermt --help`
)
PROBE = ("import resource, sys; import {module}; r = resource.getrusage(resource.RUSAGE_SELF); "
         "print(r.ru_utime + r.ru_stime, 'descriptastorus' in sys.modules, 'sklearn' in sys.modules)")


def import_cost(tree: Path, module: str, repeats: int) -> tuple[float, bool, bool]:
    """(least CPU-seconds over ``repeats`` fresh interpreters, descriptastorus loaded, scikit-learn loaded)."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], cwd=tree, check=True,
                             capture_output=True, text=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
        seconds, descriptastorus, sklearn = out.stdout.split()
        runs.append((float(seconds), descriptastorus == "True", sklearn == "True"))
    return min(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the baseline checkout")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1], help="default: this tree")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'module':32} {'before CPU-s':>13} {'after CPU-s':>12}  "
          "loads descriptastorus / scikit-learn (before -> after)")
    for module in MODULES:
        before, after = (import_cost(tree, module, args.repeats) for tree in (args.before, args.after))
        print(f"{module:32} {before[0]:13.2f} {after[0]:12.2f}  {before[1]}/{before[2]} -> {after[1]}/{after[2]}")


if __name__ == "__main__":
    main()
