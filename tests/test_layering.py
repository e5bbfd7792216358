"""The library layer stays Ray-free: ``import kermt`` (and its subpackages) must not load ray or ray_app."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

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
