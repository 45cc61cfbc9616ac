"""inference.py scripts written for AWS's framework containers, served unmodified and called with boto3."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import joblib
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from tests.conftest import ServerFactory, free_port, save_bert_classifier

#: The scikit-learn container's example, as AWS writes it: a joblib model, CSV parsed by input_fn.
SKLEARN = """
    import json
    import os
    from io import StringIO

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        if request_content_type == "text/csv":
            assert isinstance(request_body, str), type(request_body)
            return np.loadtxt(StringIO(request_body), delimiter=",", ndmin=2)
        if request_content_type == "application/json":
            return np.array(json.loads(request_body)["instances"])
        raise ValueError("unsupported content type " + request_content_type)


    def predict_fn(input_data, model):
        return model.predict_proba(input_data)


    def output_fn(prediction, content_type):
        return json.dumps({"probabilities": prediction.round(6).tolist(), "accept": content_type})
"""

#: PyTorch-container style: every function takes the context; output_fn returns (body, content_type).
WITH_CONTEXT = """
    import json


    class UnprocessableEntity(Exception):
        # the toolkit's error classes carry status_code, message and phrase
        def __init__(self, message):
            self.status_code, self.message, self.phrase = 422, message, message
            super().__init__(message)


    def model_fn(model_dir, context):
        return {"dir": context.system_properties["model_dir"], "scale": 10}


    def input_fn(input_data, content_type, context):
        data = json.loads(input_data)
        if "values" not in data:
            raise UnprocessableEntity("the body must have 'values'")
        return data["values"], context.get_request_header(0, "Content-Type")


    def predict_fn(data, model, context):
        values, content_type = data
        return {"scaled": [v * model["scale"] for v in values], "seen_type": content_type, "dir": model["dir"]}


    def output_fn(prediction, accept, context):
        return json.dumps(prediction), "application/vnd.example+json"
"""

TRANSFORM = """
    def model_fn(model_dir):
        return str.upper


    def transform_fn(model, request_body, content_type, accept):
        kind = type(request_body).__name__
        return f"{model(request_body if isinstance(request_body, str) else request_body.decode())} ({kind})", accept
