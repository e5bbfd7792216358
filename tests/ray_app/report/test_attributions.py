"""The reports colour their drawn molecules by attribution, from a real model in this process (no Ray): the eval
report's worst-predicted molecules are the file's largest errors, each atom's disc has the sign of its attribution
(read back from the SVG), the legend names the task and the scale; the predict report colours its top-ranked
molecules; a model that cannot explain leaves plain drawings and says why."""

from __future__ import annotations

import base64
import html
import json
import re

import numpy as np
import pandas as pd
import pytest

import kermt
from ray_app.common import outputs
from ray_app.report.attributions import NO_MODEL, UNCOLOURED_SHARE
from ray_app.report.evaluation import eval_report
from ray_app.report.page import Section
from ray_app.report.predict import predict_report
from ray_app.report.results import read_test_result
from tests.conftest import FIXTURE_DIR
from tests.ray_app.screening.engines import main_eval, main_predict

REGRESSION = FIXTURE_DIR / "ckpt_ft_reg.pt"  # tasks t1, t2; rdkit_2d_normalized descriptors
CLASSIFICATION = FIXTURE_DIR / "ckpt_ft_cls.pt"  # tasks c1, c2; no descriptors
WORST = 8


def scored_file(tmp_path, checkpoint, labels: str):
    """A file in kermt eval's layout: the model's predictions of the fixture molecules it reads, and their labels."""
    frame = pd.read_csv(FIXTURE_DIR / labels)
    run = kermt.load_run(checkpoint)
    predicted = run.predict(list(frame.smiles))
    keep = predicted.valid.to_numpy()
    path = tmp_path / "scored.csv"
    path.write_text(outputs.test_result_csv(list(frame.smiles[keep]), run.tasks,
                                            predicted.loc[keep, list(run.tasks)].to_numpy(),
                                            frame.loc[keep, list(run.tasks)].to_numpy(dtype=float)))
    return path, run


def disc_colours(uri: str) -> dict[int, tuple[int, int, int]]:
    """Atom index -> the RGB of the disc RDKit drew behind it, read off the SVG."""
    svg = base64.b64decode(uri.split(",", 1)[1]).decode()
    return {int(atom): tuple(int(colour[i:i + 2], 16) for i in (0, 2, 4))
            for atom, colour in re.findall(r"<ellipse [^>]*class='atom-(\d+)'[^>]*fill:#([0-9A-F]{6})", svg)}


def assert_coloured_by_sign(section: Section, run, task: str) -> None:
    """Every drawn molecule's discs: red where its attribution is positive, blue where negative, none under the
    uncoloured share of the section's scale (the largest |value| drawn), as load_run computes them afresh."""
    frame = run.predict([m.smiles for m in section.molecules], attributions=True)
    atoms = [np.array(json.loads(cell)) for cell in frame[f"{task}_atoms"]]
    scale = max(np.abs(a).max() for a in atoms)
    assert f"full colour is {scale:.3g} " in section.legend.text
    for molecule, values in zip(section.molecules, atoms):
        discs = disc_colours(molecule.uri)
        assert set(discs) == {i for i, v in enumerate(values) if abs(v) >= UNCOLOURED_SHARE * scale}, molecule.smiles
        for i, (red, _, blue) in discs.items():
            assert (red > blue) == (values[i] > 0), (molecule.smiles, i, values[i], discs[i])
        assert any(v > 0 for v in values) or any(v < 0 for v in values)


@pytest.mark.parametrize("checkpoint, labels, kind", [(REGRESSION, "smiles.csv", "regression"),
                                                      (CLASSIFICATION, "smiles_cls.csv", "classification")])
def test_eval_report_colours_the_worst_predicted_molecules(tmp_path, checkpoint, labels, kind):
    path, run = scored_file(tmp_path, checkpoint, labels)
    report = eval_report(path, kind, str(checkpoint))
    result = read_test_result(path)
    assert any("atom attributions of the" in note for note in report.sections[0].notes)
    for t, task in enumerate(run.tasks):
        section = report.sections[1 + t]
        labelled = ~np.isnan(result.targets[:, t])
        error = np.abs(result.preds[labelled, t] - result.targets[labelled, t])
        smiles = np.array(result.smiles)[labelled]
        worst = [smiles[i] for i in np.argsort(-error, kind="stable")[:WORST]]
        assert [m.smiles for m in section.molecules] == worst
        assert_coloured_by_sign(section, run, task)
        what = f"the logit (log-odds) of {task}" if kind == "classification" else f"the predicted {task}"
        assert section.legend.text.startswith(f"Atom colours: each atom's share of {what}, red where the atom "
                                              "raises the prediction, blue where it lowers it, white near 0")
        assert section.legend.uri.startswith("data:image/png;base64,")
        if kind == "regression":  # the line's sum is the prediction in the file, to the quadrature's error
            for molecule in section.molecules:
                terms = re.findall(r"-?\d+\.?\d*(?:e[+-]?\d+)?", molecule.lines[-1])
                baseline, total, predicted = float(terms[0]), float(terms[-1]), float(molecule.lines[1].split()[1])
                assert sum(float(x) for x in terms[1:-1]) + baseline == pytest.approx(total, abs=0.002)
                assert abs(total - predicted) <= 0.01 + 0.2 * abs(predicted - baseline), molecule.lines


