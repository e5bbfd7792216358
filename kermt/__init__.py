"""KERMT: a pretrained graph transformer for molecular property prediction.

Pure PyTorch + RDKit. This package never imports ``ray``; the distributed application lives in ``ray_app``.
``kermt.load_run(path)`` loads a trained run for predictions in this process (:mod:`kermt.inference.trained_run`).
"""

from importlib import metadata as _metadata

DISTRIBUTION = "kermt-ray"  # the installed package (pyproject.toml's name), whose version this is

try:
    __version__ = _metadata.version(DISTRIBUTION)  # pyproject.toml's version, the one place it is spelled
except _metadata.PackageNotFoundError:  # a source tree that was never installed (pip install -e .)
    __version__ = "0+unknown"


def __getattr__(name: str):
    # load_run imports torch and RDKit: only when it is asked for, so `import kermt` (and `kermt --help`) stays quick
    if name == "load_run":
        from kermt.inference.trained_run import load_run

        return load_run
    raise AttributeError(f"module 'kermt' has no attribute {name!r}")


__all__ = ["DISTRIBUTION", "__version__", "load_run"]
