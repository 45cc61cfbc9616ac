"""Serving an ``inference.py`` written for AWS's framework containers (the SageMaker inference toolkit's contract).

The script is found as ``--script PATH``, else as ``SAGEMAKER_PROGRAM`` in ``MODEL_DIR/code``, else in
``SAGEMAKER_SUBMIT_DIRECTORY`` when that is a local directory. Its functions become a plugin, called as the toolkit
calls them:

- ``model_fn(model_dir[, context])``, ``input_fn(input_data, content_type[, context])``,
  ``predict_fn(data, model[, context])``, ``output_fn(prediction, accept[, context])``, or
  ``transform_fn(model, input_data, content_type, accept[, context])`` instead of the last three (not both);
  ``pre_model_fn(model_dir[, context])`` before ``model_fn`` and ``model_warmup_fn(model_dir, model[, context])``
  after it, when defined; and inference-server's ``model_metadata(model)`` (the Open Inference Protocol's signature),
  when defined;
- JSON and CSV bodies reach ``input_fn`` and ``transform_fn`` as ``str`` (UTF-8), other bodies as ``bytes``;
  ``accept`` is the request's ``Accept``, or ``SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT`` (else ``application/json``)
  when it is missing or ``*/*``;
- ``output_fn`` and ``transform_fn`` return the body (bytes or str, sent as ``accept``) or ``(body, content_type)``;
- an exception with an integer ``status_code`` (the toolkit's ``BaseInferenceToolkitError`` and its kind) answers
  that status with its ``message``;
- the modules beside it (``code/utils.py``) are imported as the toolkit imports them, its directory first on
  ``sys.path``, and each script's are its own when one process loads several (:class:`Siblings`);
- a function the script lacks is ours (the built-in hooks), or with ``--script-defaults sklearn``, ``xgboost``,
  ``pytorch`` or ``huggingface`` that container's default (``containers``); ``model_fn`` the script must define
  unless the container has a default for it (PyTorch, Hugging Face), and then no script is needed at all.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import functools
import importlib.machinery
import importlib.util
import inspect
import logging
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple, TypeVar

import werkzeug.exceptions
from werkzeug.datastructures import MIMEAccept

from inference_server import _loop, batching, codecs, containers, default_plugin
from inference_server._hookspecs import plugin_hook
from inference_server._settings import Settings
from inference_server.errors import PluginError

logger = logging.getLogger("inference_server")

#: The bodies the toolkit hands to the script as text.
TEXT_TYPES = ("application/json", "text/csv")
FUNCTIONS = (
    "model_fn",
    "input_fn",
    "predict_fn",
    "output_fn",
    "transform_fn",
    "pre_model_fn",
    "model_warmup_fn",
    "model_metadata",
)
_lock = threading.Lock()


def find(settings: Settings) -> Path | None:
    """The script to serve, if any: ``--script``, else ``SAGEMAKER_PROGRAM`` in ``MODEL_DIR/code``, else in a local
    ``SAGEMAKER_SUBMIT_DIRECTORY``. A script named but not found is a :class:`PluginError`."""
    env = os.environ
    if settings.script:
        path = Path(settings.script)
        if not path.is_file():
            raise PluginError(f"--script {settings.script}: no such file")
        return path.resolve()
    program = env.get("SAGEMAKER_PROGRAM", "").strip()
    if not program:
        return None
    name = program if program.endswith(".py") else f"{program}.py"
    places = [Path(settings.model_dir) / "code"]
    submit = env.get("SAGEMAKER_SUBMIT_DIRECTORY", "").strip()
    if submit and "://" not in submit:
        places.append(Path(submit))
    for place in places:
        if (place / name).is_file():
            return (place / name).resolve()
    raise PluginError(
        f"SAGEMAKER_PROGRAM={program}: no {name} in {' or '.join(str(place) for place in places)}"
        + ("" if not submit or "://" not in submit else f" (SAGEMAKER_SUBMIT_DIRECTORY {submit} is not local)")
    )


def install_requirements(script: Path) -> None:
    """``pip install -r requirements.txt`` beside ``script``; a failure raises :class:`PluginError` with pip's
    last lines."""
    requirements = script.parent / "requirements.txt"
    if not requirements.is_file():
        logger.info("--install-requirements: no %s; nothing to install", requirements)
        return
    logger.info("Installing %s", requirements)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-r", str(requirements)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")][-5:]
        raise PluginError(f"installing {requirements} failed (pip exit status {done.returncode}): {' '.join(last)}")


class RequestProcessor:
    """The request's properties as the toolkit's context holds them (``Content-Type`` and ``Accept``)."""

    def __init__(self, properties: dict[str, str]) -> None:
        self._properties = properties

    def get_request_properties(self) -> dict[str, str]:
        return self._properties

    def get_request_property(self, key: str) -> str | None:
        return self._properties.get(key)


class Context:
    """What the toolkit passes as ``context``: ``system_properties`` (``model_dir``, ``gpu_id``, ``batch_size``,
    ``server_name``), ``model_name``, the request's properties (``request_processor``, ``get_request_header``) and
    the response's content type (``set_response_content_type``)."""

    def __init__(self, model_dir: str, properties: dict[str, str] | None = None) -> None:
        self.system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": None,
            "batch_size": 1,
            "server_name": "inference-server",
        }
        self.model_name = "model"
        self.manifest: dict[str, Any] = {}
        self.request_processor = [RequestProcessor(dict(properties or {}))]
        self.response_content_type: str | None = None

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self.request_processor[idx].get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        return self.request_processor[idx].get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.response_content_type = value

    def get_response_content_type(self, idx: int) -> str | None:
        return self.response_content_type


