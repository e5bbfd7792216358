"""The page for chemists in a real headless Chromium, against the package's running `kermt serve` (with its API
key): the table it renders holds what the JSON API returns, the drawings render, the CSV download is the table's
data, the "About this model" panel shows GET /models' record of the picked model, the attributions toggle colours
the drawings with a legend. Screenshots are kept as test-artifacts/serve_page.png and serve_page_attributions.png."""

from __future__ import annotations

import io
import json
import urllib.parse

import pandas as pd
import pytest

from tests.browser import console_errors, headless_chromium, keep_screenshot, rendered_images, requires_browser
from tests.ray_app.serve.conftest import API_KEY

pytestmark = requires_browser

TYPED = ["c1ccccc1O phenol", "CC(C)(C)(C)(C)C", "CC(=O)Oc1ccccc1C(=O)O aspirin"]  # the second: a 5-valent carbon
SMILES = [line.split()[0] for line in TYPED]
NAMES = ["phenol", "", "aspirin"]
WAIT_S = 120


@pytest.fixture(scope="module")
def page(served):
    from selenium.webdriver.support.ui import WebDriverWait

    with headless_chromium() as driver:
        driver.get(served.url + "/")
        WebDriverWait(driver, WAIT_S).until(lambda d: d.find_element("id", "auth-box").is_displayed())
        yield driver, WebDriverWait(driver, WAIT_S)


def _cells(driver) -> list[dict]:
    return driver.execute_script("""
        return [...document.querySelectorAll('#results-table tbody tr')].map((tr) => ({
          cls: tr.className,
          smiles: tr.querySelector('td.smiles').textContent,
          name: (tr.querySelector('td.name') || {}).textContent || '',
          status: tr.querySelector('td.status').textContent,
          img: (tr.querySelector('td.molecule img') || {}).src || null,
          values: [...tr.querySelectorAll('td[data-column]')].map((td) => [td.dataset.column, td.textContent]),
        }));""")  # pairs, not an object: the driver would hand the keys back sorted


def _enter_key(driver, wait) -> None:
    """Type the API key the page asks for (once per browser session) and wait for both models in the list."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    if len(Select(driver.find_element("id", "model-select")).options) < 2:
        driver.find_element("id", "api-key-input").send_keys(API_KEY, Keys.TAB)
    wait.until(lambda d: len(Select(d.find_element("id", "model-select")).options) == 2)


def _about(driver) -> dict:
    """The "About this model" panel: each value's key -> [its text, its hover title, its child elements]."""
    return {key: [text, title, children] for key, text, title, children in driver.execute_script("""
        return [...document.querySelectorAll('#about-list dd')].map((dd) =>
          [dd.dataset.key, dd.textContent, dd.title, dd.children.length]);""")}


