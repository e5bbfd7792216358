"""The documentation site builds with ``mkdocs build --strict`` (mkdocs.yml; the ``docs`` extra, part of ``test``):
every page in the nav exists, every relative link and anchor inside docs/ resolves. The README's links into docs/
resolve too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[docs]')")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(warnings or [result.stderr[-2000:]])
    assert (tmp_path / "site" / "cli" / "index.html").exists()


def test_readme_links_into_docs_resolve():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert links, "the README links into docs/"
    for path, anchor in links:
        target = ROOT / path
        assert target.is_file(), f"README.md links to {path}, which does not exist"
        if anchor:
            headings = [_slug(h) for h in re.findall(r"^#+ (.+)$", target.read_text(), re.MULTILINE)]
            assert anchor in headings, f"README.md links to {path}#{anchor}: no such heading there"


def _slug(heading: str) -> str:
    """The anchor MkDocs' toc extension gives a heading (its default slugify)."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[\s-]+", "-", text).strip("-")


def test_readme_is_a_short_guide():
    size = (ROOT / "README.md").stat().st_size
    assert size <= 10_500, f"README.md is {size} bytes: keep it a one-or-two-screen guide, move detail into docs/"
