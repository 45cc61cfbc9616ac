"""The AWS-style inference.py, unmodified: trained by itself, served with the scikit-learn container's defaults,
called with boto3 as a SageMaker endpoint is."""

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import joblib
import pytest

from inference_server import testing

#: A setosa and a virginica: rows of four measurements (cm).
CSV = b"5.1,3.5,1.4,0.2\n6.7,3.0,5.2,2.3"
JSON = b"[[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]"


def _runtime(url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """boto3's SageMaker Runtime client, unmodified, pointed at ``url`` by the environment with dummy credentials."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", url)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    }.items():
        monkeypatch.setenv(name, value)
    return boto3.client("sagemaker-runtime")


def _invoke(runtime: Any, body: bytes, content_type: str, **accept: str) -> tuple[str, bytes]:
    response = runtime.invoke_endpoint(EndpointName="iris", Body=body, ContentType=content_type, **accept)
    return response["ContentType"], response["Body"].read()


def test_served_by_script_option_and_called_with_boto3(
    serve: Callable[..., Any], script: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--script with --script-defaults sklearn: CSV and JSON rows get the species, written as the container writes
    them (json.dumps; JSON whatever the request's type unless Accept asks for CSV)."""
    server = serve("--model-dir", str(model_dir), "--script", str(script), "--script-defaults", "sklearn")
    runtime = _runtime(server.url, monkeypatch)
    assert _invoke(runtime, CSV, "text/csv") == ("application/json", b'["setosa", "virginica"]')
    assert _invoke(runtime, JSON, "application/json") == ("application/json", b'["setosa", "virginica"]')
    assert _invoke(runtime, JSON, "application/json", Accept="text/csv") == ("text/csv", b"setosa\nvirginica\n")


def test_found_by_sagemaker_program_in_the_model_code_directory(
    serve: Callable[..., Any], script: Path, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model directory laid out as SageMaker unpacks model.tar.gz (code/inference.py) is served with
    SAGEMAKER_PROGRAM, the script unmodified."""
    unpacked = tmp_path / "model"
    (unpacked / "code").mkdir(parents=True)
    shutil.copy(model_dir / "model.joblib", unpacked)
    shutil.copy(script, unpacked / "code")
    server = serve(
        "--model-dir", str(unpacked), "--script-defaults", "sklearn", env={"SAGEMAKER_PROGRAM": "inference.py"}
    )
    runtime = _runtime(server.url, monkeypatch)
    assert _invoke(runtime, CSV, "text/csv") == ("application/json", b'["setosa", "virginica"]')
    assert f"script:{unpacked / 'code' / 'inference.py'}" in server.output()


def test_served_in_process_by_the_testing_kit(script: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """INFERENCE_SERVER_SCRIPT and INFERENCE_SERVER_SCRIPT_DEFAULTS serve the script in-process too."""
    monkeypatch.setenv("INFERENCE_SERVER_SCRIPT", str(script))
    monkeypatch.setenv("INFERENCE_SERVER_SCRIPT_DEFAULTS", "sklearn")
    response = testing.post_invocations(model_dir=str(model_dir), data=CSV, content_type="text/csv")
    assert (response.status_code, response.content_type, response.data) == (
        200,
        "application/json",
        b'["setosa", "virginica"]',
    )
    response = testing.post_invocations(model_dir=str(model_dir), data=b"setosa?", content_type="text/plain")
    assert response.status_code == 415
    assert "text/plain" in response.json["message"]
    assert "scikit-learn" in response.json["message"]


def test_the_script_trains_as_a_training_job_runs_it(train: Callable[..., Any], tmp_path: Path) -> None:
    """Run as a script with SM_MODEL_DIR set (as a SageMaker training job sets it), it saves model.joblib there."""
    done = train(env={"SM_MODEL_DIR": str(tmp_path / "sm-model")})
    assert done.returncode == 0, done.stderr
    model = joblib.load(tmp_path / "sm-model" / "model.joblib")
    assert list(model.classes_) == ["setosa", "versicolor", "virginica"]
