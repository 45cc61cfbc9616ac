"""The plugin manager: the built-in defaults, discovery from the ``inference_server`` entry-point group, validation.

For every hook the first implementation returning something other than ``None`` wins; the built-in defaults in
:mod:`inference_server.default_plugin` are registered first and marked ``trylast``, so they always run last.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any

import pluggy

from inference_server import _loop, default_plugin
from inference_server._hookspecs import ENTRY_POINT_GROUP, HOOK_NAMES, PROJECT, HookSpecs
from inference_server.errors import PluginError

logger = logging.getLogger(PROJECT)
_lock = threading.Lock()


#: Comma-separated entry-point names to load instead of every installed plugin ("" loads none); with a script (see
#: :func:`view`), the installed plugins to add to it.
PLUGINS_ENV = "INFERENCE_SERVER_PLUGINS"


#: The name the built-in defaults are registered under.
DEFAULTS_NAME = "inference_server.default_plugin"
#: Hooks called for every model or request: two implementations of one are worth a warning.
REQUEST_HOOKS = ("model_fn", "input_fn", "predict_fn", "output_fn", "ping_fn")


@dataclasses.dataclass(frozen=True)
class Source:
    """Where an installed plugin came from: its entry point's module and its distribution's version."""

    module: str
    distribution: str
    version: str


class PluginManager(pluggy.PluginManager):
    """pluggy's manager for our hooks, remembering which distribution each installed plugin came from."""

    def __init__(self) -> None:
        super().__init__(PROJECT)
        self.add_hookspecs(HookSpecs)
        #: Installed plugins (entry points) by registered name.
        self.sources: dict[str, Source] = {}
        #: Whether the installed plugins were named (``INFERENCE_SERVER_PLUGINS``), not all discovered.
        self.named = False
        #: Counts changes to the set of plugins: a model is loaded for one generation (see ``_pipeline``).
        self.generation = 0

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin`` (pluggy's method); the models loaded for this manager are loaded again. Its ``async def``
        hooks are made synchronous here, once (see :func:`_synchronize`)."""
        registered = super().register(plugin, name)
        if registered is not None:
            _synchronize(self, plugin)
        self.generation += 1
        return registered

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        """Unregister ``plugin`` (pluggy's method); the model it loaded is no longer served."""
        unregistered = super().unregister(plugin, name)
        self.generation += 1
        return unregistered


def _synchronize(pm: pluggy.PluginManager, plugin: object) -> None:
    """Make each of ``plugin``'s ``async def`` (or async generator) hook implementations one that runs it on the
    worker's event loop (:func:`_loop.synchronous`), where pluggy keeps it: every caller (:func:`first_result_caller`,
    :func:`call_model_fn`, pluggy's own with its wrappers and first-result rule) calls a sync function that returns
    the result, and an async one returning None falls through as a sync one does. Sync implementations are left as
    they are: nothing is added to their calls."""
    for hook_name, caller in vars(pm.hook).items():
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin:
                where = f"{impl.function.__module__}.{impl.function.__qualname__}"
                function = _loop.synchronous(impl.function, f"hook {hook_name} ({where})")
                if function is not impl.function:
                    setattr(impl, "function", function)  # noqa: B010 (HookImpl.function is Final to type checkers)


def build_manager(names: Collection[str] | None = None, plugins: Iterable[object] = ()) -> PluginManager:
    """A new plugin manager: the defaults, the installed plugins (only ``names`` if given), then ``plugins``."""
    pm = PluginManager()
    pm.named = names is not None
    pm.register(default_plugin, name=DEFAULTS_NAME)
    entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    if names is not None:
        missing = set(names) - set(entry_points.names)
        if missing:
            raise PluginError(
                f"--plugins ({PLUGINS_ENV}) names {', '.join(sorted(missing))}, which no installed package provides "
                f"(installed plugins: {', '.join(sorted(entry_points.names)) or 'none'})"
            )
    for entry_point in entry_points:
        if names is None or entry_point.name in names:
            register(pm, _load(entry_point), name=entry_point.name)
            dist = entry_point.dist
            pm.sources[entry_point.name] = Source(
                entry_point.value, dist.name if dist else "?", dist.version if dist else "?"
            )
    for plugin in plugins:
        register(pm, plugin)
    logger.debug("Plugins: %s", [pm.get_name(plugin) for plugin in pm.get_plugins()])
    return pm


def view(pm: pluggy.PluginManager, plugin: object, name: str) -> PluginManager:
    """A script's manager of its own: ``pm``'s plugins in the same order, then the script's ``plugin`` (so that its
    hooks run first). The installed plugins are left out unless they were named (``INFERENCE_SERVER_PLUGINS``):
    an AWS ``inference.py`` is the whole model, as in AWS's containers, and a plugin that happens to be installed
    in the same environment has no say in it. Plugins registered in code stay.

    What is registered into the view never reaches ``pm`` and its other views, so that two pipelines with two
    scripts never call each other's hooks or drop each other's models.
    """
    own = PluginManager()
    sources: dict[str, Source] = getattr(pm, "sources", {})
    named = getattr(pm, "named", True)  # a manager not built here: its plugins were chosen in code
    for registered_name, registered in pm.list_name_plugin():
        if registered is not None and (named or registered_name not in sources):
            own.register(registered, name=registered_name)
    own.named = named
    own.sources = dict(sources) if named else {}
    register(own, plugin, name=name)
    return own


@functools.cache
def _manager(selected: str | None) -> PluginManager:
    names = None if selected is None else [name.strip() for name in selected.split(",") if name.strip()]
    return build_manager(names)


def manager() -> PluginManager:
    """The process's plugin manager: the defaults and the installed plugins (see ``INFERENCE_SERVER_PLUGINS``).

    One manager per value of ``INFERENCE_SERVER_PLUGINS``, so that tests selecting plugins get what they select.
    Raises :class:`PluginError` naming the plugin (and the hook) when a plugin cannot be loaded.
    """
    with _lock:  # functools.cache alone would let two threads load the plugins twice
        return _manager(os.environ.get(PLUGINS_ENV))


def call_model_fn(pm: pluggy.PluginManager, model_dir: str) -> Any:
    """``model_fn``'s model, where a plugin's ``model_fn`` returning None is an error, not "not mine".

    pluggy's first-result rule would fall through to the built-in echo model, serving it silently in place of the
    plugin's. Several plugins may still share the work: the first that returns a model wins.
    """
    implementations = pm.hook.model_fn.get_hookimpls()
    ours = [impl for impl in implementations if impl.plugin_name != DEFAULTS_NAME]
    if not ours or any(impl.hookwrapper or impl.wrapper for impl in implementations):
        return pm.hook.model_fn(model_dir=model_dir)
    for impl in reversed(ours):  # pluggy's order: the last registered first
        model = impl.function(*[{"model_dir": model_dir}[name] for name in impl.argnames])
        if model is not None:
            return model
    raise TypeError(
        f"model_fn of {' and '.join(repr(impl.plugin_name) for impl in reversed(ours))} returned None: "
        "return the model (an object the predict_fn hook can call), or raise if it cannot be loaded"
    )


def providers(pm: pluggy.PluginManager, hook: str) -> list[str]:
    """The plugins implementing ``hook`` in the order pluggy calls them (the built-in defaults last)."""
    return [impl.plugin_name for impl in reversed(getattr(pm.hook, hook).get_hookimpls())]


def _label(pm: pluggy.PluginManager, name: str, hook: str) -> str:
    """How the summary names the provider of ``hook``: a plugin that says who provides which hook (a script, for
    the functions it lacks) is named with it."""
    if name == DEFAULTS_NAME:
        return "built-in"
    provider = getattr(pm.get_plugin(name), "providers", {}).get(hook)
    return f"{name} ({provider})" if provider else name


def describe(pm: pluggy.PluginManager) -> list[str]:
    """What the plugins are and which of them provides each hook, one line each (the start-up summary)."""
    sources: dict[str, Source] = getattr(pm, "sources", {})
    lines = []
    names = [name for name, plugin in pm.list_name_plugin() if name != DEFAULTS_NAME and plugin is not None]
    for name in names:
        source = sources.get(name)
        where = getattr(pm.get_plugin(name), "description", None) or "registered in code"
        if source:
            where = f"{source.distribution} {source.version}, module {source.module}"
        lines.append(f"plugin {name} ({where})")
    if not names:
        lines.append("plugins: none (the built-in hooks only)")
    for hook in HOOK_NAMES:
        lines.append(f"hook {hook}: {', then '.join(_label(pm, name, hook) for name in providers(pm, hook))}")
    return lines


#: A requirement on inference-server that 2.x does not meet: ``<2``, ``<2.0``, ``<=1.x``, ``==1.x``, ``~=1.x``.
_FOR_1X = re.compile(r"^inference[-_.]server\b[^;]*(<\s*2(\.0)*\s*(,|$|;)|<=\s*1\.|==\s*1\.|~=\s*1\.)", re.IGNORECASE)


def written_for_1x(pm: pluggy.PluginManager) -> list[str]:
    """The installed plugins whose distribution requires inference-server 1.x (``inference-server<2`` and the like):
    written for 1.x's pass-through input_fn and output_fn."""
    sources: dict[str, Source] = getattr(pm, "sources", {})
    found = []
    for name, source in sources.items():
        try:
            requirements = importlib.metadata.requires(source.distribution) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        if any(_FOR_1X.match(requirement.strip()) for requirement in requirements):
            found.append(name)
    return found


def problems(pm: pluggy.PluginManager) -> list[str]:
    """Mistakes in the plugin set that would otherwise serve a wrong answer silently, one warning each."""
    warnings = []
    if providers(pm, "model_fn") == [DEFAULTS_NAME]:
        warnings.append("serving the built-in echo model: no installed plugin implements model_fn")
    for name, plugin in pm.list_name_plugin():
        if name == DEFAULTS_NAME or plugin is None:
            continue
        implemented = {hook for hook in HOOK_NAMES if name in providers(pm, hook)}
        if implemented:
            continue
        unmarked = [hook for hook in HOOK_NAMES if callable(getattr(plugin, hook, None))]
        looks = "looks like a hook but lacks" if len(unmarked) == 1 else "look like hooks but lack"
        hint = f"; {', '.join(unmarked)} {looks} the @inference_server.plugin_hook decorator" if unmarked else ""
        warnings.append(f"plugin {name!r} implements no hook{hint}")
    for hook in REQUEST_HOOKS:
        ours = [name for name in providers(pm, hook) if name != DEFAULTS_NAME]
        if len(ours) > 1:
            warnings.append(
                f"{hook} is implemented by {len(ours)} plugins: {ours[0]!r} runs first and wins whenever "
                f"it returns something other than None; then {', '.join(repr(name) for name in ours[1:])}"
            )
    return warnings


def first_result_caller(pm: pluggy.PluginManager, name: str) -> Callable[..., Any]:
    """A caller for hook ``name`` with pluggy's first-result rule, resolved once instead of on every call; it takes
    the hook's arguments by position, in the order of its spec.

    The request path calls three hooks per request; pluggy's general machinery costs more than the hooks of a
    small model. An implementation taking all of the spec's arguments in its order is called with them as they
    are; one taking fewer gets its own. Plugins with wrappers get pluggy's own caller.
    """
    caller = getattr(pm.hook, name)
    argnames: tuple[str, ...] = caller.spec.argnames
    implementations = caller.get_hookimpls()
    if any(impl.hookwrapper or impl.wrapper for impl in implementations):
        return lambda *args: caller(**dict(zip(argnames, args, strict=True)))
    ordered = [  # pluggy calls last first
        (impl.function, None if tuple(impl.argnames) == argnames else tuple(map(argnames.index, impl.argnames)))
        for impl in reversed(implementations)
    ]

    if len(ordered) == 2 and ordered[0][1] is None and ordered[1][1] is None:  # a plugin's, then the defaults'
        (first, _), (then, _) = ordered

        def call_two(*args: Any) -> Any:
            result = first(*args)
            return then(*args) if result is None else result

        return call_two

    def call(*args: Any) -> Any:
        for function, picked in ordered:
            result = function(*args) if picked is None else function(*[args[index] for index in picked])
            if result is not None:
                return result
        return None

    return call


def async_caller(pm: pluggy.PluginManager, name: str) -> Callable[..., Awaitable[Any]] | None:
    """For a hook with an ``async def`` implementation, a caller with pluggy's first-result rule to await on the event
    loop: the async implementations are awaited there, the sync ones (built-in defaults below a plugin's) called
    inline. None when no implementation is async, or a plugin wraps the hook (then it runs as a sync call)."""
    implementations = getattr(pm.hook, name).get_hookimpls()
    if any(impl.hookwrapper or impl.wrapper for impl in implementations):
        return None
    if not any(_loop.asynchronous(impl.function) for impl in implementations):
        return None
    argnames: tuple[str, ...] = getattr(pm.hook, name).spec.argnames
    ordered = [
        (
            _loop.asynchronous(impl.function),
            impl.function,
            None if tuple(impl.argnames) == argnames else tuple(map(argnames.index, impl.argnames)),
        )
        for impl in reversed(implementations)
    ]

    async def call(*args: Any) -> Any:
        for awaited, function, picked in ordered:
            given = args if picked is None else [args[index] for index in picked]
            result = await awaited(*given) if awaited is not None else function(*given)
            if result is not None:
                return result
        return None

    return call


def is_default(pm: pluggy.PluginManager, name: str) -> bool:
    """Whether hook ``name`` has only the built-in implementation (quick, and ours: it may run on the event loop)."""
    return all(impl.plugin_name == DEFAULTS_NAME for impl in getattr(pm.hook, name).get_hookimpls())


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
