"""The ``inference-server`` command: start-up checks, options, environment variables and signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from inference_server import cli


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "INFERENCE_SERVER_"))}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "inference_server", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_names_every_option_and_its_variable() -> None:
    """``serve --help`` documents each option with the environment variable behind it."""
    result = _run("serve", "--help")
    assert result.returncode == 0
    for text in (
        "--host",
        "--port",
        "SAGEMAKER_BIND_TO_PORT",
        "--workers",
        "SAGEMAKER_MODEL_SERVER_WORKERS",
        "--threads",
        "--timeout",
        "SAGEMAKER_MODEL_SERVER_TIMEOUT",
        "--model-dir",
        "INFERENCE_SERVER_MODEL_DIR",
        "--log-level",
    ):
        assert text in result.stdout


def test_without_a_command_prints_usage() -> None:
    """Running without ``serve`` explains usage and fails."""
    assert cli.main([]) == 2


def test_invalid_port_variable_is_named_with_its_value() -> None:
    """``SAGEMAKER_BIND_TO_PORT=abc`` stops start-up with the variable and the value in the message."""
    result = _run("serve", env={"SAGEMAKER_BIND_TO_PORT": "abc"})
    assert result.returncode == 2
    assert "SAGEMAKER_BIND_TO_PORT='abc' is invalid: not an integer" in result.stderr


def test_port_from_sagemaker_variable(servers: Any, unused_port: int) -> None:
    """Without ``--port`` the server listens on ``SAGEMAKER_BIND_TO_PORT``."""
    port = unused_port
    server = servers.start(plugins=[], env={"SAGEMAKER_BIND_TO_PORT": str(port)})
    assert server.port == port
    assert server.request("GET", "/ping").status == 200


def test_sigterm_exits_cleanly(servers: Any) -> None:
    """SIGTERM stops the server with exit status 0 within a few seconds, workers included."""
    server = servers.start(plugins=[])
    started = time.monotonic()
    assert server.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 10  # 'within a few seconds'; SageMaker kills at 30
    assert "Shutting down" in server.output()


def test_serve_is_the_server_process(servers: Any) -> None:
    """The process started as ``serve`` is the server itself, its workers are its children."""
    server = servers.start(plugins=[])
    pid = server.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1  # one worker (--workers 1), started by the process we started


def test_plugin_failing_to_import_stops_start_up(servers: Any, plugin_site: Any) -> None:
    """A plugin that raises on import stops start-up with a message naming it."""
    plugin_site.add("explodes", "raise ImportError('no module named torch_nightly')\n")
    server = servers.start(wait=False)
    assert server.process.wait(30) == 1
    assert "plugin 'explodes' (explodes) failed to import: ImportError: no module named torch_nightly" in (
        server.output()
    )


def test_hook_with_wrong_signature_stops_start_up(servers: Any, plugin_site: Any) -> None:
    """A hook whose arguments do not match the spec stops start-up naming the plugin and the hook."""
    plugin_site.add(
        "misspelt",
        """
        import inference_server

        @inference_server.plugin_hook
        def predict_fn(features, model):
            return model(features)
        """,
    )
    server = servers.start(wait=False)
    assert server.process.wait(30) == 1
    output = server.output()
    assert "plugin 'misspelt'" in output
    assert "predict_fn" in output
    assert "features" in output


def test_unknown_hook_name_stops_start_up(servers: Any, plugin_site: Any) -> None:
    """A function marked as a hook whose name is not a hook stops start-up and lists the real hooks."""
    plugin_site.add(
        "typo",
        """
        import inference_server

        @inference_server.plugin_hook
        def predict(data, model):
            return data
        """,
    )
    server = servers.start(wait=False)
    assert server.process.wait(30) == 1
    assert "plugin 'typo': hook 'predict' is not an inference-server hook" in server.output()


def test_invalid_hook_value_stops_start_up(servers: Any, plugin_site: Any) -> None:
    """An execution-parameter hook returning an invalid value stops start-up with a clear message."""
    plugin_site.add(
        "greedy",
        """
        import inference_server

        @inference_server.plugin_hook
        def batch_strategy():
            return "AllAtOnce"
        """,
    )
    server = servers.start(wait=False)
    assert server.process.wait(30) == 1
    assert "hook batch_strategy returned 'AllAtOnce' is not a batch strategy" in server.output()
