"""The plugin in-process, with inference-server's testing kit, as a model author tests it: the hooks alone, then a
multi-model app (SAGEMAKER_MULTI_MODEL=true) loading, invoking and unloading two models."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import multi_model
import numpy as np
import pytest

from inference_server import testing
from inference_server.errors import BadRequest

#: Rows sent to the models, and their scores by the models of conftest's MODELS.
ROWS = [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]
SCORES = {"fraud": [4.75, 0.25], "churn": [3.0, -3.0]}


def test_a_saved_model_loads_with_its_coefficients(models_dir: Path) -> None:
    """``save`` writes model.json; ``model_fn`` reads it back and scores rows as ``row . coef + intercept``."""
    model = multi_model.model_fn(str(models_dir / "fraud"))
    np.testing.assert_array_equal(model.coef, [0.5, -1.0, 2.0])
    assert model.intercept == 0.25
    np.testing.assert_allclose(multi_model.predict_fn(ROWS, model), SCORES["fraud"])


def test_a_missing_model_file_is_an_error_naming_it(tmp_path: Path) -> None:
    """A directory without model.json fails to load, saying which file is missing and where."""
    with pytest.raises(FileNotFoundError, match=re.escape(f"no model.json in {tmp_path}")):
        multi_model.model_fn(str(tmp_path))


@pytest.mark.parametrize(
    "text", ["{not json", "[]", '{"intercept": 1}', '{"coef": ["a"]}', '{"coef": []}', '{"coef": [[1, 2]]}']
)
def test_a_malformed_model_file_is_an_error_naming_it(tmp_path: Path, text: str) -> None:
    """model.json that is not ``{"coef": [numbers], "intercept": number}`` fails to load, naming the file."""
    (tmp_path / "model.json").write_text(text)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "model.json"))):
        multi_model.model_fn(str(tmp_path))


@pytest.mark.parametrize("data", [[[1.0, 2.0]], [1.0, 2.0, 3.0], [["a", "b", "c"]], {"rows": 1}])
def test_rows_of_the_wrong_shape_are_a_400_saying_what_the_model_expects(models_dir: Path, data: object) -> None:
    """Rows that are not this model's width, or not numbers, are the client's mistake."""
    model = multi_model.model_fn(str(models_dir / "fraud"))
    with pytest.raises(BadRequest, match=r"rows of numbers|each row must have 3 numbers"):
        multi_model.predict_fn(data, model)


def test_a_multi_model_app_loads_invokes_and_unloads_each_model(
    models_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Through SageMaker's /models API in-process: each model answers with its own coefficients; an unloaded model
    is 404 and model_unload_fn ran for it, while the other one still answers."""
    monkeypatch.setenv("SAGEMAKER_MULTI_MODEL", "true")
    monkeypatch.setenv("INFERENCE_SERVER_ALLOW_MODEL_DIRS", str(models_dir))
    client = testing.client()
    assert client.get("/ping").status_code == 200
    for name in SCORES:
        loaded = client.post("/models", json={"model_name": name, "url": str(models_dir / name)})
        assert loaded.status_code == 200, loaded.text
    for name, scores in SCORES.items():
        answer = client.post(f"/models/{name}/invoke", json=ROWS)
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json, scores)
    listed = client.get("/models").json
    assert [(model["modelName"], model["modelUrl"]) for model in listed["models"]] == [
        ("churn", str(models_dir / "churn")),
        ("fraud", str(models_dir / "fraud")),
    ]
    with caplog.at_level(logging.INFO, logger="multi_model"):
        assert client.delete("/models/fraud").status_code == 200
    assert f"Unloaded the linear model of {models_dir / 'fraud'}" in caplog.text
    assert client.post("/models/fraud/invoke", json=ROWS).status_code == 404
    assert client.get("/models/fraud").status_code == 404
    np.testing.assert_allclose(client.post("/models/churn/invoke", json=ROWS).json, SCORES["churn"])


def test_plugin_is_registered() -> None:
    """The entry point in pyproject.toml registers the module as a plugin."""
    assert testing.plugin_is_registered(multi_model)


def test_hooks_are_valid() -> None:
    """Every hook the package defines is a valid, registered implementation."""
    for hook in (multi_model.model_fn, multi_model.predict_fn, multi_model.model_unload_fn):
        assert testing.hookimpl_is_valid(hook), hook.__name__
