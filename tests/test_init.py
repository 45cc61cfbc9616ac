"""The public face of the package."""

import subprocess
import sys

import inference_server


def test_all_lists_exactly_the_public_names() -> None:
    """``__all__`` is the documented public API, nothing more, nothing less."""
    assert sorted(inference_server.__all__) == sorted(
        ["BatchStrategy", "MIMEAccept", "__version__", "create_app", "mapped", "plugin_hook", "warmup"]
    )
    public = {name for name in dir(inference_server) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(inference_server, name)).__name__ == "module"}
    assert public - modules == set(inference_server.__all__) - {"__version__"}
    assert all(getattr(inference_server, name) is not None for name in inference_server.__all__)


def test_version_comes_from_installed_metadata() -> None:
    """``__version__`` is the installed distribution's version."""
    import importlib.metadata

    assert inference_server.__version__ == importlib.metadata.version("inference-server")


def test_mime_accept_is_werkzeugs() -> None:
    """``MIMEAccept`` is werkzeug's class, as in inference-server 1.x."""
    import werkzeug.datastructures

    assert inference_server.MIMEAccept is werkzeug.datastructures.MIMEAccept


def test_warmup_loads_the_model_once(tmp_path, only_plugin) -> None:  # type: ignore[no-untyped-def]
    """``warmup()`` calls model_fn once however often it is called, and returns None as 1.x's does."""
    calls = []

    class Counting:
        @inference_server.plugin_hook
        def model_fn(self, model_dir: str) -> object:
            calls.append(model_dir)
            return lambda data: data

    only_plugin(Counting())
    assert inference_server.warmup(model_dir=str(tmp_path)) is None
    assert inference_server.warmup(model_dir=str(tmp_path)) is None
    assert calls == [str(tmp_path)]


def test_model_cache_clear_is_reachable_as_in_1x() -> None:
    """``inference_server._model.cache_clear()`` works right after ``import inference_server``, as 1.x tests call it."""
    code = "import inference_server; inference_server._model.cache_clear(); print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip() == "ok", done.stderr
