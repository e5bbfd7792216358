"""Environment that lets upstream KERMT's CLI run on a CPU-only machine without touching its code.

Used by bench/finetune.py and bench/predict.py.
"""

from __future__ import annotations

import os
from pathlib import Path


def upstream_env(upstream: Path, scratch: Path) -> dict:
    """os.environ + PYTHONPATH with upstream first and two stubs written under ``scratch``:

    * ``cuik_molmaker``: upstream imports this optional package at module import; it is not installable offline;
    * ``sitecustomize``: upstream calls ``torch.cuda.set_device`` even with ``--no_cuda``, which fails on CPU torch.
    """
    stub = scratch / "stub"
    (stub / "cuik_molmaker").mkdir(parents=True, exist_ok=True)
    no_op = "def __getattr__(name):\n    return lambda *args, **kwargs: None  # never called on this path\n"
    for module in ("__init__.py", "mol_features.py"):
        (stub / "cuik_molmaker" / module).write_text(no_op)
    (stub / "sitecustomize.py").write_text("import torch\ntorch.cuda.set_device = lambda *args, **kwargs: None\n")
    return dict(os.environ, PYTHONPATH=f"{upstream}{os.pathsep}{stub}")
