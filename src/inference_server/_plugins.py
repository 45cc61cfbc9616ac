"""The plugin manager: the built-in defaults, discovery from the ``inference_server`` entry-point group, validation.

For every hook the first implementation returning something other than ``None`` wins; the built-in defaults in
:mod:`inference_server.default_plugin` are registered first and marked ``trylast``, so they always run last.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

import pluggy

from inference_server import default_plugin
from inference_server._hookspecs import ENTRY_POINT_GROUP, HOOK_NAMES, PROJECT, HookSpecs
from inference_server.errors import PluginError

logger = logging.getLogger(PROJECT)
_lock = threading.Lock()


#: Comma-separated entry-point names to load instead of every installed plugin ("" loads none).
PLUGINS_ENV = "INFERENCE_SERVER_PLUGINS"


def build_manager(names: Collection[str] | None = None, plugins: Iterable[object] = ()) -> pluggy.PluginManager:
    """A new plugin manager: the defaults, the installed plugins (only ``names`` if given), then ``plugins``."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(HookSpecs)
    pm.register(default_plugin, name="inference_server.default_plugin")
    entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    if names is not None:
        missing = set(names) - set(entry_points.names)
        if missing:
            raise PluginError(
                f"{PLUGINS_ENV} names {', '.join(sorted(missing))}, which no installed package provides "
                f"(installed plugins: {', '.join(sorted(entry_points.names)) or 'none'})"
            )
    for entry_point in entry_points:
        if names is None or entry_point.name in names:
            register(pm, _load(entry_point), name=entry_point.name)
    for plugin in plugins:
        register(pm, plugin)
    logger.debug("Plugins: %s", [pm.get_name(plugin) for plugin in pm.get_plugins()])
    return pm


@functools.cache
def _manager() -> pluggy.PluginManager:
    selected = os.environ.get(PLUGINS_ENV)
    names = None if selected is None else [name.strip() for name in selected.split(",") if name.strip()]
    return build_manager(names)


def manager() -> pluggy.PluginManager:
    """The process's plugin manager: the defaults and the installed plugins (see ``INFERENCE_SERVER_PLUGINS``).

    Raises :class:`PluginError` naming the plugin (and the hook) when a plugin cannot be loaded.
    """
    with _lock:  # functools.cache alone would let two threads load the plugins twice
        return _manager()


def first_result_caller(pm: pluggy.PluginManager, name: str) -> Callable[..., Any]:
    """A caller for hook ``name`` with pluggy's first-result rule, resolved once instead of on every call.

    The request path calls three hooks per request; pluggy's general machinery costs more than the hooks of a
    small model. Plugins with wrappers get pluggy's own caller.
    """
    caller = getattr(pm.hook, name)
    implementations = caller.get_hookimpls()
    if any(impl.hookwrapper or impl.wrapper for impl in implementations):
        return caller  # type: ignore[no-any-return]
    ordered = [(impl.function, impl.argnames) for impl in reversed(implementations)]  # pluggy calls last first

    def call(**kwargs: Any) -> Any:
        for function, argnames in ordered:
            result = function(*[kwargs[argname] for argname in argnames])
            if result is not None:
                return result
        return None

    return call


def _load(entry_point: importlib.metadata.EntryPoint) -> object:
    try:
        return entry_point.load()
    except Exception as exc:
        raise PluginError(
            f"plugin {entry_point.name!r} ({entry_point.value}) failed to import: {type(exc).__name__}: {exc}"
        ) from exc


def register(pm: pluggy.PluginManager, plugin: object, name: str | None = None) -> None:
    """Register ``plugin`` after checking that each of its hooks matches a spec; errors name plugin and hook."""
    if pm.is_registered(plugin):
        return  # the same module listed under two entry-point names
    label = name or getattr(plugin, "__name__", repr(plugin))
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {label!r}: {exc}") from exc
    except ValueError as exc:  # a second plugin with the same name
        raise PluginError(f"plugin {label!r}: {exc}") from exc
    for hook_name, caller in vars(pm.hook).items():
        if caller.spec is None and any(impl.plugin is plugin for impl in caller.get_hookimpls()):
            pm.unregister(plugin)
            raise PluginError(
                f"plugin {label!r}: hook {hook_name!r} is not an inference-server hook "
                f"(the hooks are {', '.join(HOOK_NAMES)})"
            )
