"""Loading the model once per process (thread-safe), and remembering why it failed if it did."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import pluggy

from inference_server import _plugins
from inference_server.errors import ModelLoadError

logger = logging.getLogger("inference_server")


class _Slot:
    """One (plugin manager, model directory)'s model: loaded at most once, by the first caller, while others wait."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm  # held so that the id in the key is not reused while the slot lives
        #: The manager's plugin set when the slot was made: registering or unregistering a plugin makes it stale.
        self.generation = _generation(pm)
        self.lock = threading.Lock()
        self.loaded = False
        self.model: Any = None
        self.error: BaseException | None = None


_slots: dict[tuple[int, str], _Slot] = {}
_slots_lock = threading.Lock()


def get_model(pm: pluggy.PluginManager, model_dir: str) -> Any:
    """Return the model of these plugins for ``model_dir``, calling ``model_fn`` the first time only.

    A ``model_fn`` that raised is not retried: every later call raises :class:`ModelLoadError`. Registering or
    unregistering a plugin of ``pm`` forgets its model, so a plugin a test unregistered no longer serves its model.
    """
    key = (id(pm), model_dir)
    slot = _slots.get(key)
    generation = _generation(pm)
    if slot is not None and slot.loaded and slot.generation == generation:  # the hot path takes no lock
        return slot.model
    with _slots_lock:
        slot = _slots.get(key)
        if slot is None or slot.generation != generation:
            slot = _slots[key] = _Slot(pm)
    with slot.lock:
        if not slot.loaded and slot.error is None:
            _load(pm, model_dir, slot)
    if slot.error is not None:
        raise ModelLoadError(f"the model failed to load: {type(slot.error).__name__}: {slot.error}")
    return slot.model


#: Whether loading a model warns about a missing directory (``serve`` warns once itself, not in every worker).
warn_missing_dir = True


def check_model_dir(model_dir: str) -> None:
    """Warn when ``model_dir`` does not exist: often a mistake, though model_fn may not need it."""
    if not os.path.isdir(model_dir):
        logger.warning("Model directory %s does not exist; model_fn decides whether that matters", model_dir)


def _load(pm: pluggy.PluginManager, model_dir: str, slot: _Slot) -> None:
    if warn_missing_dir:
        check_model_dir(model_dir)
    logger.info("Loading the model from %s", model_dir)
    try:
        slot.model = _plugins.call_model_fn(pm, model_dir)
    except Exception as exc:
        slot.error = exc
        logger.exception("model_fn failed; /ping answers 503 and /invocations 503 until restart")
        return
    slot.loaded = True
    logger.info("Loaded the model: %s", type(slot.model).__name__)


def _generation(pm: pluggy.PluginManager) -> int:
    return getattr(pm, "generation", 0)


def cache_clear() -> None:
    """Drop every loaded model, so that the next request calls ``model_fn`` again.

    Named as inference-server 1.x's ``inference_server._model.cache_clear()``, which tests written for 1.x call;
    :func:`inference_server.testing.reset` is the public name.
    """
    with _slots_lock:
        _slots.clear()
