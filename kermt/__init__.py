"""KERMT: a pretrained graph transformer for molecular property prediction.

Pure PyTorch + RDKit. This package never imports ``ray``; the distributed application lives in ``ray_app``.
"""

from importlib import metadata as _metadata

DISTRIBUTION = "kermt-ray"  # the installed package (pyproject.toml's name), whose version this is

try:
    __version__ = _metadata.version(DISTRIBUTION)  # pyproject.toml's version, the one place it is spelled
except _metadata.PackageNotFoundError:  # a source tree that was never installed (pip install -e .)
    __version__ = "0+unknown"