class _GroupContext(Context):
    """A micro-batched group's context: the i-th request's headers, and its response content type, are those of
    the i-th member's own context (which its output_fn reads)."""

    def __init__(self, model_dir: str, members: list[Context]) -> None:
        super().__init__(model_dir)
        self.members = members
        self.system_properties["batch_size"] = len(members)
        self.request_processor = [member.request_processor[0] for member in members]

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.members[idx].set_response_content_type(0, value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.members[idx].get_response_content_type(0)


#: The running request's context: set by input_fn, read by predict_fn and output_fn. Each request runs its hooks in
#: a context of its own (``_pipeline``), so it is never seen by another request.
_request: contextvars.ContextVar[Context] = contextvars.ContextVar("inference_server_script_request")


def _takes_context(function: Callable[..., Any], given: int) -> bool:
    """Whether ``function`` takes one argument more than the ``given`` (the toolkit's rule: counted parameters)."""
    count = len(inspect.signature(function).parameters)
    if count == given + 1:
        return True
    if count != given:
        raise PluginError(f"{function.__name__} takes {count} arguments; the toolkit passes {given} or {given + 1}")
    return False


def _status_error(exc: Exception) -> werkzeug.exceptions.HTTPException | None:
    """A toolkit error's own status (an integer ``status_code`` from 400 to 599) as an HTTP exception."""
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int) or not 400 <= status <= 599:
        return None
    error = werkzeug.exceptions.HTTPException(str(getattr(exc, "message", None) or exc))
    error.code = status
    return error


#: What a script's model_fn that returned None gives as the model (its functions get None back).
_NO_MODEL = object()


class _Deferred:
    """A body for ``transform_fn``, carried from input_fn through predict_fn to output_fn (which knows Accept)."""

    def __init__(self, data: Any, content_type: str) -> None:
        self.data, self.content_type, self.model = data, content_type, None


