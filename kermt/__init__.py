"""KERMT: a pretrained graph transformer for molecular property prediction.

Pure PyTorch + RDKit. This package never imports ``ray``; the distributed application lives in ``ray_app``.
"""

__version__ = "0.1.0"