def test_eval_report_reads_the_attributions_eval_wrote_beside_the_file(tmp_path):
    """kermt eval --attributions writes <stem>_attributions.csv (kermt predict --attributions' columns): the report
    colours by those numbers, with no model (here the file holds load_run's, which are predict's)."""
    path, run = scored_file(tmp_path, REGRESSION, "smiles.csv")
    smiles = list(pd.read_csv(FIXTURE_DIR / "smiles.csv").smiles)
    recorded = run.predict(smiles, attributions=True)
    recorded.to_csv(tmp_path / "scored_attributions.csv", index=False)
    report = eval_report(path, "regression")
    drawn = len({m.smiles for section in report.sections[1:] for m in section.molecules})  # worst of either task
    assert any(note.startswith(f"atom attributions of the {drawn} drawn molecule(s) read from "
                               "scored_attributions.csv") for note in report.sections[0].notes)
    for t, task in enumerate(run.tasks):
        assert_coloured_by_sign(report.sections[1 + t], run, task)
    recorded[recorded.smiles != report.sections[1].molecules[0].smiles].to_csv(tmp_path / "scored_attributions.csv",
                                                                               index=False)
    section = eval_report(path, "regression").sections[1]
    assert disc_colours(section.molecules[0].uri) == {} and disc_colours(section.molecules[1].uri) != {}
    assert "t1: no attributions: scored_attributions.csv has no row of the molecule" in section.notes


def test_predict_report_colours_the_top_ranked_molecules(tmp_path):
    smiles = list(pd.read_csv(FIXTURE_DIR / "smiles.csv").smiles)
    run = kermt.load_run(REGRESSION)
    path = tmp_path / "screen.csv"
    run.predict(smiles).to_csv(path, index=False)  # the columns kermt predict writes
    report = predict_report(path, "regression", run.tasks, str(REGRESSION))
    frame = pd.read_csv(path)
    for task in run.tasks:
        section = next(s for s in report.sections if s.title == f"Task {task}")
        top = list(frame[frame.valid].sort_values(task, ascending=False, kind="stable").smiles[:12])
        assert [m.smiles for m in section.molecules] == top
        assert_coloured_by_sign(section, run, task)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_predict_report_reads_the_attributions_the_file_holds(tmp_path, suffix):
    """A file of kermt predict --attributions: the top molecules are coloured by its <task>_atoms cells, never
    computed again (the model given does not exist, and the edited cell's colours are drawn)."""
    smiles = list(pd.read_csv(FIXTURE_DIR / "smiles.csv").smiles)
    run = kermt.load_run(REGRESSION)
    frame = run.predict(smiles, attributions=True)
    top = frame[frame.valid].sort_values("t1", ascending=False, kind="stable").index[0]
    fresh = np.array(json.loads(frame.at[top, "t1_atoms"]))
    frame.at[top, "t1_atoms"] = json.dumps((-fresh).tolist())  # every atom's sign flipped
    path = tmp_path / f"screen{suffix}"
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path, index=False)
    report = predict_report(path, "regression", run.tasks, str(tmp_path / "no_such_model"))
    assert any(note.startswith("atom attributions of the ") and note.endswith(
        "read from this file's t1_atoms, t2_atoms (not computed again)") for note in report.sections[0].notes)
    section = next(s for s in report.sections if s.title == "Task t1")
    assert section.molecules[0].smiles == frame.at[top, "smiles"] and section.legend is not None
    discs = disc_colours(section.molecules[0].uri)
    assert discs and all((red > blue) == (fresh[i] < 0) for i, (red, _, blue) in discs.items())
    assert_coloured_by_sign(next(s for s in report.sections if s.title == "Task t2"), run, "t2")


def test_a_model_that_cannot_explain_leaves_plain_drawings_and_says_why(tmp_path):
    path, _ = scored_file(tmp_path, REGRESSION, "smiles.csv")
    gone = tmp_path / "deleted_run"
    report = eval_report(path, "regression", str(gone))
    plain = eval_report(path, "regression")
    for section, without in zip(report.sections[1:], plain.sections[1:]):
        assert section.legend is None and without.legend is None
        assert all(disc_colours(m.uri) == {} for m in section.molecules)
        assert f"{section.title[5:]}: attributions not drawn: UserError: {gone} does not exist" in section.notes[-1]
        assert without.notes[-1] == f"{section.title[5:]}: {NO_MODEL}"


def test_kermt_eval_and_predict_with_attributions_write_coloured_reports(tmp_path, capsys):
    """The commands themselves (in this process): eval --attributions' report reads <stem>_attributions.csv; predict's
    report explains its top molecules with the model it was given."""
    data, model = str(FIXTURE_DIR / "smiles.csv"), str(REGRESSION)
    assert main_eval(["--data_path", data, "--output_path", str(tmp_path / "scored.csv"), "--checkpoint_path", model,
                      "--attributions"]) == 0
    assert main_predict(["--data_path", data, "--output_path", str(tmp_path / "screen.csv"), "--checkpoint_path",
                         model]) == 0
    scored, screen = (html.unescape((tmp_path / name).read_text()) for name in ("scored_report.html",
                                                                                 "screen_report.html"))
    assert "drawn molecule(s) read from scored_attributions.csv" in scored
    assert "drawn molecule(s) computed for this report" in screen
    for page in (scored, screen):
        assert page.count("Atom colours: each atom's share of the predicted t") == 2  # t1 and t2
