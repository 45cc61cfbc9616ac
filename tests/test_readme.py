"""The README's examples run as written (against a real server), so the documentation cannot drift."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
EXPLAINER = """
    import numpy as np
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if isinstance(data, np.ndarray):
            return {"scores": data.sum(axis=1), "explains": data / data.sum(axis=1, keepdims=True)}
        return data
"""


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def _on_port(text: str, port: int) -> str:
    return text.replace("localhost:8080", f"127.0.0.1:{port}").replace("127.0.0.1:8080", f"127.0.0.1:{port}")


def test_quick_start_curl_answers_the_forecast(servers: Any) -> None:
    """The quick start's curl, sent to the example server, prints the JSON the README shows."""
    server = servers.start(plugins=["shipping_forecast"])
    curl = next(block for block in _blocks("sh") if block.startswith("curl"))
    output = subprocess.run(shlex.split(_on_port(curl, server.port)), capture_output=True, check=True).stdout
    assert orjson.loads(output) == orjson.loads(_blocks("json")[0])


def test_client_example_runs(servers: Any, plugin_site: Any) -> None:
    """The Predictor example unpacks named arrays from an npz answer."""
    plugin_site.add("explainer", EXPLAINER)
    server = servers.start()
    example = next(block for block in _blocks("python") if "Predictor(" in block)
    namespace: dict[str, Any] = {}
    exec(compile(_on_port(example, server.port), "README.md", "exec"), namespace)
    assert namespace["result"]["explains"].shape == (2, 3)


def test_local_endpoint_example_runs(servers: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """The 'test against a local endpoint' exports and boto3 snippet reach the example server."""
    server = servers.start(plugins=["shipping_forecast"])
    exports = next(block for block in _blocks("sh") if "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME" in block)
    for name, value in re.findall(r"(\w+)=(\S+)", _on_port(exports, server.port)):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    example = next(block for block in _blocks("python") if "invoke_endpoint" in block)
    exec(compile(example, "README.md", "exec"), {})
    assert "Southwesterly gale force 8" in capsys.readouterr().out


def test_plugin_test_snippet_runs_as_written() -> None:
    """The 'Testing a plugin' snippet imports what it uses and passes against the example plugin."""
    example = next(block for block in _blocks("python") if "def test_prediction_is_ok" in block)
    namespace: dict[str, Any] = {}
    exec(compile(example, "README.md", "exec"), namespace)
    namespace["test_prediction_is_ok"]()