"""


def _model_dir(tmp_path: Path, script: str, name: str = "inference.py") -> Path:
    """A model directory with ``script`` as code/``name`` and a trained logistic regression as model.joblib."""
    model_dir = tmp_path / "model"
    (model_dir / "code").mkdir(parents=True)
    (model_dir / "code" / name).write_text(textwrap.dedent(script))
    features = np.array([[0.0, 0.0], [0.1, 0.2], [5.0, 5.0], [5.2, 4.9]])
    joblib.dump(LogisticRegression().fit(features, [0, 0, 1, 1]), model_dir / "model.joblib")
    return model_dir


def _runtime(port: int) -> Any:
    """A boto3 SageMaker Runtime client for the local server."""
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _invoke(port: int, body: bytes, content_type: str, accept: str | None = None) -> tuple[str, bytes]:
    args = {"Accept": accept} if accept else {}
    response = _runtime(port).invoke_endpoint(EndpointName="toolkit", Body=body, ContentType=content_type, **args)
    return response["ContentType"], response["Body"].read()


def test_a_scikit_learn_script_with_a_joblib_model(servers: ServerFactory, tmp_path: Path) -> None:
    """SAGEMAKER_PROGRAM in MODEL_DIR/code: CSV and JSON reach input_fn as text, output_fn's str goes out as
    Accept (application/json when the client accepts anything)."""
    model_dir = _model_dir(tmp_path, SKLEARN)
    server = servers.start("--model-dir", str(model_dir), plugins=[], env={"SAGEMAKER_PROGRAM": "inference.py"})
    content_type, body = _invoke(server.port, b"0,0.1\n5,5", "text/csv")
    answer = json.loads(body)
    assert content_type == "application/json"
    assert answer["accept"] == "application/json"
    probabilities = np.array(answer["probabilities"])
    assert probabilities.shape == (2, 2)
    assert probabilities[0, 0] > 0.5
    assert probabilities[1, 1] > 0.5
    content_type, body = _invoke(server.port, b'{"instances": [[5, 5]]}', "application/json", "text/plain")
    assert (content_type, json.loads(body)["accept"]) == ("text/plain", "text/plain")
    assert "script:" in server.output()


def test_a_script_that_takes_the_context(servers: ServerFactory, tmp_path: Path) -> None:
    """Functions with a context argument get one (system_properties, request headers); (body, type) is kept."""
    model_dir = _model_dir(tmp_path, WITH_CONTEXT)
    server = servers.start("--model-dir", str(model_dir), plugins=[], env={"SAGEMAKER_PROGRAM": "inference"})
    content_type, body = _invoke(server.port, b'{"values": [1, 2.5]}', "application/json")
    assert content_type == "application/vnd.example+json"
    assert json.loads(body) == {"scaled": [10, 25.0], "seen_type": "application/json", "dir": str(model_dir)}


def test_a_toolkit_error_answers_its_own_status(servers: ServerFactory, tmp_path: Path) -> None:
    """An exception with status_code (the toolkit's error classes) is answered with that status and message."""
    model_dir = _model_dir(tmp_path, WITH_CONTEXT)
    server = servers.start("--model-dir", str(model_dir), plugins=[], env={"SAGEMAKER_PROGRAM": "inference.py"})
    reply = server.request("POST", "/invocations", b"{}", {"Content-Type": "application/json"})
    assert (reply.status, reply.json()["message"]) == (422, "the body must have 'values'")
    with pytest.raises(botocore.exceptions.ClientError, match="422"):
        _invoke(server.port, b"{}", "application/json")
    assert server.request("GET", "/ping").status == 200


def test_a_transform_fn_script_found_by_script_option(servers: ServerFactory, tmp_path: Path) -> None:
    """--script PATH with transform_fn: JSON arrives as str, other bodies as bytes; the answer goes out as Accept."""
    script = tmp_path / "elsewhere" / "serve_me.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(TRANSFORM))
    server = servers.start("--script", str(script), plugins=[])
    assert _invoke(server.port, b'"fair isle"', "application/json", "text/plain") == (
        "text/plain",
        b'"FAIR ISLE" (str)',
    )
    answer = _invoke(server.port, b"viking", "application/octet-stream", "text/plain")
    assert answer == ("text/plain", b"VIKING (bytes)")


def test_the_submit_directory_is_searched_when_local(servers: ServerFactory, tmp_path: Path) -> None:
    """SAGEMAKER_PROGRAM not in MODEL_DIR/code is looked for in a local SAGEMAKER_SUBMIT_DIRECTORY."""
    submit = tmp_path / "submit"
    submit.mkdir()
    (submit / "entry.py").write_text(textwrap.dedent(TRANSFORM))
    env = {"SAGEMAKER_PROGRAM": "entry.py", "SAGEMAKER_SUBMIT_DIRECTORY": str(submit)}
    server = servers.start("--model-dir", str(tmp_path / "empty"), plugins=[], env=env)
    assert _invoke(server.port, b"x", "text/plain", "text/plain") == ("text/plain", b"X (bytes)")


def _serve_fails(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run serve expecting it to refuse to start; return its stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "INFERENCE_SERVER_PLUGINS": "", **(env or {})},
        check=False,
    )
    assert done.returncode == 1, done.stderr
    return done.stderr


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (textwrap.dedent(TRANSFORM) + "\ndef input_fn(data, content_type):\n    return data\n", "cannot be used with"),
        ("def predict_fn(data, model):\n    return data\n", "defines no model_fn"),
        ("def model_fn(model_dir, context, extra):\n    return 1\n", "model_fn takes 3 arguments"),
        ("import no_such_module_here\n", "failed to import: ModuleNotFoundError"),
    ],
)
def test_a_script_that_cannot_be_served_stops_start_up(tmp_path: Path, script: str, message: str) -> None:
    """A script breaking the toolkit's contract stops serve with one line saying what is wrong."""
    path = tmp_path / "inference.py"
    path.write_text(textwrap.dedent(script))
    assert message in _serve_fails(tmp_path, "--script", str(path))


def test_a_missing_program_is_named(tmp_path: Path) -> None:
    """SAGEMAKER_PROGRAM naming a file that is nowhere stops start-up, saying where it looked."""
    stderr = _serve_fails(tmp_path, "--model-dir", str(tmp_path), env={"SAGEMAKER_PROGRAM": "absent.py"})
    assert f"no absent.py in {tmp_path}/code" in stderr


def test_requirements_are_installed_only_when_asked(tmp_path: Path, servers: ServerFactory) -> None:
    """--install-requirements runs pip on code/requirements.txt: a failure stops start-up with pip's reason;
    without the option the file is left alone."""
    model_dir = _model_dir(tmp_path, TRANSFORM)
    (model_dir / "code" / "requirements.txt").write_text("inference-server-no-such-package-anywhere==0.0.1\n")
    env = {"SAGEMAKER_PROGRAM": "inference.py"}
    stderr = _serve_fails(tmp_path, "--model-dir", str(model_dir), "--install-requirements", env=env)
    assert "requirements.txt failed (pip exit status 1)" in stderr
    assert "inference-server-no-such-package-anywhere" in stderr
    server = servers.start("--model-dir", str(model_dir), plugins=[], env=env)
    assert server.request("GET", "/ping").status == 200


MODEL_ONLY = """
    import os

    import joblib


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))
"""


