"""Models by name: loaded once per process even under concurrent first requests, unloaded so that they are freed,
and a failed load remembered until it is tried again."""

import gc
import threading
import time
import weakref
from typing import Any

import pytest

from inference_server import _models, _plugins, plugin_hook
from inference_server._pipeline import Pipeline
from inference_server._settings import Settings


class SlowModel:
    def __init__(self) -> None:
        self.calls = 0

    @plugin_hook
    def model_fn(self, model_dir: str) -> Any:
        self.calls += 1
        time.sleep(0.2)
        return object()


class Model:
    """A model object that a weak reference can follow."""


class Loader:
    """Loads a new :class:`Model` per call, or raises while ``failing``."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.failing = False

    def load_model(self, model_dir: str) -> Any:
        self.calls.append(model_dir)
        if self.failing:
            raise OSError("weights.bin: no such file")
        return Model()


def _pipeline(*plugins: object, model_dir: str = "/m") -> Pipeline:
    return Pipeline(Settings(model_dir=model_dir), _plugins.build_manager([], plugins))


def test_concurrent_first_requests_load_once() -> None:
    """Eight threads asking at once get the same model from a single model_fn call."""
    plugin = SlowModel()
    pipeline = _pipeline(plugin)
    models: list[Any] = []
    threads = [threading.Thread(target=lambda: models.append(pipeline.model())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert plugin.calls == 1
    assert len(models) == 8
    assert all(model is models[0] for model in models)


def test_failed_load_is_remembered_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    """A model_fn that raised is not called again by requests; every request gets 503 with the reason."""
    calls = []

    class Broken:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            calls.append(model_dir)
            raise OSError("weights.bin: no such file")

    pipeline = _pipeline(Broken())
    for _ in range(2):
        with pytest.raises(_models.ModelLoadError, match=r"failed to load: OSError: weights.bin") as caught:
            pipeline.model()
        assert caught.value.code == 503
    assert calls == ["/m"]
    assert "weights.bin: no such file" in caplog.text


def test_a_failed_load_is_tried_again_by_loading_again() -> None:
    """``load`` after a failure calls model_fn again, and the name serves the model it then loads."""
    store, loader = _models.Models(), Loader()
    loader.failing = True
    with pytest.raises(_models.ModelLoadError):
        store.load("a", loader, "/a")
    with pytest.raises(_models.ModelLoadError):
        store.model("a", loader, "/a")
    loader.failing = False
    model = store.load("a", loader, "/a")
    assert isinstance(model, Model)
    assert store.model("a", loader, "/a") is model
    assert loader.calls == ["/a", "/a"]


def test_unload_releases_the_model() -> None:
    """After ``unload`` the store holds no reference: the model object is freed, and the name loads anew."""
    store, loader = _models.Models(), Loader()
    reference = weakref.ref(store.load("a", loader, "/a"))
    other = store.load("b", loader, "/b")
    assert store.names() == ["a", "b"]
    assert store.unload("a") is True
    gc.collect()
    assert reference() is None
    assert store.names() == ["b"]
    assert store.unload("a") is False
    assert store.model("b", loader, "/b") is other
    assert store.model("a", loader, "/a") is not None
    assert loader.calls == ["/a", "/b", "/a"]


def test_entries_say_what_loads_each_name() -> None:
    """An entry names its loader and directory; a name never asked for has none."""
    store, loader = _models.Models(), Loader()
    store.load("a", loader, "/a")
    entry = store.entry("a")
    assert entry is not None
    assert (entry.pipeline, entry.model_dir, entry.loaded) == (loader, "/a", True)
    assert store.entry("b") is None


def test_cache_clear_forgets_every_model() -> None:
    """1.x's ``_model.cache_clear()`` empties the process's store, so the next request calls model_fn again."""
    from inference_server import _model

    plugin = SlowModel()
    pipeline = _pipeline(plugin)
    pipeline.model()
    _model.cache_clear()
    pipeline.model()
    assert plugin.calls == 2


def test_missing_model_directory_is_a_warning(caplog: pytest.LogCaptureFixture, tmp_path: Any) -> None:
    """model_fn still runs when the directory does not exist; a warning says so."""
    assert _pipeline(model_dir=str(tmp_path / "absent")).model() is not None
    assert "does not exist" in caplog.text
    caplog.clear()
    _pipeline(model_dir=str(tmp_path)).model()
    assert "does not exist" not in caplog.text


def test_models_are_kept_per_plugin_set() -> None:
    """Two plugin sets with different model_fn hooks get their own models for the same directory."""

    class A:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            return "a"

    class B:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            return "b"

    assert _pipeline(A()).model() == "a"
    assert _pipeline(B()).model() == "b"


def test_registering_a_plugin_loads_the_model_again_and_frees_the_old_one() -> None:
    """Registering (or unregistering) a plugin of the manager makes its pipelines, old and new, load the model again
    with the plugins now registered, and the old model is freed, as 1.x's cache did."""

    class Fresh:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            return Model()

    class Other:
        @plugin_hook
        def ping_fn(self, model: Any) -> bool:
            return True

    pm = _plugins.build_manager([], [Fresh()])
    pipeline = Pipeline(Settings(model_dir="/m"), pm)
    first = weakref.ref(pipeline.model())
    other = Other()
    pm.register(other)
    second = pipeline.model()
    assert second is not first()
    gc.collect()
    assert first() is None
    pm.unregister(other)
    assert pipeline.model() is not second
    assert Pipeline(Settings(model_dir="/m"), pm).model() is pipeline.model()
