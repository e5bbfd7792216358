"""The report of a `kermt predict` (screening) output: the library's size and invalid rows by reason, the
distribution of each predicted property, the top molecules by each (for a classification: the highest
probabilities), and the std / interval / applicability-domain columns summarised when the run wrote them.

Built from the output file alone, streamed in bounded memory (:mod:`ray_app.report.library`): a report of a
10-million-row screen costs two reads of its prediction columns, never the library in memory."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


from ray_app.report import figures
from kermt.inference.columns import ATOMS_SUFFIX
from ray_app.report.attributions import colour_molecules, explain, read_off_rows, timing_note
from ray_app.report.library import BATCH_ROWS, LibraryStats, library_stats
from ray_app.report.molecules import molecule_uri
from ray_app.report.page import Figure, Molecule, Report, Section, Table, fmt


def guessed_dataset_type(stats: LibraryStats) -> str:
    """The file does not say: every task's predictions within [0, 1] read as a classification's probabilities."""
    ranges = [stats.moments[t] for t in stats.layout.tasks]
    inside = all(m.count and m.low >= 0 and m.high <= 1 for m in ranges)
    return "classification" if ranges and inside else "regression"


def predict_report(path: Path, dataset_type: str | None = None, tasks: Sequence[str] | None = None,
                   model: str | None = None, trust_checkpoint: bool = False) -> Report:
    """``dataset_type`` and ``tasks``: the model's, when the caller knows them (the run does); else read off the
    file. ``model``: the one that predicted the file (what ``kermt.load_run`` takes), which explains the top
    molecules' drawings; None: they are drawn plain."""
    stats = library_stats(path, tasks)
    known = dataset_type is not None
    dataset_type = dataset_type or guessed_dataset_type(stats)
    sections = [_library_section(path, stats, dataset_type, known), _invalid_section(stats)]
    spread = _spread_section(stats)
    if spread is not None:
        sections.append(spread)
    per_task = [_task_section(stats, task, dataset_type) for task in stats.layout.tasks]
    _colour_top(per_task, stats, path, model, trust_checkpoint, dataset_type == "classification", sections[0].notes)
    sections += per_task
    return Report(f"kermt predict report: {path.name}", str(path), sections)


def _library_section(path: Path, stats: LibraryStats, dataset_type: str, known: bool) -> Section:
    layout = stats.layout
    extras = [name for name, present in (("members' std", layout.std), ("interval", layout.lower),
                                         ("applicability domain", layout.distance)) if present]
    rows = [["file", str(path)], ["rows", fmt(stats.rows)], ["valid molecules", fmt(stats.valid)],
            ["invalid rows", fmt(stats.rows - stats.valid)], ["tasks", ", ".join(layout.tasks) or "none found"],
            ["dataset type", dataset_type + ("" if known else " (read off the values: a guess)")],
            ["uncertainty columns", ", ".join(extras) or "none (kermt predict --uncertainty / --interval / "
                                                         "--applicability_domain add them)"]]
    note = (f"read in batches of at most {BATCH_ROWS:,} rows, the shown columns only, twice (counts, ranges and top "
            f"molecules; then exact histograms): {stats.seconds:.3g} s")
    return Section("Library", notes=[note], tables=[Table(["", "value"], rows)])


def _invalid_section(stats: LibraryStats) -> Section:
    invalid = stats.rows - stats.valid
    if not invalid:
        return Section("Invalid rows", notes=["every row is a valid molecule"])
    rows = [[reason, fmt(count), f"{count / stats.rows:.2%}", "; ".join(stats.examples.get(reason, []))]
            for reason, count in stats.reasons.most_common()]
    return Section("Invalid rows", notes=[f"{invalid} row(s) the model did not score (the output's valid = false; "
                                          "their reason is its error column)"],
                   tables=[Table(["reason", "rows", "share", "first examples"], rows)])


