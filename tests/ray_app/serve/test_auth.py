"""`--api_key_env`: the API needs `Authorization: Bearer <key>` (401 otherwise) while /healthz and the page stay
open; `--host` beyond loopback without a key prints a one-line warning. Over real HTTP against the package's app."""

from __future__ import annotations

import httpx
import pytest

from kermt.errors import UserError
from ray_app.serve.command import main
from tests.ray_app.serve.conftest import API_KEY

PROTECTED = [("POST", "/predict"), ("POST", "/models/reg/predict"), ("GET", "/models")]


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-key", f"Basic {API_KEY}", f"Bearer {API_KEY}x",
                                           "Bearer"])
def test_the_api_without_the_key_is_401(served, authorization):
    headers = {} if authorization is None else {"authorization": authorization}
    for method, path in PROTECTED:
        response = httpx.request(method, served.url + path, json={"smiles": ["CCO"]}, headers=headers, timeout=60)
        assert response.status_code == 401, (path, response.text)
        assert response.headers["www-authenticate"] == "Bearer" and "--api_key_env" in response.json()["detail"]


def test_with_the_key_the_api_answers(served):
    headers = {"authorization": f"Bearer {API_KEY}"}
    response = httpx.post(served.url + "/predict", json={"smiles": ["CCO"]}, headers=headers, timeout=60)
    assert response.status_code == 200 and response.json()["predictions"][0]["valid"] is True
    assert httpx.get(served.url + "/models", headers={"authorization": f"bearer  {API_KEY}"}).status_code == 200


def test_healthz_and_the_page_stay_open(served):
    health = httpx.get(served.url + "/healthz", timeout=60)
    assert health.status_code == 200 and health.json()["auth"] is True
    page = httpx.get(served.url + "/", timeout=60)
    assert page.status_code == 200 and 'id="api-key-input"' in page.text and "__ROOT__" not in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    script = httpx.get(served.url + "/static/page.js", timeout=60)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert httpx.get(served.url + "/static/..%2Fapp.py", timeout=60).status_code == 404


def test_a_public_host_without_a_key_warns_in_one_line(tmp_path, capsys):
    missing = str(tmp_path / "no_model")
    with pytest.raises(UserError, match="no_model"):  # the warning comes first, before the models are read
        main(["--checkpoint_dir", missing, "--host", "0.0.0.0"])
    warning = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warning) == 1 and "--host 0.0.0.0" in warning[0] and "--api_key_env" in warning[0]
    with pytest.raises(UserError, match="no_model"):
        main(["--checkpoint_dir", missing])  # loopback: no warning
    assert "warning" not in capsys.readouterr().err


def test_an_unset_key_variable_is_named_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KERMT_NO_SUCH_KEY", raising=False)
    with pytest.raises(UserError, match="KERMT_NO_SUCH_KEY is unset or empty"):
        main(["--checkpoint_dir", str(tmp_path), "--host", "0.0.0.0", "--api_key_env", "KERMT_NO_SUCH_KEY"])
    assert "warning" not in capsys.readouterr().err
