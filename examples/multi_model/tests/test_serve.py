"""Real multi-model servers with the plugin: two workers serve every loaded model, list it, and unload it from each
worker; SAGEMAKER_MULTI_MODEL=true turns the mode on as SageMaker does."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

#: A row sent to the models, and its score by each model of conftest's MODELS.
ROW = [1.0, 2.0, 3.0]
SCORE = {"fraud": 4.75, "churn": 3.0}
#: Seconds within which every worker has dropped an unloaded model (it looks every 0.25 s).
UNLOAD_DEADLINE = 10.0


def test_two_workers_serve_each_model_list_it_and_unload_it_everywhere(
    serve: Callable[..., Any], models_dir: Path
) -> None:
    """``serve --multi-model --workers 2``: /ping 200 with no model; after two loads, 160 invocations over new
    connections (both workers) all get their model's score; GET /models lists both with what they cost each worker;
    after DELETE the model is 404 everywhere, model_unload_fn ran in every worker that held it, the other answers."""
    server = serve("--multi-model", "--workers", "2", "--allow-model-dir", str(models_dir))
    assert server.request("GET", "/ping").status == 200
    assert server.request("GET", "/models").json() == {"models": []}
    for name in SCORE:
        loaded = server.request("POST", "/models", {"model_name": name, "url": str(models_dir / name)})
        assert (loaded.status, loaded.json()) == (200, {"status": f"Model {name!r} loaded"})

    def invoke(i: int) -> tuple[str, int, Any]:
        name = "fraud" if i % 2 else "churn"
        reply = server.request("POST", f"/models/{name}/invoke", [ROW])
        return name, reply.status, reply.json()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(invoke, range(160), timeout=60))
    assert [(status, scores) for _, status, scores in answers] == [(200, [SCORE[name]]) for name, _, _ in answers]

    models = server.request("GET", "/models").json()["models"]
    assert [(model["modelName"], model["modelUrl"]) for model in models] == [
        ("churn", str(models_dir / "churn")),
        ("fraud", str(models_dir / "fraud")),
    ]
    holders = {int(pid) for pid in models[1]["privateBytesByWorker"]}
    assert 1 <= len(holders) <= 2
    for model in models:  # what each costs the machine: its workers' own memory (it maps no file)
        assert model["mappedBytes"] == 0
        assert model["memoryBytes"] == sum(model["privateBytesByWorker"].values())

    assert server.request("DELETE", "/models/fraud").json() == {"status": "Model 'fraud' unloaded"}
    for method, path, body in (("POST", "/models/fraud/invoke", [ROW]), ("GET", "/models/fraud", None)):
        assert server.request(method, path, body).status == 404, path
    assert server.request("DELETE", "/models/fraud").status == 404
    assert server.request("POST", "/models/churn/invoke", [ROW]).json() == [SCORE["churn"]]
    assert [model["modelName"] for model in server.request("GET", "/models").json()["models"]] == ["churn"]
    message = f"Unloaded the linear model of {models_dir / 'fraud'}"
    end = time.monotonic() + UNLOAD_DEADLINE
    while _logged_by(server.output(), message) != holders and time.monotonic() < end:
        time.sleep(0.1)
    assert _logged_by(server.output(), message) == holders, server.output()


def _logged_by(log: str, message: str) -> set[int]:
    """The pids that logged ``message`` (the log is JSON lines: its output is no terminal)."""
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return {line["pid"] for line in lines if line["message"] == message}


def test_sagemaker_multi_model_turns_the_mode_on_and_a_broken_model_is_not_loaded(
    serve: Callable[..., Any], models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SAGEMAKER_MULTI_MODEL=true (as SageMaker sets it) and no option, /models is served (loading from the
    directory INFERENCE_SERVER_ALLOW_MODEL_DIRS allows besides SageMaker's /opt/ml/models); a model whose
    model.json is broken answers 503 naming the file and is not registered; a missing directory is 404; rows of the
    wrong width are 400."""
    monkeypatch.setenv("SAGEMAKER_MULTI_MODEL", "true")
    monkeypatch.setenv("INFERENCE_SERVER_ALLOW_MODEL_DIRS", str(models_dir))
    server = serve("--workers", "1")
    broken = models_dir / "broken"
    broken.mkdir()
    (broken / "model.json").write_text("{not json")
    failed = server.request("POST", "/models", {"model_name": "broken", "url": str(broken)})
    assert failed.status == 503
    assert str(broken / "model.json") in failed.json()["message"]
    assert server.request("GET", "/models/broken").status == 404
    missing = server.request("POST", "/models", {"model_name": "gone", "url": str(models_dir / "gone")})
    assert missing.status == 404
    assert server.request("POST", "/models", {"model_name": "fraud", "url": str(models_dir / "fraud")}).status == 200
    assert server.request("POST", "/models/fraud/invoke", [ROW]).json() == [SCORE["fraud"]]
    wrong = server.request("POST", "/models/fraud/invoke", [[1.0, 2.0]])
    assert wrong.status == 400
    assert "each row must have 3 numbers" in wrong.json()["message"]
