"""The ``inference-server`` command: start-up checks, options, environment variables and signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

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


def test_misspelled_option_suggests_the_right_one_with_serve_usage() -> None:
    """``serve --model_dir`` fails with serve's usage and 'did you mean --model-dir?'."""
    result = _run("serve", "--model_dir", "/models", "--wrokers", "2")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: inference-server serve ")
    assert "--model_dir (did you mean --model-dir?)" in result.stderr
    assert "--wrokers (did you mean --workers?)" in result.stderr


def test_help_lists_the_variables_the_hooks_and_loader_read() -> None:
    """``serve --help`` also names the variables that are not options: plugins, payload limit, batch settings."""
    result = _run("serve", "--help")
    for name in (
        "INFERENCE_SERVER_PLUGINS",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB",
        "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT",
        "SAGEMAKER_BATCH_STRATEGY",
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS",
        "INFERENCE_SERVER_DEBUG",
    ):
        assert name in result.stdout


def test_version_lists_the_installed_plugins() -> None:
    """``--version`` names this version and each installed plugin with its version."""
    result = _run("--version")
    assert result.stdout.startswith("inference-server ")
    assert "shipping_forecast 1.0.0" in result.stdout


def test_plugins_command_prints_the_summary_and_warnings(plugin_site: Any) -> None:
    """``inference-server plugins`` prints who provides each hook and the warnings; --strict fails on them."""
    plugin_site.add("forgetful", "def predict_fn(data, model):\n    return data\n")
    env = {"PYTHONPATH": str(plugin_site.path), "INFERENCE_SERVER_PLUGINS": "forgetful"}
    result = _run("plugins", env=env)
    assert result.returncode == 0
    assert "plugin forgetful (forgetful 1.0, module forgetful)" in result.stdout
    assert "hook predict_fn: built-in" in result.stdout
    assert "warning: serving the built-in echo model: no installed plugin implements model_fn" in result.stdout
    assert (
        "warning: plugin 'forgetful' implements no hook; predict_fn looks like a hook but lacks the "
        "@inference_server.plugin_hook decorator"
    ) in result.stdout
    assert _run("plugins", "--strict", env=env).returncode == 1
    assert _run("plugins", "--strict", env={"INFERENCE_SERVER_PLUGINS": "shipping_forecast"}).returncode == 0


def test_start_up_logs_the_summary_and_warns_about_the_echo_model(servers: Any) -> None:
    """``serve`` logs the plugins, the hooks' providers and the limits, and warns once about the echo model."""
    server = servers.start(
        "--workers", "2", "--log-format", "text", plugins=[], env={"INFERENCE_SERVER_MODEL_DIR": "/nonexistent"}
    )
    server.stop()
    output = server.output()
    assert "plugins: none (the built-in hooks only)" in output
    assert "hook model_fn: built-in" in output
    assert "limits: bodies up to 6 MB, timeout 60 s, read timeout 30 s" in output
    assert "[WARNING] inference_server: serving the built-in echo model" in output
    assert output.count("Model directory /nonexistent does not exist") == 1


def test_two_plugins_with_input_fn_are_named_at_start_up(servers: Any, plugin_site: Any) -> None:
    """Two installed plugins implementing input_fn: the start-up warning names the one that wins and the other."""
    source = "import inference_server\n\n@inference_server.plugin_hook\ndef input_fn(input_data, content_type):\n"
    for name in ("alpha", "beta"):
        plugin_site.add(name, source + "    return input_data\n")
    server = servers.start()
    server.stop()
    warning = next(line for line in server.output().splitlines() if "input_fn is implemented by 2 plugins" in line)
    assert "'beta' runs first and wins whenever it returns something other than None; then 'alpha'" in warning


