"""The page for chemists in a real headless Chromium, against the package's running `kermt serve` (with its API
key): the table it renders holds what the JSON API returns, the drawings render, the CSV download is the table's
data. A screenshot is kept as test-artifacts/serve_page.png."""

from __future__ import annotations

import base64
import io
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


def test_the_page_predicts_typed_smiles_with_intervals_and_domain_and_downloads_the_table(page, served):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    driver, wait = page
    driver.find_element("id", "api-key-input").send_keys(API_KEY, Keys.TAB)  # the page asks for the key
    wait.until(lambda d: len(Select(d.find_element("id", "model-select")).options) == 2)
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
