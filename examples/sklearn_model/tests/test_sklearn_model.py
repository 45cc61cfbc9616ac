"""The scikit-learn plugin in-process, with inference-server's testing kit, as a model author tests it."""

from pathlib import Path

import joblib
import numpy as np
import orjson
import sklearn_model

import inference_server
from inference_server import testing

#: A setosa and a virginica from the iris data, as rows of four measurements (cm).
ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]


def _expected(model_dir: Path) -> np.ndarray:
    return joblib.load(model_dir / "model.joblib").predict_proba(np.array(ROWS))


def test_csv_rows_get_their_probabilities_as_csv(model_dir: Path) -> None:
    """CSV in, one line of class probabilities per row out, as CSV (the request's own type)."""
    response = testing.post_invocations(
        model_dir=str(model_dir), data="5.1,3.5,1.4,0.2\n6.7,3.0,5.2,2.3\n", content_type="text/csv"
    )
    assert (response.status_code, response.content_type) == (200, "text/csv")
    probabilities = np.loadtxt(response.text.splitlines(), delimiter=",", ndmin=2)
    np.testing.assert_allclose(probabilities, _expected(model_dir))
    assert probabilities.argmax(axis=1).tolist() == [0, 2]


def test_json_rows_get_their_probabilities_as_json(model_dir: Path) -> None:
    """JSON rows in, a JSON list of probability rows out."""
    response = testing.post_invocations(model_dir=str(model_dir), json=ROWS)
    assert (response.status_code, response.content_type) == (200, "application/json")
    np.testing.assert_allclose(response.json, _expected(model_dir))


def test_accept_chooses_the_answer_format(model_dir: Path) -> None:
    """CSV in, JSON out when Accept asks for JSON."""
    response = testing.post_invocations(
        model_dir=str(model_dir),
        data="5.1,3.5,1.4,0.2",
        content_type="text/csv",
        headers={"Accept": "application/json"},
    )
    assert (response.status_code, response.content_type) == (200, "application/json")
    np.testing.assert_allclose(response.json, _expected(model_dir)[:1])


def test_rows_of_the_wrong_width_are_a_400(model_dir: Path) -> None:
    """Rows without the model's four numbers are the client's mistake, and the answer says what was expected."""
    response = testing.post_invocations(model_dir=str(model_dir), json=[[5.1, 3.5, 1.4]])
    assert response.status_code == 400
    assert "each row must have 4 numbers" in response.json["message"]


def test_a_missing_model_file_is_a_503_naming_it(tmp_path: Path) -> None:
    """Without model.joblib the model fails to load: /ping and /invocations answer 503, naming the file."""
    response = testing.post_invocations(model_dir=str(tmp_path), json=ROWS)
    assert response.status_code == 503
    message = orjson.loads(response.data)["message"]
    assert f"no model.joblib in {tmp_path}" in message
    assert testing.client(model_dir=str(tmp_path)).get("/ping").status_code == 503


def test_batching_hook_turns_micro_batching_on(model_dir: Path) -> None:
    """The batching hook's values are the app's, with no option or variable set."""
    options = inference_server.create_app(model_dir=str(model_dir)).batching
    assert (options.max_batch_size, options.max_batch_delay) == (32, 0.005)


def test_plugin_is_registered() -> None:
    """The entry point in pyproject.toml registers the module as a plugin."""
    assert testing.plugin_is_registered(sklearn_model)


def test_hooks_are_valid() -> None:
    """Every hook the package defines is a valid, registered implementation."""
    for hook in (sklearn_model.model_fn, sklearn_model.predict_fn, sklearn_model.batching):
        assert testing.hookimpl_is_valid(hook)