def test_serve_strict_exits_1_on_a_start_up_warning(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """``serve --strict`` (or INFERENCE_SERVER_STRICT) stops start-up with exit 1 on a warning, naming it; without
    warnings it serves."""
    plugin_site.add("forgetful", "def predict_fn(data, model):\n    return data\n")
    server = servers.start("--strict", plugins=["forgetful"], wait=False)
    assert server.process.wait(30) == 1
    last = server.output().strip().splitlines()[-1]
    assert last.startswith("inference-server: error: --strict: 3 warning(s) at start-up, the first: ")
    variable = servers.start(plugins=["forgetful"], env={"INFERENCE_SERVER_STRICT": "true"}, wait=False)
    assert variable.process.wait(30) == 1
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    ok = servers.start("--strict", "--model-dir", str(model_dir), plugins=["shipping_forecast"])
    assert ok.request("GET", "/ping").status == 200


SCRIPT = """
def model_fn(model_dir):
    return "scripted"

def predict_fn(data, model):
    return f"{model}: {data}"

def output_fn(prediction, accept):
    return prediction
"""


def test_plugins_and_transform_take_a_script(tmp_path: Path) -> None:
    """``plugins --script`` lists the script as the first provider of its hooks, saying which the script defines and
    which come from ``--script-defaults``; ``transform --script`` runs a job with it (both take the options from the
    same settings rows as serve's)."""
    script = tmp_path / "inference.py"
    script.write_text(SCRIPT)
    env = {"INFERENCE_SERVER_PLUGINS": ""}
    listed = _run("plugins", "--script", str(script), "--script-defaults", "sklearn", env=env)
    assert listed.returncode == 0, listed.stderr
    assert f"plugin script:{script} ({script}, functions the script lacks from --script-defaults sklearn)" in (
        listed.stdout
    )
    assert f"hook predict_fn: script:{script} (the script's), then built-in" in listed.stdout
    assert f"hook input_fn: script:{script} (the sklearn container's default), then built-in" in listed.stdout
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("hello")
    done = _run("transform", str(tmp_path / "in"), str(tmp_path / "out"), "--script", str(script),
                "--content-type", "text/plain", "--quiet", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "a.txt.out").read_text() == "scripted: hello"
    missing = _run("plugins", "--script", str(tmp_path / "nowhere.py"), env=env)
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        f"inference-server: error: --script {tmp_path}/nowhere.py: no such file",
    )


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_ctrl_c_stops_at_once_with_one_info_line(servers: Any, backend: str) -> None:
    """SIGINT to the whole process group, as Ctrl-C sends it: exit 130, one INFO line saying so, no ERROR about
    the workers' exits."""
    server = servers.start("--server", backend, "--workers", "2", "--log-format", "text", plugins=[], new_session=True)
    os.killpg(server.process.pid, signal.SIGINT)
    assert server.process.wait(30) == 130
    output = server.output()
    assert "[INFO] inference_server: SIGINT: stopping at once" in output
    assert "[ERROR]" not in output
    assert "Traceback" not in output


def test_plugins_script_shows_the_script_alone_unless_plugins_are_named(tmp_path: Path) -> None:
    """``plugins --script`` with plugins installed and none named lists the script and the built-in hooks only, as
    ``serve --script`` serves it; ``--plugins`` or INFERENCE_SERVER_PLUGINS adds the ones they name after it."""
    script = tmp_path / "inference.py"
    script.write_text(SCRIPT)
    alone = _run("plugins", "--script", str(script), "--strict")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    description = f"{script}, functions the script lacks from --script-defaults inference-server"
    assert alone.stdout.splitlines()[0] == f"plugin script:{script} ({description})"
    assert "hook input_fn: built-in\n" in alone.stdout
    assert f"hook predict_fn: script:{script} (the script's), then built-in\n" in alone.stdout
    assert "shipping_forecast" not in alone.stdout
    for named in (
        _run("plugins", "--script", str(script), "--plugins", "shipping_forecast"),
        _run("plugins", "--script", str(script), env={"INFERENCE_SERVER_PLUGINS": "shipping_forecast"}),
    ):
        assert "plugin shipping_forecast (" in named.stdout
        assert f"hook predict_fn: script:{script} (the script's), then shipping_forecast, then built-in" in (
            named.stdout
        )
    container = _run("plugins", "--script-defaults", "pytorch")  # a container's defaults alone are served alone too
    assert container.stdout.splitlines()[0] == "plugin defaults:pytorch (the pytorch container's defaults, no script)"
    assert "shipping_forecast" not in container.stdout
    without_script = _run("plugins", "--plugins", "")
    assert without_script.stdout.splitlines()[0] == "plugins: none (the built-in hooks only)"
    missing = _run("plugins", "--script", str(script), "--plugins", "nothing_here")
    assert missing.returncode == 1
    assert "--plugins (INFERENCE_SERVER_PLUGINS) names nothing_here, which no installed package" in missing.stderr