class ScriptPlugin:
    """The script's functions as inference-server hooks (those the script defines, and ``defaults`` for the rest
    unless it defines transform_fn); with no script (``module`` None), the container's defaults alone."""

    def __init__(
        self,
        module: ModuleType | None,
        model_dir: str,
        defaults: str = "inference-server",
        siblings: Siblings | None = None,
    ) -> None:
        self.model_dir = model_dir
        self._siblings = siblings
        where = module.__file__ if module is not None else f"--script-defaults {defaults}"
        functions = {name: getattr(module, name) for name in FUNCTIONS if callable(getattr(module, name, None))}
        if "transform_fn" in functions and {"input_fn", "predict_fn", "output_fn"} & set(functions):
            raise PluginError(
                f"{where}: transform_fn cannot be used with input_fn, predict_fn or output_fn (as in the "
                "SageMaker inference toolkit): define transform_fn alone, or the other three"
            )
        container = containers.DEFAULTS[defaults]
        if "transform_fn" in functions:
            container = {name: function for name, function in container.items() if name == "model_fn"}
        #: Who provides each hook, for the start-up summary.
        self.providers = {name: "the script's" for name in functions}
        self.providers |= {name: f"the {defaults} container's default" for name in container.keys() - functions.keys()}
        if "transform_fn" in functions:
            self.providers |= dict.fromkeys(("input_fn", "predict_fn", "output_fn"), "the script's transform_fn")
        self.providers.setdefault("input_fn", "the built-in, starting the script's context")
        #: What the plugin is, for the start-up summary.
        self.description = f"{where}, functions the script lacks from --script-defaults {defaults}"
        if module is None:
            self.description = f"the {defaults} container's defaults, no script"
        functions = {**container, **functions}
        if "model_fn" not in functions:
            raise PluginError(f"{where} defines no model_fn: define model_fn(model_dir) to load the model")
        arity = {"model_fn": 1, "input_fn": 2, "predict_fn": 2, "output_fn": 2, "transform_fn": 4}
        arity |= {"pre_model_fn": 1, "model_warmup_fn": 2, "model_metadata": 1}
        self.context = {name: _takes_context(function, arity[name]) for name, function in functions.items()}
        #: The functions called: an ``async def`` (or async generator) one runs on the worker's event loop.
        self.functions = {
            name: _loop.synchronous(function, f"{name} of {where}") for name, function in functions.items()
        }
        self.default_accept = (
            containers.FIXED_ACCEPT.get(defaults)
            or os.environ.get("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT")
            or "application/json"
        )
        self.model_fn = plugin_hook(lambda model_dir: self._model_fn(model_dir))
        # input_fn starts each request's context, so it is ours whenever a later function takes the context
        if functions.keys() & {"input_fn", "transform_fn"} or any(self.context.values()):
            self.input_fn = plugin_hook(lambda input_data, content_type: self._input_fn(input_data, content_type))
        if functions.keys() & {"predict_fn", "transform_fn"}:
            self.predict_fn = plugin_hook(lambda data, model: self._predict_fn(data, model))
        if functions.keys() & {"output_fn", "transform_fn"}:
            self.output_fn = plugin_hook(lambda prediction, accept: self._output_fn(prediction, accept))
        if "model_metadata" in functions:
            self.model_metadata = plugin_hook(lambda model: self._call("model_metadata", model))

    def _call(self, name: str, *args: Any, context: Context | None = None) -> Any:
        if self.context[name]:
            args = (*args, context if context is not None else self._context())
        try:
            return self.functions[name](*args)
        except Exception as exc:
            error = _status_error(exc)
            if error is None:
                raise
            raise error from exc

    def _context(self) -> Context:
        """The running request's context; for a micro-batched group's ``predict_fn``, the group's, whose i-th
        request processor is the i-th request's (as TorchServe's batched context)."""
        members = batching.members()
        if members is None:
            return _request.get(None) or Context(self.model_dir)
        return _GroupContext(self.model_dir, [member.get(_request) or Context(self.model_dir) for member in members])

    def _model_fn(self, model_dir: str) -> Any:
        if self._siblings is not None:  # its modules its own while it loads (unpickling finds their classes)
            return self._siblings.run(lambda: self._load_model(model_dir))
        return self._load_model(model_dir)

    def _load_model(self, model_dir: str) -> Any:
        context = Context(model_dir)
        if "pre_model_fn" in self.functions:
            self._call("pre_model_fn", model_dir, context=context)
        model = self._call("model_fn", model_dir, context=context)
        if "model_warmup_fn" in self.functions:
            self._call("model_warmup_fn", model_dir, model, context=context)
        return _NO_MODEL if model is None else model  # the toolkit allows None; for a plugin it is a failed load

    def _input_fn(self, input_data: Any, content_type: str) -> Any:
        context = Context(self.model_dir, {"Content-Type": content_type})
        _request.set(context)
        if "input_fn" not in self.functions and "transform_fn" not in self.functions:
            return default_plugin.input_fn(input_data, content_type)  # only here to start the context
        bare = codecs.bare(content_type)
        data: Any = bytes(input_data)
        if bare in TEXT_TYPES:
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise werkzeug.exceptions.BadRequest(f"the {bare} body is not UTF-8: {exc}") from None
        if "transform_fn" in self.functions:
            return _Deferred(data, content_type)
        return self._call("input_fn", data, content_type, context=context)

    def _predict_fn(self, data: Any, model: Any) -> Any:
        model = None if model is _NO_MODEL else model
        if isinstance(data, _Deferred):
            data.model = model
            return data
        return self._call("predict_fn", data, model)

    def _output_fn(self, prediction: Any, accept: MIMEAccept) -> tuple[Any, str]:
        wanted = accept.to_header() if accept else ""
        if not wanted or wanted == "*/*":
            wanted = self.default_accept
        context = _request.get(None)
        if context is not None:
            context.request_processor[0].get_request_properties()["Accept"] = wanted
        if isinstance(prediction, _Deferred):
            args = (prediction.model, prediction.data, prediction.content_type, wanted)
            result = self._call("transform_fn", *args, context=context)
        else:
            result = self._call("output_fn", prediction, wanted, context=context)
        if isinstance(result, tuple) and len(result) == 2:
            return result[0], str(result[1])
        chosen = context.response_content_type if context is not None else None
        return result, chosen or wanted