def _spread_section(stats: LibraryStats) -> Section | None:
    layout = stats.layout
    if not (layout.std or layout.lower or layout.distance):
        return None
    section = Section("Uncertainty and applicability domain")
    rows = []
    for task in layout.tasks:
        std = stats.moments[layout.std[task]] if task in layout.std else None
        width = stats.widths.get(task)
        rows.append([task, fmt(std.mean if std else None), fmt(std.high if std else None),
                     fmt(width.mean if width else None), fmt(width.high if width else None)])
    section.tables.append(Table(["task", "mean std", "largest std", "mean interval width", "widest interval"], rows,
                                caption="per task, over the valid molecules"))
    if layout.distance:
        inside, judged = stats.in_domain
        distance = stats.moments[layout.distance]
        section.notes.append(f"in the applicability domain: {inside} of {judged} valid molecules "
                             f"({inside / judged:.1%}); domain_distance mean {fmt(distance.mean)}, "
                             f"range {fmt(distance.low)} to {fmt(distance.high)}" if judged else
                             "in_domain not recorded")
        edges, counts = stats.histograms[layout.distance]
        section.figures.append(Figure("domain_distance over the library (in_domain: at most the model's threshold)",
                                      figures.binned(edges, counts, "domain_distance", "applicability domain")))
    return section


def _task_section(stats: LibraryStats, task: str, dataset_type: str) -> Section:
    moments = stats.moments[task]
    what = "predicted probability" if dataset_type == "classification" else "predicted"
    section = Section(f"Task {task}", tables=[Table(["molecules", "mean", "std", "min", "max"], [[
        fmt(moments.count), fmt(moments.mean), fmt(moments.std), fmt(moments.low), fmt(moments.high)]])])
    if not moments.count:
        section.notes.append(f"no valid molecule has a prediction of {task}")
        return section
    edges, counts = stats.histograms[task]
    section.figures.append(Figure(f"{task}: {what} over the library ({moments.count} molecules)",
                                  figures.binned(edges, counts, f"{what} {task}", f"{task} distribution")))
    section.molecules = [_molecule(row, task, stats) for row in stats.top_rows(task)]
    section.molecules_title = f"The {len(section.molecules)} molecules with the highest {what} {task}"
    return section


def _colour_top(sections: list[Section], stats: LibraryStats, path: Path, model: str | None,
                trust_checkpoint: bool, classification: bool, notes: list[str]) -> None:
    """Colour each task's top molecules by their attribution to it: read off the file when it holds them (kermt
    predict --attributions; the top rows were kept whole), else every task's in one call of ``model``."""
    layout = stats.layout
    top = {task: [str(row[layout.smiles]) for row in stats.top_rows(task)] for task in layout.tasks}
    drawn = len({s for smiles in top.values() for s in smiles})
    if layout.attributions:
        model = str(path)
        rows = {str(row[layout.smiles]): row for task in layout.tasks for row in stats.top_rows(task)}
        found = read_off_rows(model, rows, layout.tasks, layout.smiles)
        named = ", ".join(c for c in layout.attributions if c.endswith(ATOMS_SUFFIX))
        notes.append(f"atom attributions of the {drawn} drawn molecule(s) read from this file's {named} "
                     "(not computed again)")
    else:
        found = explain({model: [s for smiles in top.values() for s in smiles]} if model else {}, trust_checkpoint)
        if model and drawn:
            notes.append(timing_note(found, drawn, [model]))
    for section, (task, smiles) in zip(sections, top.items()):
        if smiles:
            colour_molecules(section, task, [found.get(model, s, task) for s in smiles], classification)


def _molecule(row: dict, task: str, stats: LibraryStats) -> Molecule:
    layout = stats.layout
    smiles = str(row[layout.smiles])
    lines = [f"{task} = {fmt(row[task])}"]
    if task in layout.std:
        lines.append(f"std {fmt(row[layout.std[task]])}")
    if task in layout.lower and task in layout.upper:
        lines.append(f"interval [{fmt(row[layout.lower[task]])}, {fmt(row[layout.upper[task]])}]")
    if layout.distance:
        verdict = {True: "in domain", False: "out of domain"}.get(row.get(layout.in_domain), "domain not recorded")
        lines.append(f"{verdict} (distance {fmt(row[layout.distance])})")
    return Molecule(smiles, molecule_uri(smiles), lines)


__all__ = ["guessed_dataset_type", "predict_report"]
