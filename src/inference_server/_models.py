"""Loaded models by name: each loaded once per process by the first caller (the others wait), and unloaded so that
its memory can go back.

A name maps to the pipeline whose ``model_fn`` loads it, its model directory and the model. Serving one model is
one entry, named by the pipeline's ``key`` (its plugin set, script and directory); a multi-model endpoint names its
own. The store holds the only reference it takes to a model: once unloaded, a model that nobody else holds is freed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Hashable
from typing import Any, Protocol

from inference_server.errors import ModelLoadError

logger = logging.getLogger("inference_server")

#: Whether loading a model warns about a missing directory (``serve`` warns once itself, not in every worker).
warn_missing_dir = True


class Loader(Protocol):
    """What loads a model: a pipeline's ``model_fn``."""

    def load_model(self, model_dir: str) -> Any: ...


class Entry:
    """One name's model: loaded at most once, by the first caller, while others wait; or why it failed."""

    __slots__ = ("error", "loaded", "lock", "model", "model_dir", "pipeline", "version")

    def __init__(self, pipeline: Loader, model_dir: str, version: Hashable = None) -> None:
        self.pipeline = pipeline
        self.model_dir = model_dir
        self.version = version
        self.lock = threading.Lock()
        self.loaded = False
        self.model: Any = None
        self.error: BaseException | None = None

    def get(self) -> Any:
        """The model, loading it now if nobody has; :class:`ModelLoadError` if its ``model_fn`` raised."""
        if not self.loaded:
            with self.lock:
                if not self.loaded and self.error is None:
                    self._load()
        if self.error is not None:
            raise ModelLoadError(f"the model failed to load: {type(self.error).__name__}: {self.error}")
        return self.model

    def _load(self) -> None:
        warning = missing_dir(self.model_dir) if warn_missing_dir else None
        if warning:
            logger.warning("%s", warning)
        logger.info("Loading the model from %s", self.model_dir)
        try:
            self.model = self.pipeline.load_model(self.model_dir)
        except Exception as exc:
            self.error = exc
            logger.exception("model_fn failed to load the model from %s", self.model_dir)
            return
        self.loaded = True
        logger.info("Loaded the model: %s", type(self.model).__name__)


class Models:
    """Models by name (see the module's text); safe to use from many threads."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, Entry] = {}
        self._lock = threading.Lock()

    def model(self, name: Hashable, pipeline: Loader, model_dir: str, version: Hashable = None) -> Any:
        """The model named ``name``, loaded by ``pipeline`` from ``model_dir`` the first time (by one caller while
        the others wait). A load that failed is not tried again here: each call raises :class:`ModelLoadError`
        until :meth:`load` tries again. A model loaded for another ``version`` (of the plugins) is dropped and
        loaded again."""
        entry = self._entries.get(name)
        if entry is not None and entry.loaded and entry.version == version:  # the hot path takes no lock
            return entry.model
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.version != version:
                entry = self._entries[name] = Entry(pipeline, model_dir, version)
        return entry.get()

    def load(self, name: Hashable, pipeline: Loader, model_dir: str) -> Any:
        """Load ``name`` now unless it is loaded (or loading): a load that failed before is tried again."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.error is not None:
                entry = self._entries[name] = Entry(pipeline, model_dir)
        return entry.get()

    def entry(self, name: Hashable) -> Entry | None:
        """What the store knows of ``name`` (loaded, loading or failed), or None."""
        return self._entries.get(name)

    def names(self) -> list[Hashable]:
        """The names of the loaded models, in the order they were first asked for."""
        with self._lock:
            return [name for name, entry in self._entries.items() if entry.loaded]

    def unload(self, name: Hashable) -> bool:
        """Forget ``name`` and its model (freed unless someone else holds it); False if the store had no such name.
        Requests already running keep the model they were given until they end."""
        with self._lock:
            return self._entries.pop(name, None) is not None

    def clear(self) -> None:
        """Forget every model."""
        with self._lock:
            self._entries.clear()


#: The process's models.
store = Models()


def missing_dir(model_dir: str) -> str | None:
    """The warning when ``model_dir`` does not exist (often a mistake, though model_fn may not need it), else None."""
    if os.path.isdir(model_dir):
        return None
    return f"Model directory {model_dir} does not exist; model_fn decides whether that matters"


def cache_clear() -> None:
    """Drop every loaded model, so that the next request calls ``model_fn`` again.

    Named as inference-server 1.x's ``inference_server._model.cache_clear()``, which tests written for 1.x call;
    :func:`inference_server.testing.reset` is the public name.
    """
    store.clear()