#: Held while ``sys.modules`` holds one script's sibling modules in place of another's (see :class:`Siblings`).
_imports = threading.RLock()
#: The modules imported from a script's directory, whoever's: another script's are taken out of the way.
_from_scripts: weakref.WeakSet[ModuleType] = weakref.WeakSet()
_T = TypeVar("_T")


class Siblings:
    """A script's own modules: those of its directory (a ``utils.py``, a package), each script's its own.

    The toolkit imports the script with its directory first on ``sys.path``, into the process's one ``sys.modules``:
    two scripts of one process (a model directory each, through ``create_app``) that both ``import utils`` would
    both get the first one's. Here the script's import, and its ``model_fn`` (which may unpickle objects of its
    modules' classes), run with its directory first on ``sys.path`` and the modules of another script's directory
    that bear its modules' names out of ``sys.modules`` (:meth:`run`); an ``import`` in the script's functions finds
    its own through the script's own ``__import__``. A name that no other script's module had stays the script's in
    ``sys.modules``, as the toolkit leaves it. Modules that did not come from a script's directory (the standard
    library, installed packages) are never moved.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._prefix = os.path.join(directory, "")
        #: The top-level names of the modules the directory holds.
        self.names = _module_names(directory)
        #: This script's modules by name (its own included), once imported.
        self.modules: dict[str, ModuleType] = {}

    def run(self, call: Callable[[], _T]) -> _T:
        """``call()`` with this script's modules in ``sys.modules`` in place of other scripts' of the same names, and
        its directory first on ``sys.path``; the modules it imports from the directory are kept as this script's."""
        with _imports:
            names = self.names
            stashed = {
                key: module
                for key, module in list(sys.modules.items())
                if key.partition(".")[0] in names and module in _from_scripts and self.modules.get(key) is not module
            }
            for key in stashed:
                del sys.modules[key]
            for key, module in self.modules.items():
                sys.modules.setdefault(key, module)
            present = set(sys.modules)
            sys.path.insert(0, str(self.directory))
            try:
                return call()
            finally:
                with contextlib.suppress(ValueError):
                    sys.path.remove(str(self.directory))  # the copy put first here; the toolkit's stays
                for key in set(sys.modules) - present:
                    module = sys.modules[key]
                    if key.partition(".")[0] in names and self._holds(module):
                        self.modules[key] = module
                        _from_scripts.add(module)
                sys.modules.update(stashed)

    def _holds(self, module: ModuleType) -> bool:
        """Whether ``module`` was imported from this directory (a namespace package: one of its portions)."""
        places = [getattr(module, "__file__", None) or "", *getattr(module, "__path__", [])]
        return any(str(place).startswith(self._prefix) for place in places)

    def builtins(self) -> dict[str, Any]:
        """The script's builtins: the process's, with an ``__import__`` that gives the script its own modules."""
        names, modules = self.names, self.modules

        def __import__(
            name: str,
            globals: Any = None,
            locals: Any = None,
            fromlist: Sequence[str] | None = (),
            level: int = 0,
        ) -> ModuleType:
            top = name.partition(".")[0]
            if level != 0 or top not in names:
                return builtins.__import__(name, globals, locals, fromlist or (), level)
            module, package = modules.get(name), modules.get(top)
            if module is not None and package is not None and all(hasattr(module, item) for item in fromlist or ()):
                return module if fromlist else package
            present = sys.modules.get(top)
            if present is not None and present not in _from_scripts:  # not a script's: what the toolkit gives too
                return builtins.__import__(name, globals, locals, fromlist or (), level)
            return self.run(lambda: builtins.__import__(name, globals, locals, fromlist or (), level))

        return {**vars(builtins), "__import__": __import__}