def test_the_page_predicts_typed_smiles_with_intervals_and_domain_and_downloads_the_table(page, served):
    from selenium.webdriver.support.ui import Select

    driver, wait = page
    _enter_key(driver, wait)
    Select(driver.find_element("id", "model-select")).select_by_value("reg")
    wait.until(lambda d: d.find_element("id", "interval-box").is_displayed())  # reg is calibrated
    driver.find_element("id", "uncertainty-input").click()
    driver.find_element("id", "interval-enabled").click()
    driver.find_element("id", "domain-input").click()  # reg has an applicability domain
    driver.find_element("id", "smiles-input").send_keys("\n".join(TYPED))
    driver.find_element("id", "submit-button").click()
    wait.until(lambda d: len(_cells(d)) == 3)

    api = served.client.post("/models/reg/predict", json={"smiles": SMILES, "uncertainty": True,
                                                          "interval": 0.9, "domain": True}).json()["predictions"]
    rows = [{**row, "values": dict(row["values"])} for row in _cells(driver)]
    assert [r["smiles"] for r in rows] == SMILES and [r["name"] for r in rows] == NAMES
    columns = [f"{t}{s}" for t in ("t1", "t2") for s in ("", "_std", "_lower", "_upper")]
    columns += ["domain_distance", "in_domain"]
    for row, expected in zip(rows, api):
        assert list(row["values"]) == columns
        for column in columns:
            if column == "in_domain":
                assert row["values"][column] == {True: "yes", False: "no", None: ""}[expected[column]]
            elif expected[column] is None:
                assert row["values"][column] == ""
            else:  # the table shows 4 significant digits
                assert float(row["values"][column]) == pytest.approx(expected[column], rel=6e-4)
    assert rows[1]["cls"] == "invalid" and not rows[1]["img"]
    assert "valence" in rows[1]["status"] and rows[1]["status"] == api[1]["error"]
    svgs = [urllib.parse.unquote(r["img"].split(",", 1)[1]) for r in (rows[0], rows[2])]
    assert all(s.startswith("<svg") and "<path" in s for s in svgs)
    drawn = [i for i in rendered_images(driver) if i["kind"] == "img"]
    assert len(drawn) == 2 and all(i["complete"] and i["natural"] > 0 and i["width"] > 100 for i in drawn)

    driver.find_element("id", "download-button").click()
    csv_text = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch(document.getElementById('download-link').href).then((r) => r.text()).then(done);""")
    table = pd.read_csv(io.StringIO(csv_text), keep_default_na=False, na_values=[""])
    assert list(table.columns) == ["name", "smiles", *columns, "valid", "error"]
    assert table["smiles"].tolist() == SMILES and table["valid"].tolist() == [True, False, True]
    for column in columns:  # the CSV keeps the full values: equal to the API's
        assert table[column].tolist()[0::2] == [api[0][column], api[2][column]]
    assert table["error"].fillna("").tolist() == ["", api[1]["error"], ""]
    assert console_errors(driver) == []
    assert keep_screenshot(driver, "serve_page").stat().st_size > 10_000


def test_a_classifier_shows_its_calibrated_probabilities_and_prediction_sets(page, served):
    from selenium.webdriver.support.ui import Select

    driver, wait = page
    _enter_key(driver, wait)
    Select(driver.find_element("id", "model-select")).select_by_value("cls")
    wait.until(lambda d: d.find_element("id", "interval-box").is_displayed())  # cls is calibrated too
    assert driver.find_element("id", "interval-label").text == "prediction set"
    if not driver.find_element("id", "interval-enabled").is_selected():
        driver.find_element("id", "interval-enabled").click()
    typed = driver.find_element("id", "smiles-input")
    typed.clear()
    typed.send_keys("\n".join(TYPED))
    driver.find_element("id", "submit-button").click()
    wait.until(lambda d: d.find_element("id", "summary").text.startswith("Model cls"))

    api = served.client.post("/predict", json={"smiles": SMILES, "interval": 0.9}).json()["predictions"]
    rows = [dict(row["values"]) for row in _cells(driver)]
    for row, expected in zip(rows, api):
        for task in ("c1", "c2"):
            assert row[f"{task}_set"] == (expected[f"{task}_set"] or "")  # "0", "1", "0,1" as sent
            if expected[f"{task}_calibrated"] is not None:
                assert float(row[f"{task}_calibrated"]) == pytest.approx(expected[f"{task}_calibrated"], rel=6e-4)
    assert api[0]["c1_set"] in ("0", "1", "0,1", "") and api[1]["c1_set"] is None
    assert console_errors(driver) == []


def _scores(text: str) -> dict:  # "t1 0.3, t2 n/a" -> {"t1": 0.3, "t2": None}
    return {task: None if value == "n/a" else float(value) for task, value in (p.split(" ") for p in text.split(", "))}


def test_the_about_panel_shows_get_models_record_of_the_picked_model(page, served):
    from selenium.webdriver.support.ui import Select

    driver, wait = page
    _enter_key(driver, wait)
    models = {m["name"]: m for m in served.client.get("/models").json()["models"]}
    select = Select(driver.find_element("id", "model-select"))
    select.select_by_value("cls")  # a run directory without run.json: no training record
    wait.until(lambda d: d.find_element("id", "about-title").text == "About this model: cls")
    cls, about = models["cls"], _about(driver)
    assert cls["training"] is None and cls["calibrated"] and not cls["domain"] and not cls["features_generator"]
    assert {key: value[0] for key, value in about.items()} == {
        "dataset_type": "classification", "tasks": "c1, c2", "members": "2", "features": "none",
        "training": "no training record (a single checkpoint, or a run directory without run.json)",
        "calibration": "platt, fitted on 30 molecules per task", "domain": "no"}
    assert about["domain"][1] == cls["domain_missing"] and "domain.json" in about["domain"][1]  # why not, on hover

    select.select_by_value("reg")  # a finetune run: its run.json's scores, calibration and domain
    wait.until(lambda d: d.find_element("id", "about-title").text == "About this model: reg")
    reg, about = models["reg"], _about(driver)
    training, text = reg["training"], {key: value[0] for key, value in about.items()}
    assert list(text) == ["dataset_type", "tasks", "members", "features", "test_score", "task_test_scores",
                          "split", "run_id", "calibration", "domain"]
    assert (text["dataset_type"], text["tasks"], text["members"]) == (reg["dataset_type"], "t1, t2", "2")
    assert (reg["features_generator"], reg["features_scaling"]) == (["rdkit_2d_normalized"], False)
    assert text["features"] == "rdkit_2d_normalized, not scaled"
    metric, score, plus_minus, std, over, folds, fold_word = text["test_score"].split(" ")
    assert (metric, plus_minus, over, fold_word) == (training["metric"], "±", "over", "fold")
    assert metric == "rmse"
    assert (float(score), float(std), int(folds)) == (training["overall_test_score"], training["overall_test_std"],
                                                      len(training["fold_test_scores"])) == (0.25, 0.0, 1)
    shown = _scores(text["task_test_scores"])
    assert shown == pytest.approx(training["task_test_scores"], rel=6e-4)  # 4 significant digits
    assert shown == pytest.approx({"t1": 0.3, "t2": 0.3})
    assert (text["split"], text["run_id"]) == (training["split"], training["run_id"])
    assert text["split"] == "given files: val /data/val.csv, test /data/test.csv; data_path: all for training"
    assert text["calibration"] == "normalised, fitted on validation molecules: t1 30, t2 30"
    assert (training["calibration_method"], training["calibration_size"]) == ("normalised", {"t1": 30, "t2": 30})
    assert text["domain"] == "yes" and reg["domain"]
    assert all(children == 0 for _, _, children in about.values())  # text only: nothing from the API became markup
    assert console_errors(driver) == []


def test_a_csv_file_fills_the_list(page, tmp_path):
    driver, wait = page
    path = tmp_path / "molecules.csv"
    path.write_text('name,smiles,other\n"ethanol, dry",CCO,1\nbenzene,c1ccccc1,2\n')
    driver.find_element("id", "smiles-input").clear()
    driver.find_element("id", "csv-input").send_keys(str(path))
    wait.until(lambda d: d.find_element("id", "smiles-input").get_property("value"))
    assert driver.find_element("id", "smiles-input").get_property("value") == "CCO ethanol, dry\nc1ccccc1 benzene"
    assert "Read 2 molecule(s)" in driver.find_element("id", "message").text
    assert console_errors(driver) == []


def test_the_attributions_toggle_colours_each_drawn_molecule_with_a_legend(page, served):
    from selenium.webdriver.support.ui import Select

    driver, wait = page
    _enter_key(driver, wait)
    Select(driver.find_element("id", "model-select")).select_by_value("reg")
    toggle = driver.find_element("id", "attributions-input")
    if not toggle.is_selected():
        toggle.click()
    typed = driver.find_element("id", "smiles-input")
    typed.clear()
    typed.send_keys("\n".join(TYPED))
    driver.find_element("id", "submit-button").click()
    wait.until(lambda d: d.find_element("id", "legend-box").is_displayed())
    wait.until(lambda d: d.find_element("id", "summary").text.startswith("Model reg"))

    api = served.client.post("/models/reg/predict", json={"smiles": SMILES, "attributions": True,
                                                          "depict": True}).json()["predictions"]
    drawn = driver.execute_script("""return [...document.querySelectorAll('#results-table tbody tr')].map((tr) => {
        const img = tr.querySelector('td.molecule img');
        return img ? [img.dataset.coloured, decodeURIComponent(img.src.split(',')[1]), img.title] : null;});""")
    assert drawn[1] is None  # the invalid SMILES: nothing to colour
    for row, expected in zip((drawn[0], drawn[2]), (api[0], api[2])):
        assert row[:2] == ["t1", expected["attribution_svg"]["t1"]]  # the first task's coloured drawing
        assert row[2].startswith(f"t1 {expected['t1']:.4g} = baseline ") and "+ descriptors" in row[2]
    legend = driver.find_element("id", "legend-box").text
    assert "red: the atom raises the predicted t1" in legend and "blue: it lowers it" in legend
    assert "relative to the molecule's largest" in legend
    shown = dict(_cells(driver)[0]["values"])  # the table shows the baseline and descriptor share, not the lists
    assert shown["t1_baseline"] == f"{api[0]['t1_baseline']:.4g}" and "t1_descriptors" in shown
    assert "t1_atoms" not in shown
    assert keep_screenshot(driver, "serve_page_attributions").stat().st_size > 10_000

    Select(driver.find_element("id", "attribution-task")).select_by_value("t2")  # the legend picks the task
    wait.until(lambda d: "predicted t2" in d.find_element("id", "legend-box").text)
    coloured = driver.execute_script(
        "return [...document.querySelectorAll('td.molecule img')].map((img) => img.dataset.coloured);")
    assert coloured == ["t2", "t2"]
    driver.find_element("id", "download-button").click()
    csv_text = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch(document.getElementById('download-link').href).then((r) => r.text()).then(done);""")
    table = pd.read_csv(io.StringIO(csv_text), keep_default_na=False, na_values=[""])
    assert [json.loads(cell) for cell in table["t2_atoms"][0::2]] == [api[0]["t2_atoms"], api[2]["t2_atoms"]]
    toggle.click()  # off again, for the other tests of the module
    assert console_errors(driver) == []
