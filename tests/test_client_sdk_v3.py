"""The SageMaker SDK v3 (``sagemaker.core``) against a real local server, unmodified, with its serializers and
with ours. SDK v3 and v2 cannot share one environment (both are the ``sagemaker`` package), so v3 runs in a
virtualenv of its own, made once per test run with this package installed next to it."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServerFactory, install_this_checkout, local_aws_env, make_venv

ROOT = Path(__file__).resolve().parents[1]
SDK_V3 = "sagemaker-core>=2,<3"  # SDK v3's core distribution: sagemaker.core.resources, serializers, deserializers

MODEL = """
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if isinstance(data, dict):
            return {"echo": data, "keys": sorted(data)}
        return data
"""


@pytest.fixture(scope="session")
def v3_python(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The Python of a virtualenv with the SageMaker SDK v3 (and this package's dependencies), and the directory
    holding this package for its ``PYTHONPATH``."""
    return make_venv(SDK_V3, *_our_dependencies()), install_this_checkout(tmp_path_factory.mktemp("wheel"))


def _our_dependencies() -> list[str]:
    """This package's dependencies as pyproject.toml declares them (the cached virtualenv is keyed by them)."""
    import tomllib

    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


SCRIPT = """
    import io, json, sys
    import numpy as np
    from sagemaker.core.resources import Endpoint
    from sagemaker.core.serializers import JSONSerializer as V3JSONSerializer, NumpySerializer as V3NumpySerializer
    from sagemaker.core.deserializers import JSONDeserializer as V3JSONDeserializer
    from sagemaker.core.deserializers import NumpyDeserializer as V3NumpyDeserializer
    from inference_server import client

    results = {}
    plain = Endpoint(endpoint_name="my-endpoint").invoke(
        body=b'{"location": "Fair Isle"}', content_type="application/json", accept="application/json"
    )
    results["plain"] = [plain.body.read().decode(), plain.content_type]

    sdk = Endpoint(endpoint_name="my-endpoint", serializer=V3JSONSerializer(), deserializer=V3JSONDeserializer())
    results["sdk"] = sdk.invoke(body={"a": 1}, content_type="application/json", accept="application/json").body

    ours = Endpoint(
        endpoint_name="my-endpoint", serializer=client.JSONSerializer(), deserializer=client.JSONDeserializer()
    )
    results["ours"] = ours.invoke(body={"a": 1}, content_type="application/json", accept="application/json").body

    arrays = Endpoint(
        endpoint_name="my-endpoint", serializer=client.NumpySerializer(), deserializer=client.NumpyDeserializer()
    )
    array = arrays.invoke(
        body=np.arange(6.0).reshape(2, 3), content_type="application/x-npy", accept="application/x-npy"
    )
    results["ours_npy"] = [array.body.tolist(), str(array.body.dtype)]

    # the same data through the SDK's classes and ours gives the same bytes and the same objects
    data = {"x": np.arange(3).tolist(), "y": "text"}
    results["same_json_text"] = V3JSONSerializer().serialize(data) == client.JSONSerializer().serialize(data)
    matrix = np.arange(6, dtype=np.float32).reshape(2, 3)
    results["same_npy_bytes"] = V3NumpySerializer().serialize(matrix) == client.NumpySerializer().serialize(matrix)
    body = V3NumpySerializer().serialize(matrix)
    theirs = V3NumpyDeserializer().deserialize(io.BytesIO(body), "application/x-npy")
    mine = client.NumpyDeserializer().deserialize(io.BytesIO(body), "application/x-npy")
    results["same_npy_array"] = bool(np.array_equal(theirs, mine) and theirs.dtype == mine.dtype)
    print(json.dumps(results))
"""


def run_in_v3(v3_python: tuple[Path, Path], server: Any, tmp_path: Path, script: str) -> dict[str, Any]:
    """Run ``script`` in SDK v3's virtualenv with SageMaker Runtime pointed at ``server``; its last printed line,
    parsed as JSON."""
    python, site = v3_python
    env = {**local_aws_env(f"http://127.0.0.1:{server.port}"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    env["PYTHONPATH"] = str(site)
    done = subprocess.run(
        [str(python), "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_sdk_v3_endpoint_invoke_against_a_local_server(
    v3_python: tuple[Path, Path], servers: ServerFactory, tmp_path: Path
) -> None:
    """sagemaker.core.resources.Endpoint(...).invoke(...) reaches a local server through
    AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME, plain, with the SDK v3's serializers and with ours."""
    servers.plugin_site.add("echo_dicts", MODEL)
    server = servers.start()
    results = run_in_v3(v3_python, server, tmp_path, SCRIPT)
    assert results["plain"] == ['{"echo":{"location":"Fair Isle"},"keys":["location"]}', "application/json"]
    assert results["sdk"] == results["ours"] == {"echo": {"a": 1}, "keys": ["a"]}
    assert results["ours_npy"] == [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], "float64"]
    assert results["same_json_text"]
    assert results["same_npy_bytes"]
    assert results["same_npy_array"]


STREAMING_MODEL = """
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return (f"token {index}" for index in range(data["tokens"]))
"""

STREAMING_SCRIPT = """
    import json
    from sagemaker.core.resources import Endpoint
    from inference_server import client

    endpoint = Endpoint(endpoint_name="my-endpoint")
    results = {}
    try:  # the SDK's own method: sagemaker-core 2.27 fails on every event stream (its transform reads it as a dict)
        answer = endpoint.invoke_with_response_stream(
            body=b'{"tokens": 3}', content_type="application/json", accept="text/event-stream"
        )
        results["sdk"] = [event["PayloadPart"]["Bytes"].decode() for event in answer.body]
    except AttributeError as exc:
        results["sdk"] = str(exc)
    events = client.StringDeserializer(accept="text/event-stream")
    predictor = client.Predictor.for_endpoint(endpoint, client.JSONSerializer(), events)
    results["ours"] = [event.data for event in predictor.predict_stream({"tokens": 3})]
    print(json.dumps(results))
"""


def test_sdk_v3_endpoint_streams_through_our_predictor(
    v3_python: tuple[Path, Path], servers: ServerFactory, tmp_path: Path
) -> None:
    """An SDK v3 Endpoint streams from a local server through Predictor.for_endpoint(endpoint).predict_stream; the
    SDK's own invoke_with_response_stream either reads the same events or fails as sagemaker-core 2.27 does on any
    event stream (its response transform calls .get on botocore's EventStream)."""
    servers.plugin_site.add("tokens", STREAMING_MODEL)
    server = servers.start()
    results = run_in_v3(v3_python, server, tmp_path, STREAMING_SCRIPT)
    assert results["ours"] == ["token 0", "token 1", "token 2"]
    assert results["sdk"] in (
        ["data: token 0\n\n", "data: token 1\n\n", "data: token 2\n\n"],
        "'EventStream' object has no attribute 'get'",
    )