def test_missing_functions_fall_back_to_the_scikit_learn_defaults(servers: ServerFactory, tmp_path: Path) -> None:
    """--script-defaults sklearn: a script with only model_fn answers as the scikit-learn container's defaults do
    (JSON and CSV as float32 arrays, model.predict, json.dumps or np.savetxt answers, 415 and 406 beyond them)."""
    model_dir = _model_dir(tmp_path, MODEL_ONLY)
    env = {"SAGEMAKER_PROGRAM": "inference.py"}
    server = servers.start("--model-dir", str(model_dir), "--script-defaults", "sklearn", plugins=[], env=env)
    assert _invoke(server.port, b"[[0, 0.1], [5, 5]]", "application/json") == ("application/json", b"[0, 1]")
    assert _invoke(server.port, b"0,0.1\n5,5", "text/csv", "text/csv") == ("text/csv", b"0\n1\n")
    npy_body = io.BytesIO()
    np.save(npy_body, np.array([[5.0, 5.0]]))
    content_type, body = _invoke(server.port, npy_body.getvalue(), "application/x-npy", "application/x-npy")
    assert (content_type, np.load(io.BytesIO(body)).tolist()) == ("application/x-npy", [1])
    reply = server.request("POST", "/invocations", b"x", {"Content-Type": "text/plain"})
    assert (reply.status, "not supported by the scikit-learn defaults" in reply.json()["message"]) == (415, True)
    headers = {"Content-Type": "application/json", "Accept": "image/png"}
    assert server.request("POST", "/invocations", b"[[1, 1]]", headers).status == 406
    for body, content_type in [(b"[[1, 2], [3]]", "application/json"), (b"{bad", "application/json"),
                               (b"[" * 100_000, "application/json"), (b"1,2\n3", "text/csv"),
                               (b'["a", "b"]', "application/json"), (b'{"a": 1}', "application/json")]:  # fmt: skip
        reply = server.request("POST", "/invocations", body, {"Content-Type": content_type})
        assert (reply.status, "is not an array of numbers" in reply.json()["message"]) == (400, True), body[:20]
    assert server.request("GET", "/ping").status == 200


def test_missing_functions_are_ours_by_default(servers: ServerFactory, tmp_path: Path) -> None:
    """Without --script-defaults a script with only model_fn is served by the built-in hooks (codecs, predict)."""
    model_dir = _model_dir(tmp_path, MODEL_ONLY)
    server = servers.start("--model-dir", str(model_dir), plugins=[], env={"SAGEMAKER_PROGRAM": "inference.py"})
    assert _invoke(server.port, b"[[0, 0.1], [5, 5]]", "application/json") == ("application/json", b"[0,1]")


XGBOOST_MODEL_ONLY = """
    import os

    import xgboost


    def model_fn(model_dir):
        booster = xgboost.Booster()
        booster.load_model(os.path.join(model_dir, "xgboost-model.json"))
        return booster
"""


def _xgboost_model_dir(tmp_path: Path) -> tuple[Path, Any]:
    """A model directory with XGBOOST_MODEL_ONLY as its script and a small trained booster; and the booster."""
    import xgboost

    model_dir = _model_dir(tmp_path, XGBOOST_MODEL_ONLY)
    features = np.array([[0.0, 0.0], [0.1, 0.2], [5.0, 5.0], [5.2, 4.9]])
    train = xgboost.DMatrix(features, label=[0, 0, 1, 1])
    booster = xgboost.train({"objective": "binary:logistic", "max_depth": 2}, train, num_boost_round=3)
    booster.save_model(model_dir / "xgboost-model.json")
    return model_dir, booster


def test_missing_functions_fall_back_to_the_xgboost_defaults(servers: ServerFactory, tmp_path: Path) -> None:
    """--script-defaults xgboost: CSV, LibSVM and RecordIO-protobuf bodies become a DMatrix for Booster.predict, and
    all three give the same scores as XGBoost in-process."""
    import scipy.sparse
    import xgboost
    from sagemaker.amazon.common import write_spmatrix_to_sparse_tensor

    from inference_server.client import RecordSerializer

    model_dir, booster = _xgboost_model_dir(tmp_path)
    expected = booster.predict(xgboost.DMatrix(np.array([[0.0, 0.1], [5.0, 5.0]]))).tolist()
    zeros = booster.predict(xgboost.DMatrix(np.zeros((1, 2)))).tolist()
    env = {"SAGEMAKER_PROGRAM": "inference.py"}
    server = servers.start("--model-dir", str(model_dir), "--script-defaults", "xgboost", plugins=[], env=env)
    records = RecordSerializer().serialize(np.array([[0.0, 0.1], [5.0, 5.0]])).getvalue()
    sparse = io.BytesIO()  # the SDK's own writer of sparse records (keys and shape)
    write_spmatrix_to_sparse_tensor(sparse, scipy.sparse.csr_matrix(np.array([[0.0, 0.1], [5.0, 5.0], [0, 0]])))
    bodies = [
        (b"0,0.1\n5,5", "text/csv", expected),
        (b"0 0:0 1:0.1\n1 0:5 1:5\n", "text/libsvm", expected),
        (records, "application/x-recordio-protobuf", expected),
        (sparse.getvalue(), "application/x-recordio-protobuf", expected + zeros),  # its third row is all zeros
    ]
    for body, content_type, scores in bodies:
        answer_type, answer = _invoke(server.port, body, content_type, "application/json")
        assert answer_type == "application/json"
        assert np.allclose(json.loads(answer), scores), content_type
    reply = server.request("POST", "/invocations", b"[[1, 2]]", {"Content-Type": "application/json"})
    assert (reply.status, "not supported by the XGBoost defaults" in reply.json()["message"]) == (415, True)
    reply = server.request("POST", "/invocations", b"1,2\n3", {"Content-Type": "text/csv"})
    assert reply.status == 400
    for body in (b"0 x:y:z\n", b"1 -5:1", b"1 2:abc", b"1 99999999999999999999:1", b"0 1", b"\xff\xfe"):
        reply = server.request("POST", "/invocations", body, {"Content-Type": "text/libsvm"})
        assert (reply.status, "LibSVM" in reply.json()["message"]) == (400, True), body
    reply = server.request(
        "POST", "/invocations", b"\x0a\x23\xd7\xce\x08\x00", {"Content-Type": "application/x-recordio-protobuf"}
    )
    assert reply.status == 400
    assert server.request("GET", "/ping").status == 200