def _module_names(directory: Path) -> set[str]:
    """The top-level names of the modules and packages in ``directory``."""
    suffixes = tuple(importlib.machinery.all_suffixes())
    names = set()
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            name = entry.name if entry.is_dir() else entry.name.partition(".")[0]
            if name.isidentifier() and not name.startswith("__") and (entry.is_dir() or entry.name.endswith(suffixes)):
                names.add(name)
    return names


@functools.cache
def _load(path: Path) -> tuple[ModuleType, Siblings]:
    """Import the script as a module of its own, its directory's modules its own (:class:`Siblings`), the directory
    left on ``sys.path`` as the toolkit has it."""
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"{path}: cannot be imported as a Python module")
    loader = spec.loader
    module = importlib.util.module_from_spec(spec)
    siblings = Siblings(path.parent)
    module.__dict__["__builtins__"] = siblings.builtins()  # what its functions import with
    siblings.modules[path.stem] = module
    _from_scripts.add(module)
    try:
        siblings.run(lambda: loader.exec_module(module))
    except Exception as exc:
        raise PluginError(f"{path} failed to import: {type(exc).__name__}: {exc}") from exc
    return module, siblings


class Script(NamedTuple):
    """The script a pipeline serves, as a plugin of its own."""

    #: The name it is registered under: ``script:PATH``, or ``defaults:NAME`` for a container's defaults alone.
    name: str
    plugin: ScriptPlugin
    path: Path | None


def plugin(settings: Settings) -> Script | None:
    """The script ``settings`` point to, as a plugin (not registered anywhere: each pipeline has its own view). With
    no script, a container whose defaults load the model (``--script-defaults pytorch`` or ``huggingface``) is the
    plugin alone, as the container serves a model directory without ``inference.py``."""
    path = find(settings)
    if path is None and "model_fn" not in containers.DEFAULTS[settings.script_defaults]:
        return None
    name = f"script:{path}" if path is not None else f"defaults:{settings.script_defaults}"
    with _lock:
        module, siblings = _load(path) if path is not None else (None, None)
    return Script(name, ScriptPlugin(module, settings.model_dir, settings.script_defaults, siblings), path)
