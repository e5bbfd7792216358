"""The report page: a small model of what it shows (sections of notes, tables, figures and molecules) rendered by
one Jinja2 template (``templates/report.html.j2``, package data) into a single self-contained HTML file."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from ray_app.common.outputs import atomic_write_text

NOT_RECORDED = "not recorded"
TEMPLATE = "report.html.j2"


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Figure:
    caption: str
    uri: str  # a data: URI (PNG from matplotlib, SVG from RDKit): the page needs no network


@dataclass
class Molecule:
    smiles: str
    uri: str | None  # None: RDKit could not draw it
    lines: list[str]


@dataclass
class Legend:
    """What the colours of a section's molecule drawings mean: a colour bar and the words for it."""

    text: str
    uri: str  # the colour bar, a PNG data: URI


@dataclass
class Section:
    title: str
    notes: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    molecules: list[Molecule] = field(default_factory=list)
    molecules_title: str = "Molecules"
    legend: Legend | None = None  # shown above the molecules when their drawings are coloured
    subsections: list["Section"] = field(default_factory=list)

    def image_count(self) -> int:
        """How many images the page shows for this section (the browser test counts the rendered ones)."""
        return len(self.figures) + sum(m.uri is not None for m in self.molecules) + (self.legend is not None) + \
            sum(s.image_count() for s in self.subsections)


@dataclass
class Report:
    title: str
    source: str  # the directory or file it was built from
    sections: list[Section]

    def image_count(self) -> int:
        return sum(s.image_count() for s in self.sections)


def fmt(value, digits: int = 4) -> str:
    """A number for a table cell; missing values say so."""
    if value is None:
        return NOT_RECORDED
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.{digits}g}"
    return str(value)


def render(report: Report) -> str:
    environment = jinja2.Environment(loader=jinja2.PackageLoader("ray_app.report", "templates"),
                                     autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True,
                                     lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return environment.get_template(TEMPLATE).render(report=report, created=created)


def write_page(report: Report, path: Path) -> Path:
    atomic_write_text(path, render(report))
    return path


__all__ = ["Figure", "Legend", "Molecule", "NOT_RECORDED", "Report", "Section", "Table", "fmt", "render", "write_page"]
