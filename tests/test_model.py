"""The model is loaded once per process and directory, even under concurrent first requests."""

import threading
import time
from typing import Any

import pytest

from inference_server import _model, _plugins, plugin_hook


class SlowModel:
    def __init__(self) -> None:
        self.calls = 0

    @plugin_hook
    def model_fn(self, model_dir: str) -> Any:
        self.calls += 1
        time.sleep(0.2)
        return object()


def test_concurrent_first_requests_load_once() -> None:
    """Eight threads asking at once get the same model from a single model_fn call."""
    plugin = SlowModel()
    pm = _plugins.build_manager([], [plugin])
    models: list[Any] = []
    threads = [threading.Thread(target=lambda: models.append(_model.get_model(pm, "/m"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert plugin.calls == 1
    assert len(models) == 8
    assert all(model is models[0] for model in models)


def test_failed_load_is_remembered_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    """A model_fn that raised is not called again; every request gets 503 with the reason."""
    calls = []

    class Broken:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            calls.append(model_dir)
            raise OSError("weights.bin: no such file")

    pm = _plugins.build_manager([], [Broken()])
    for _ in range(2):
        with pytest.raises(_model.ModelLoadError, match=r"failed to load: OSError: weights.bin") as caught:
            _model.get_model(pm, "/m")
        assert caught.value.code == 503
    assert calls == ["/m"]
    assert "weights.bin: no such file" in caplog.text


def test_missing_model_directory_is_a_warning(caplog: pytest.LogCaptureFixture, tmp_path: Any) -> None:
    """model_fn still runs when the directory does not exist; a warning says so."""
    pm = _plugins.build_manager([])
    assert _model.get_model(pm, str(tmp_path / "absent")) is not None
    assert "does not exist" in caplog.text
    _model.cache_clear()
    caplog.clear()
    _model.get_model(pm, str(tmp_path))
    assert "does not exist" not in caplog.text


def test_models_are_kept_per_plugin_set() -> None:
    """Two plugin managers with different model_fn hooks get their own models for the same directory."""

    class A:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            return "a"

    class B:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            return "b"

    assert _model.get_model(_plugins.build_manager([], [A()]), "/m") == "a"
    assert _model.get_model(_plugins.build_manager([], [B()]), "/m") == "b"