def test_a_script_runs_batch_transform_and_is_listed_as_a_plugin(tmp_path: Path) -> None:
    """inference-server transform serves the same script (SAGEMAKER_PROGRAM), and inference-server plugins lists it."""
    model_dir = _model_dir(tmp_path, TRANSFORM)
    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "words.txt").write_bytes(b"north utsire")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "INFERENCE_SERVER_PLUGINS": "",
        "SAGEMAKER_PROGRAM": "inference.py",
    }
    command = [sys.executable, "-m", "inference_server"]
    args = ["transform", str(inputs), str(outputs), "--model-dir", str(model_dir), "--accept", "text/plain", "--quiet"]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert (outputs / "words.txt.out").read_bytes() == b"NORTH UTSIRE (bytes)"
    env["INFERENCE_SERVER_MODEL_DIR"] = str(model_dir)
    listed = subprocess.run([*command, "plugins"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert f"plugin script:{model_dir / 'code' / 'inference.py'}" in listed.stdout
    assert "hook transform_fn" not in listed.stdout
    script = model_dir / "code" / "inference.py"
    assert f"hook model_fn: script:{script} (the script's), then built-in" in listed.stdout
    assert f"hook predict_fn: script:{script} (the script's transform_fn), then built-in" in listed.stdout


CONTEXT_WITHOUT_INPUT_FN = """
    def model_fn(model_dir):
        return None


    def predict_fn(data, model, context):
        return {"type": context.get_request_header(0, "Content-Type"), "data": data}
"""


def test_a_context_reaches_predict_fn_when_input_fn_is_ours(servers: ServerFactory, tmp_path: Path) -> None:
    """A script whose predict_fn takes the context but has no input_fn: the built-in input_fn decodes, and each
    request's context is its own (never the previous request's on the same thread)."""
    model_dir = _model_dir(tmp_path, CONTEXT_WITHOUT_INPUT_FN)
    server = servers.start("--model-dir", str(model_dir), plugins=[], env={"SAGEMAKER_PROGRAM": "inference.py"})
    for body, content_type, data in [
        (b'{"a": 1}', "application/json", {"a": 1}),
        (b"[2]", "application/json; x=1", [2]),
    ]:
        reply = server.request(
            "POST", "/invocations", body, {"Content-Type": content_type, "Accept": "application/json"}
        )
        assert (reply.status, reply.json()) == (200, {"type": content_type, "data": data})


def test_hostile_sparse_records_are_a_400(servers: ServerFactory, tmp_path: Path) -> None:
    """A sparse RecordIO-protobuf record whose key or declared width is absurd is refused, never allocated."""
    from inference_server.codecs import recordio_protobuf

    model_dir, _ = _xgboost_model_dir(tmp_path)
    env = {"SAGEMAKER_PROGRAM": "inference.py"}
    server = servers.start("--model-dir", str(model_dir), "--script-defaults", "xgboost", plugins=[], env=env)

    def sparse(key: int, width: int) -> bytes:
        tensor = recordio_protobuf._field(1, struct.pack("<f", 1.0))
        tensor += recordio_protobuf._field(2, recordio_protobuf._varint(key))
        tensor += recordio_protobuf._field(3, recordio_protobuf._varint(width))
        value = recordio_protobuf._field(2, tensor)
        entry = recordio_protobuf._field(1, b"values") + recordio_protobuf._field(2, value)
        return recordio_protobuf._recordio(recordio_protobuf._field(1, entry))

    for key, width in ((2**40, 2**41), (5, 3), (0, 2**62)):
        reply = server.request(
            "POST", "/invocations", sparse(key, width), {"Content-Type": "application/x-recordio-protobuf"}
        )
        assert (reply.status, "beyond its width" in reply.json()["message"]) == (400, True), (key, width)
    assert server.request("GET", "/ping").status == 200


def _healthy(server: Any, deadline: float = 60) -> None:
    """Wait until /ping says 200 (the model loaded), or fail with the server's log."""
    end = time.monotonic() + deadline
    while server.request("GET", "/ping").status != 200:
        assert time.monotonic() < end, server.output()
        time.sleep(0.1)


#: The PyTorch container's example, as AWS writes it: the network's class in the script, its weights loaded from
#: model.pth in model_fn (with the context), everything else left to the container.
PYTORCH_MODEL_FN_ONLY = """
    import os

    import torch


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, x):
            return torch.softmax(self.fc(x), dim=-1)


    def model_fn(model_dir, context):
        model = Net()
        with open(os.path.join(model_dir, "model.pth"), "rb") as f:
            model.load_state_dict(torch.load(f))
        return model.to(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
"""


def test_a_pytorch_script_left_to_the_pytorch_defaults(servers: ServerFactory, tmp_path: Path) -> None:
    """--script-defaults pytorch: JSON and CSV become float32 tensors, .npy a tensor, the model runs in eval mode
    without gradients, and the answers are the prediction's list as JSON, CSV or .npy; bad bodies are 4xx."""
    import torch

    model_dir = tmp_path / "model"
    (model_dir / "code").mkdir(parents=True)
    (model_dir / "code" / "inference.py").write_text(textwrap.dedent(PYTORCH_MODEL_FN_ONLY))
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    torch.save({f"fc.{name}": value for name, value in layer.state_dict().items()}, model_dir / "model.pth")
    rows = [[0.0, 1.0, 2.0], [3.0, -1.0, 0.5]]
    with torch.no_grad():
        expected = torch.softmax(layer(torch.tensor(rows)), dim=-1).tolist()
    env = {"SAGEMAKER_PROGRAM": "inference.py"}
    server = servers.start("--model-dir", str(model_dir), "--script-defaults", "pytorch", plugins=[], env=env)
    content_type, body = _invoke(server.port, json.dumps(rows).encode(), "application/json")
    assert content_type == "application/json"
    assert np.allclose(json.loads(body), expected)
    content_type, body = _invoke(server.port, b"0,1,2\n3,-1,0.5", "text/csv", "text/csv")
    assert content_type == "text/csv"
    assert np.allclose(np.loadtxt(io.BytesIO(body), delimiter=","), expected)
    npy_body = io.BytesIO()
    np.save(npy_body, np.array(rows, dtype=np.float32))
    content_type, body = _invoke(server.port, npy_body.getvalue(), "application/x-npy", "application/x-npy")
    answer = np.load(io.BytesIO(body))
    assert (content_type, answer.dtype) == ("application/x-npy", np.float64)  # a list, saved: as the container
    assert np.allclose(answer, expected)
    for body, content_type, status in [
        (b'["a"]', "application/json", 400),
        (b"[[1, 2], [3]]", "application/json", 400),
        (b"x", "text/plain", 415),
    ]:
        assert server.request("POST", "/invocations", body, {"Content-Type": content_type}).status == status
    headers = {"Content-Type": "application/json", "Accept": "image/png"}
    assert server.request("POST", "/invocations", b"[[1, 2, 3]]", headers).status == 406
    assert server.request("GET", "/ping").status == 200


def test_a_torchscript_model_is_served_without_a_script(servers: ServerFactory, tmp_path: Path) -> None:
    """--script-defaults pytorch with no inference.py serves model.pt (TorchScript) as the container does; our
    client's TorchTensor classes send and receive tensors as .npy."""
    import torch

    from inference_server.client import Predictor, TorchTensorDeserializer, TorchTensorSerializer
    from tests.conftest import save_torchscript

    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    save_torchscript(layer, tmp_path / "model.pt")
    server = servers.start("--model-dir", str(tmp_path), "--script-defaults", "pytorch", plugins=[])
    _healthy(server)
    data = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    with Predictor(
        f"http://127.0.0.1:{server.port}",
        TorchTensorSerializer(content_type="application/x-npy"),
        TorchTensorDeserializer(accept="application/x-npy"),
    ) as predictor:
        answer = predictor.predict(data)
    with torch.no_grad():
        assert torch.allclose(answer.float(), layer(data))
    assert "defaults:pytorch" in server.output()


def test_a_pytorch_model_directory_without_one_model_file_is_a_503_naming_them(
    servers: ServerFactory, tmp_path: Path
) -> None:
    """No model.pt and not exactly one .pt/.pth file: the load fails, /ping is 503 and the invocation says why."""
    server = servers.start("--model-dir", str(tmp_path), "--script-defaults", "pytorch", "--no-preload", plugins=[])
    reply = server.request("POST", "/invocations", b"[1]", {"Content-Type": "application/json"})
    assert (reply.status, "Exactly one .pth or .pt file" in reply.json()["message"]) == (503, True)


@pytest.fixture(scope="module")
def hf_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny text classifier saved as transformers saves one (config.json naming BertForSequenceClassification,
    safetensors weights, a word-level tokenizer), made here: nothing is downloaded."""
    return save_bert_classifier(tmp_path_factory.mktemp("hf") / "model")


def test_a_hugging_face_model_is_served_without_a_script(servers: ServerFactory, hf_model_dir: Path) -> None:
    """--script-defaults huggingface with no inference.py and no HF_TASK: the task comes from config.json, and
    {"inputs", "parameters"} in JSON or an inputs column in CSV give the pipeline's answer as compact JSON or CSV
    records, through boto3; what the pipeline cannot take is a 400."""
    from transformers import pipeline

    classify = pipeline("text-classification", model=str(hf_model_dir), tokenizer=str(hf_model_dir), device=-1)
    env = {"HF_HUB_OFFLINE": "1"}
    server = servers.start("--model-dir", str(hf_model_dir), "--script-defaults", "huggingface", plugins=[], env=env)
    _healthy(server)
    content_type, body = _invoke(server.port, b'{"inputs": "the movie was good"}', "application/json")
    expected = classify("the movie was good")
    assert content_type == "application/json"
    assert json.loads(body)[0]["label"] == expected[0]["label"]
    assert json.loads(body)[0]["score"] == pytest.approx(expected[0]["score"], rel=1e-5)
    payload = {"inputs": ["good", "bad"], "parameters": {"top_k": 2}}
    _, body = _invoke(server.port, json.dumps(payload).encode(), "application/json")
    assert [len(labels) for labels in json.loads(body)] == [2, 2]
    content_type, body = _invoke(server.port, b"inputs\nthe movie was good\nbad\n", "text/csv", "text/csv")
    assert content_type == "text/csv"
    assert body.decode().splitlines()[0] == "label,score"
    assert len(body.decode().splitlines()) == 3
    for bad, content_type in [(b'["good"]', "application/json"), (b"1,2\n", "text/csv"), (b"{", "application/json")]:
        reply = server.request("POST", "/invocations", bad, {"Content-Type": content_type})
        assert reply.status == 400, (bad, reply.body)
    assert server.request("GET", "/ping").status == 200


#: A Hugging Face script that keeps the container's model_fn and output_fn and brings its own predict_fn.
HF_PREDICT_FN_ONLY = """
    def predict_fn(data, model, context):
        best = model(data["inputs"])[0]
        return {"label": best["label"], "model_dir": context.system_properties["model_dir"]}
"""


def test_a_hugging_face_script_with_only_predict_fn(servers: ServerFactory, hf_model_dir: Path, tmp_path: Path) -> None:
    """A script defining predict_fn alone gets the pipeline from the container's model_fn and its input and output
    handling; HF_TASK names the task."""
    script = tmp_path / "inference.py"
    script.write_text(textwrap.dedent(HF_PREDICT_FN_ONLY))
    env = {"HF_HUB_OFFLINE": "1", "HF_TASK": "text-classification"}
    args = ("--model-dir", str(hf_model_dir), "--script", str(script), "--script-defaults", "huggingface")
    server = servers.start(*args, plugins=[], env=env)
    _healthy(server)
    content_type, body = _invoke(server.port, b'{"inputs": "bad"}', "application/json", "*/*")
    assert content_type == "application/json"
    assert json.loads(body)["model_dir"] == str(hf_model_dir)
    assert json.loads(body)["label"] in ("POSITIVE", "NEGATIVE")


PRE_AND_WARMUP = """
    import os

    calls = []


    def pre_model_fn(model_dir):
        calls.append("pre_model_fn " + os.path.basename(model_dir))


    def model_fn(model_dir):
        calls.append("model_fn")
        return {"warm": False}


    def model_warmup_fn(model_dir, model, context):
        model["warm"] = context.system_properties["model_dir"] == model_dir
        calls.append("model_warmup_fn")


    def transform_fn(model, request_body, content_type, accept):
        return " ".join(calls) + f" warm={model['warm']}", "text/plain"
"""


def test_pre_model_fn_and_model_warmup_fn_run_around_model_fn(servers: ServerFactory, tmp_path: Path) -> None:
    """The toolkit's pre_model_fn runs before model_fn and model_warmup_fn after it, with the loaded model."""
    model_dir = _model_dir(tmp_path, PRE_AND_WARMUP)
    server = servers.start("--model-dir", str(model_dir), plugins=[], env={"SAGEMAKER_PROGRAM": "inference.py"})
    assert _invoke(server.port, b"x", "text/plain") == (
        "text/plain",
        b"pre_model_fn model model_fn model_warmup_fn warm=True",
    )


#: A script whose batched predict_fn answers each row with the id in its own request's Content-Type, read from the
#: group's context by index, and the group's size.
GROUPED = """
    import json
    import time

    import numpy as np

    def model_fn(model_dir):
        return "model"

    def input_fn(input_data, content_type):
        return np.array([[float(input_data)]])

    def predict_fn(data, model, context):
        time.sleep(0.02)
        headers = [context.get_request_header(i, "Content-Type") for i in range(len(data))]
        for i, header in enumerate(headers):
            context.set_response_content_type(i, "application/x-answer-" + header.split("id=")[1])
        return np.array([[float(header.split("id=")[1]), len(data)] for header in headers])

    def output_fn(prediction, accept):
        return json.dumps(prediction.tolist())
"""


def test_a_batched_predict_fn_reads_each_request_of_its_group_from_the_context(tmp_path: Path) -> None:
    """Under micro-batching, a script's predict_fn(data, model, context) gets its group's context: the i-th request's
    header is the i-th input's, never one of a request outside the group, and the response content type it sets for
    the i-th request is that request's."""
    import threading

    import werkzeug.test

    from inference_server import _plugins
    from inference_server._settings import Settings
    from inference_server.wsgi._app import App

    script = tmp_path / "inference.py"
    script.write_text(textwrap.dedent(GROUPED))
    settings = Settings(model_dir=str(tmp_path), script=str(script), max_batch_size=8, timeout=30)
    app = App(settings, _plugins.build_manager([]))
    answers: dict[int, list[float]] = {}

    def ask(number: int) -> None:
        response = werkzeug.test.Client(app).post(
            "/invocations", data=str(number), content_type=f"application/x-id; id={number}"
        )
        assert response.status_code == 200, response.get_data()
        assert response.headers["Content-Type"] == f"application/x-answer-{number}"
        answers[number] = json.loads(response.get_data())[0]

    threads = [threading.Thread(target=ask, args=(number,)) for number in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answers) == list(range(32))
    assert all(answer[0] == number for number, answer in answers.items())
    assert max(answer[1] for answer in answers.values()) > 1  # groups did form


#: The streaming page's generate.py: a model that takes ``{"prompt": ...}`` (which shipping_forecast's input_fn,
#: installed in this environment, would refuse with a KeyError).
GENERATE = """
    def model_fn(model_dir):
        return {"pause": 0}


    def predict_fn(data, model):
        for word in data["prompt"].split():
            yield word.upper()
"""


def test_a_script_serves_alone_whatever_plugins_are_installed(servers: ServerFactory, tmp_path: Path) -> None:
    """With plugins installed (this environment's examples) and none named, ``serve --script`` serves the script with
    the built-in hooks and nothing else; ``--plugins NAME`` (or INFERENCE_SERVER_PLUGINS) adds the plugins it names."""
    from inference_server import _plugins
    from tests.conftest import Server

    script = tmp_path / "generate.py"
    script.write_text(textwrap.dedent(GENERATE))
    env = servers.environment([], None)
    del env[_plugins.PLUGINS_ENV]  # none named: every installed plugin is discovered
    alone = Server(["--script", str(script), "--log-format", "text"], env, tmp_path / "alone.log")
    servers.servers.append(alone)
    alone.wait_ready()
    reply = alone.request("POST", "/invocations", b'{"prompt": "fair isle"}', {"Content-Type": "application/json"})
    assert (reply.status, reply.body) == (200, b'"FAIR"\n"ISLE"\n'), alone.output()
    alone.stop()
    assert "hook input_fn: built-in\n" in alone.output()
    assert "shipping_forecast" not in alone.output()
    named = Server(["--script", str(script), "--plugins", "shipping_forecast"], env, tmp_path / "named.log")
    servers.servers.append(named)
    named.wait_ready()
    named.stop()
    assert f"hook predict_fn: script:{script} (the script's), then shipping_forecast, then built-in" in named.output()


def test_create_app_serves_a_script_alone_unless_plugins_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process too, ``create_app()`` with a script (INFERENCE_SERVER_SCRIPT) runs none of the installed plugins'
    hooks unless INFERENCE_SERVER_PLUGINS names them."""
    import werkzeug.test

    from inference_server import _plugins, create_app

    script = tmp_path / "generate.py"
    script.write_text(textwrap.dedent(GENERATE))
    monkeypatch.setenv("INFERENCE_SERVER_SCRIPT", str(script))
    monkeypatch.delenv(_plugins.PLUGINS_ENV)
    app = create_app(model_dir=str(tmp_path))
    assert [name for name, _ in app.pm.list_name_plugin()] == [_plugins.DEFAULTS_NAME, f"script:{script}"]
    response = werkzeug.test.Client(app).post(
        "/invocations", data=b'{"prompt": "utsire"}', content_type="application/json"
    )
    assert (response.status_code, response.get_data()) == (200, b'"UTSIRE"\n')
    monkeypatch.setenv(_plugins.PLUGINS_ENV, "shipping_forecast")
    named = create_app(model_dir=str(tmp_path))
    assert [name for name, _ in named.pm.list_name_plugin()] == [
        _plugins.DEFAULTS_NAME,
        "shipping_forecast",
        f"script:{script}",
    ]


#: A script that imports a sibling module ``utils`` (beside it in ``code/``), at its import and when called.
WITH_SIBLING = """
    import json

    import utils


    def model_fn(model_dir):
        return utils.NAME


    def predict_fn(data, model):
        import utils as again  # some scripts import when called

        return {"loaded": model, "called": again.NAME}


    def output_fn(prediction, accept):
        return json.dumps(prediction)
"""


def test_two_scripts_with_same_named_siblings_each_import_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two model directories whose code/inference.py each import a utils.py of their own, loaded in one process:
    each script gets its own utils, at its import and when its functions run, whichever was loaded first; a module
    imported already from elsewhere (json) stays the one they get, as in the toolkit."""
    import werkzeug.test

    from inference_server import create_app

    monkeypatch.setenv("SAGEMAKER_PROGRAM", "inference.py")
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "")
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    try:
        apps = {}
        for name in ("first", "second"):
            code = tmp_path / name / "code"
            code.mkdir(parents=True)
            (code / "inference.py").write_text(textwrap.dedent(WITH_SIBLING))
            (code / "utils.py").write_text(f"NAME = {name!r}\n")
            (code / "json.py").write_text("raise ImportError('the json of the standard library, imported already')\n")
            apps[name] = create_app(model_dir=str(tmp_path / name))
        for name, app in apps.items():
            response = werkzeug.test.Client(app).post("/invocations", data=b"{}", content_type="application/json")
            assert (response.status_code, json.loads(response.get_data())) == (200, {"loaded": name, "called": name})
    finally:
        for module in set(sys.modules) - before:
            del sys.modules[module]


#: WITH_CONTEXT with every function ``async def`` (pre_model_fn and model_warmup_fn too), and a toolkit error
#: raised from an async input_fn.
ASYNC_WITH_CONTEXT = """
    import asyncio
    import json


    class UnprocessableEntity(Exception):
        def __init__(self, message):
            self.status_code, self.message, self.phrase = 422, message, message
            super().__init__(message)


    async def pre_model_fn(model_dir, context):
        await asyncio.sleep(0)
        context.system_properties["prepared"] = True


    async def model_fn(model_dir, context):
        await asyncio.sleep(0)
        return {"dir": context.system_properties["model_dir"], "scale": 10, "warm": False}


    async def model_warmup_fn(model_dir, model, context):
        await asyncio.sleep(0)
        model["warm"] = context.system_properties["prepared"]


    async def input_fn(input_data, content_type, context):
        await asyncio.sleep(0)
        data = json.loads(input_data)
        if "values" not in data:
            raise UnprocessableEntity("the body must have 'values'")
        return data["values"], context.get_request_header(0, "Content-Type")


    async def predict_fn(data, model, context):
        await asyncio.sleep(0.01)
        values, content_type = data
        return {"scaled": [v * model["scale"] for v in values], "seen_type": content_type, "warm": model["warm"]}


    async def output_fn(prediction, accept, context):
        await asyncio.sleep(0)
        return json.dumps(prediction), "application/vnd.example+json"
"""

#: An async model_fn and an async generator predict_fn, streamed by the built-in output_fn.
ASYNC_STREAMING = """
    import asyncio


    async def model_fn(model_dir):
        await asyncio.sleep(0)
        return 3


    async def predict_fn(data, model):
        for index in range(model):
            await asyncio.sleep(0.01)
            yield {"index": index, "of": data["name"]}
"""


def test_a_script_whose_functions_are_async(servers: ServerFactory, tmp_path: Path) -> None:
    """A script's async def functions (with the context, pre_model_fn and model_warmup_fn too) are run and
    awaited; a toolkit error raised from one answers its own status."""
    model_dir = _model_dir(tmp_path, ASYNC_WITH_CONTEXT)
    server = servers.start("--model-dir", str(model_dir), plugins=[], env={"SAGEMAKER_PROGRAM": "inference.py"})
    content_type, body = _invoke(server.port, b'{"values": [1, 2.5]}', "application/json")
    assert content_type == "application/vnd.example+json"
    assert json.loads(body) == {"scaled": [10, 25.0], "seen_type": "application/json", "warm": True}
    reply = server.request("POST", "/invocations", b"{}", {"Content-Type": "application/json"})
    assert (reply.status, reply.json()["message"]) == (422, "the body must have 'values'")


def test_a_script_whose_predict_fn_is_an_async_generator_streams(servers: ServerFactory, tmp_path: Path) -> None:
    """A script's async generator predict_fn is streamed record by record as JSON Lines by the built-in
    output_fn."""
    model_dir = _model_dir(tmp_path, ASYNC_STREAMING)
    server = servers.start("--model-dir", str(model_dir), plugins=[], env={"SAGEMAKER_PROGRAM": "inference.py"})
    reply = server.request("POST", "/invocations", b'{"name": "x"}', {"Content-Type": "application/json"})
    assert reply.headers["Content-Type"] == "application/jsonlines"
    assert [json.loads(line) for line in reply.body.splitlines()] == [{"index": i, "of": "x"} for i in range(3)]
