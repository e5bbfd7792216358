"""Layers import one way: ``import kermt`` (and its subpackages) never loads ray or ray_app, and the ray_app
subpackages import each other only in the documented direction (docs/architecture.md#where-things-live)."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import kermt


def test_kermt_never_imports_ray():
    modules = [m.name for m in pkgutil.walk_packages(kermt.__path__, "kermt.")]
    assert len(modules) > 3
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'ray' or m.startswith(('ray.', 'ray_app')))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# Which ray_app subpackages each one may import (besides itself): tune -> finetune -> common, screening -> common,
# pretrain -> common (run ids: ray_app.common.run_ids), serve -> common (what a prediction outputs is
# kermt.inference.columns, shared with screening); report (reads a run's files, writes the page) -> common, and the
# commands that end a run write its report; explore -> finetune (each round's surrogate), screening (its prediction of
# the library). ray_app.cli sits on top of all of them.
ALLOWED = {
    "common": set(),
    "report": {"common"},
    "finetune": {"common", "report"},
    "tune": {"common", "finetune", "report"},
    "screening": {"common", "report"},
    "pretrain": {"common", "report"},
    "serve": {"common"},
    "explore": {"common", "finetune", "screening", "report"},
}


def _ray_app_imports(path: Path) -> set[str]:
    """Subpackages named by the ``ray_app.<sub>`` imports of a source file, lazy ones inside functions included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "ray_app" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_ray_app_subpackages_import_one_way():
    root = Path(__file__).resolve().parents[1] / "ray_app"
    packages = sorted(p.name for p in root.iterdir() if (p / "__init__.py").exists())
    assert set(packages) <= set(ALLOWED), f"new subpackage without a rule: {set(packages) - set(ALLOWED)}"
    wrong = {}
    for package in packages:
        for source in (root / package).rglob("*.py"):
            bad = _ray_app_imports(source) - ALLOWED[package] - {package}
            if bad:
                wrong[str(source.relative_to(root))] = sorted(bad)
    assert not wrong, wrong
