"""One worker's side of a multi-model endpoint: models loaded by name, lazily, within a memory budget.

SageMaker's "Custom Containers Contract for Multi-Model Endpoints" (mms-container-apis in its developer guide) loads
and unloads models through the container's ``/models`` API and invokes them at ``/models/{name}/invoke``; the
``model_name`` is opaque. Here:

- A load (``POST /models``) runs ``model_fn(url)`` in the worker that got it, then registers the model in the
  server's :class:`~inference_server._registry.Registry`; every other worker loads it on its first invocation (once,
  however many requests ask at once; models load one at a time within a worker, so that two large loads never peak
  together, while invocations of loaded models go on). An unload (``DELETE``) unregisters it; each worker then drops
  its model within :data:`~inference_server._registry.WATCH_INTERVAL` seconds, calls the ``model_unload_fn`` hook,
  and gives the memory back to the system.
- **Memory, accounted for.** What a model costs a worker is measured while its ``model_fn`` runs there
  (:mod:`inference_server._memory`): its private memory (the growth of the worker's anonymous memory: arrays read
  into memory) and its mapped files (the model's own files mapped into memory, which live once in the page cache
  however many workers map them). ``GET /models`` shows both (``privateBytesByWorker``, ``mappedBytes``) and what
  the model costs the machine (``memoryBytes``: the private memory of every worker that holds it, plus its files
  once). ``--max-models`` bounds the models registered; ``--max-model-memory`` (MB) bounds what the loaded models
  cost the machine together, a model loaded through ``/models`` counted with its private memory in every worker
  (each loads it on first use) from its load on (its registry entry keeps what its load cost). Past either, a load
  answers 507, which tells SageMaker to unload others first; so does a ``MemoryError`` from ``model_fn``, and a model
  that alone costs more than the budget.
- **Loads stay inside their roots.** A load's directory, its symbolic links resolved, must be (inside) SageMaker's
  ``/opt/ml/models``, ``--model-root`` or an ``--allow-model-dir``: anything else is a 403 whose answer names no
  directory (the log names the allowed ones), so that a request cannot make ``model_fn`` run over ``/etc`` or over
  a file an attacker put anywhere. URLs (``s3://``, ``file://``) are not fetched: SageMaker copies a model to
  ``/opt/ml/models`` before it loads it. A model's name is one path segment (:data:`NAME_RULE`).
- ``--model-root DIR`` serves SageMaker Runtime's ``TargetModel`` locally, as SageMaker's front end does from S3:
  ``DIR/<target>`` (a directory, or a ``.tar.gz`` unpacked safely into a cache first) is loaded on first use, and the
  least recently used of those models are unloaded to make room within the same limits.

Models stay loaded while they are used: nothing is unloaded for being idle.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference_server import _archive, _memory, _models, metrics
from inference_server._memory import Cost
from inference_server._registry import WATCH_INTERVAL, Busy, Holding, Registry
from inference_server._settings import MULTI_MODEL_DIR, Settings
from inference_server.errors import BadRequest, Conflict, Forbidden, InsufficientStorage, ModelLoadError, NotFound

if TYPE_CHECKING:
    from inference_server._pipeline import Pipeline

logger = logging.getLogger("inference_server")

_MB = 1 << 20
#: glibc's ``mallopt`` parameter for the size from which blocks get mappings of their own.
_M_MMAP_THRESHOLD = -3
#: Seconds a worker making room for a ``TargetModel`` waits for the other workers it asked to unload one.
UNLOAD_WAIT = 2.0
#: Models listed per page of ``GET /models`` unless ``page_size`` says otherwise.
PAGE_SIZE = 1000
#: What a model's name (``POST /models``, the v2 repository) may be: one path segment, as a directory's name, that
#: logs and metrics' labels show as it is.
NAME_RULE = "1 to 255 letters, digits, '.', '_' or '-', starting with a letter or digit"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


def check_name(name: str) -> None:
    """:class:`BadRequest` unless ``name`` follows :data:`NAME_RULE` (checked before anything is read for it)."""
    if not _NAME.fullmatch(name):
        shown = repr(name[:64]) + ("..." if len(name) > 64 else "")
        raise BadRequest(f"the model name {shown} is not {NAME_RULE}: one path segment")


#: A URL's scheme, as ``s3://`` or ``file://`` start it.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def _keep_large_blocks_apart() -> None:
    """Make glibc's allocator give every block of 128 KiB or more its own mapping, returned to the system when freed.

    By default glibc raises that threshold up to 32 MiB as large blocks are freed, after which a model's arrays come
    from pools that ``malloc_trim`` cannot shrink: measured with fifty 8 MB models loaded then unloaded, a worker kept
    1.37x the memory of the empty server; with the threshold fixed, 1.04x (``benchmarks/multi_model_memory.py``).
    """
    name = ctypes.util.find_library("c")
    if name:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(name).mallopt(_M_MMAP_THRESHOLD, 128 << 10)


def _give_memory_back() -> None:
    """Collect cycles, then ask the C allocator to return freed memory to the system (glibc's ``malloc_trim``)."""
    gc.collect()
    _memory.give_memory_back()


class MultiModel:
    """The models of one worker (see the module's text)."""

    def __init__(self, pipeline: Pipeline, settings: Settings, registry: Registry, cache: Path | None = None) -> None:
        self.pipeline = pipeline
        self.registry = registry
        self.max_models = settings.max_models
        self.budget = settings.max_model_memory * _MB
        #: The workers that will each load a model registered through ``/models``.
        self.workers = settings.workers
        self.root = Path(settings.model_root).resolve() if settings.model_root else None
        #: The directories models may load from by path (each resolved when a load is checked).
        self.allowed = (MULTI_MODEL_DIR, *([settings.model_root] if settings.model_root else []),
                        *settings.allow_model_dir)  # fmt: skip
        #: Where ``--model-root`` tarballs are unpacked (shared by the workers; a private directory made on first use
        #: when None).
        self._cache = cache
        self._store = _models.Models()
        self._loading = threading.Lock()  # one load at a time in this worker
        self._lock = threading.Lock()
        #: What each model held here cost this worker, and when it was last used (monotonic), by store key.
        self._costs: dict[tuple[str, str], Cost] = {}
        self._used: dict[tuple[str, str], float] = {}
        #: The models ``POST /models`` is loading here and registering now: not registered yet, and not to be dropped.
        self._registering: set[tuple[str, str]] = set()
        self._version = registry.version()
        self._watcher: threading.Thread | None = None
        #: Where this worker's loads, unloads and cache hits are counted (``--metrics``), else None.
        self._recorder = metrics.recorder if settings.metrics else None
        if self._recorder is not None:
            self._recorder.serves_models(self.account)
        _keep_large_blocks_apart()

    # -- the model management API --------------------------------------------------------------------------------
    def load(self, name: str, url: str) -> None:
        """Load ``name`` from the directory ``url`` here and register it for every worker (see the module's text)."""
        check_name(name)
        directory = self._directory(url)
        key = ("api", name)
        try:
            with self.registry.claim(name):
                if self.max_models and self.registry.count() > self.max_models:  # this load's claim counts
                    raise InsufficientStorage(
                        f"{self.max_models} models are loaded already (--max-models); unload one to load {name!r}"
                    )
                with self._lock:
                    self._registering.add(key)
                try:
                    self._load(key, directory)
                    cost = self._costs.get(key)
                    self.registry.add(name, url, cost.private if cost is not None else 0)
                finally:
                    with self._lock:
                        self._registering.discard(key)
        except Busy:
            raise Conflict(f"the model {name!r} is loaded already") from None
        logger.info("Multi-model: loaded %r from %s", name, url)

    def unload(self, name: str) -> None:
        """Unregister ``name``; every worker drops it (this one now). :class:`NotFound` if it is not loaded."""
        if not self.registry.remove(name):
            raise NotFound(f"no model named {name!r} is loaded")
        self._drop(("api", name))
        logger.info("Multi-model: unloaded %r", name)

    def describe(self, name: str) -> dict[str, Any]:
        """``GET /models/{name}``: its entry, with what it costs each worker that loaded it."""
        found = self.registry.get(name)
        if found is None:
            raise NotFound(f"no model named {name!r} is loaded")
        return self._entry(found.name, found.url, self.registry.holdings())

    def listing(self, token: str | None, size: str | None) -> dict[str, Any]:
        """``GET /models``: a page of models by name from ``token`` (the previous page's ``nextPageToken``)."""
        try:
            page_size = int(size) if size is not None else PAGE_SIZE
            if page_size < 1:
                raise ValueError
        except ValueError:
            raise BadRequest(f"page_size {size!r} is not a positive integer") from None
        after = ""
        if token:
            try:
                after = base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
                if base64.urlsafe_b64encode(after.encode("utf-8")).decode("ascii") != token:
                    raise ValueError
            except (ValueError, UnicodeError):
                raise BadRequest(f"next_page_token {token!r} is not one this server gave") from None
        models = [model for model in self.registry.all() if model.name > after] if after else self.registry.all()
        page = models[:page_size]
        holdings = self.registry.holdings()
        answer: dict[str, Any] = {"models": [self._entry(model.name, model.url, holdings) for model in page]}
        if len(models) > page_size:
            answer["nextPageToken"] = base64.urlsafe_b64encode(page[-1].name.encode("utf-8")).decode("ascii")
        return answer

    def names(self) -> list[str]:
        """The names of the models loaded (in any worker), in order."""
        return [model.name for model in self.registry.all()]

    def _entry(self, name: str, url: str, holdings: list[Holding]) -> dict[str, Any]:
        costs = {str(held.pid): held.cost for held in holdings if held.kind == "api" and held.name == name}
        private, mapped = _memory.machine_bytes(list(costs.values()))
        return {
            "modelName": name,
            "modelUrl": url,
            "memoryBytes": private + mapped,
            "privateBytesByWorker": {pid: cost.private for pid, cost in costs.items()},
            "mappedBytes": mapped,
        }

    def _holdings(self) -> tuple[list[Holding], dict[str, int]]:
        """What the workers hold now, less the models unloaded through ``/models`` that some still let go (within
        :data:`WATCH_INTERVAL` seconds: an unload makes room at once); and the models loaded through ``/models``
        (registered, or being loaded now) with what each cost the worker that loaded it (its own memory)."""
        registered = {model.name: model.private for model in self.registry.all()}
        claims = self.registry.claims()
        holdings = []
        for held in self.registry.holdings():
            if held.kind == "api" and held.name not in registered:
                if self.registry.key(held.name) not in claims:
                    continue  # unloaded
                registered[held.name] = 0  # being loaded
            holdings.append(held)
        return holdings, registered

    def _held_bytes(self) -> tuple[list[Holding], dict[str, int], int, int]:
        """:meth:`_holdings`, and the bytes of private memory (summed over the workers) and of files mapped (each file
        once) that they hold."""
        holdings, registered = self._holdings()
        private, mapped = _memory.machine_bytes([held.cost for held in holdings])
        return holdings, registered, private, mapped

    def account(self) -> tuple[int, int, int]:
        """The machine's models, as the workers hold them now: how many (each once), bytes of private memory (summed
        over the workers), bytes of their files mapped (each file once)."""
        holdings, _, private, mapped = self._held_bytes()
        return len({(held.kind, held.name) for held in holdings}), private, mapped

    def machine_bytes(self) -> int:
        """What the models cost the machine, as ``--max-model-memory`` counts it: :meth:`account`'s private and mapped
        bytes, plus the private memory of each model loaded through ``/models`` (or being loaded) in the workers yet
        to load it (what its holders paid, else what its first load did)."""
        holdings, registered, private, mapped = self._held_bytes()
        holders: dict[str, list[int]] = {name: [] for name in registered}
        for held in holdings:
            if held.kind == "api":
                holders[held.name].append(held.cost.private)
        for name, privates in holders.items():
            private += max([registered[name], *privates]) * max(self.workers - len(privates), 0)
        return private + mapped

    # -- invocations ---------------------------------------------------------------------------------------------
    def at_hand(self, name: str, target_model: bool = False) -> Any:
        """What :meth:`model` (``target_model``: :meth:`target_model`) returns when it can without loading or
        waiting (the model is loaded here and still registered: a file's status, at most a small file read), else
        None: what an event loop may ask itself."""
        key = ("target" if target_model else "api", name)
        entry = self._store.entry(key)
        if entry is None or not entry.loaded:
            return None
        self._used[key] = time.monotonic()
        if target_model or self.registry.version() == self._version or self.registry.get(name) is not None:
            if self._recorder is not None:
                self._recorder.model_hit(None)
            return entry.model
        return None

    def model(self, name: str) -> Any:
        """The model registered as ``name``, loaded here on first use; :class:`NotFound` if it is not registered."""
        model = self.at_hand(name)
        if model is not None:
            return model
        key = ("api", name)
        started = time.perf_counter()
        found = self.registry.get(name)
        if found is None:
            self._drop(key)
            raise NotFound(f"no model named {name!r} is loaded (load it with POST /models)")
        try:
            return self._load(key, self._directory(found.url))
        finally:
            self._missed(started)

    def target_model(self, target: str) -> Any:
        """The model of SageMaker Runtime's ``TargetModel`` under ``--model-root``, loaded on first use, making room
        by unloading the least recently used of those."""
        model = self.at_hand(target, target_model=True)
        if model is not None:
            return model
        key = ("target", target)
        started = time.perf_counter()  # (a tarball's unpacking is part of the wait)
        directory = self.root_directory(target, "a TargetModel")
        try:
            return self._load(key, directory, make_room=True)
        finally:
            self._missed(started)

    def _missed(self, started: float) -> None:
        """An invocation did not find its model loaded here: count it, and its wait since ``started``."""
        if self._recorder is not None:
            self._recorder.missed(time.perf_counter() - started)

    def root_directory(self, name: str, what: str) -> str:
        """The directory of the model ``name`` under ``--model-root`` (a tarball unpacked first): :class:`NotFound`
        if there is none, :class:`BadRequest` without ``--model-root`` (``what`` says what needed it)."""
        if self.root is None:
            raise BadRequest(
                f"this server has no --model-root, so it cannot load {what}: start it with --model-root DIR "
                "(DIR/<name> holds each model), or load models through POST /models"
            )
        try:
            return str(_archive.model_directory(self.root, name, self._unpacked()))
        except FileNotFoundError as exc:
            raise NotFound(str(exc)) from None
        except _archive.OutsideRoot as exc:
            raise Forbidden(str(exc)) from None
        except _archive.ArchiveError as exc:
            raise BadRequest(str(exc)) from None

    def _directory(self, url: str) -> str:
        """``url`` with its symbolic links resolved, if that is a directory in (or one of) the directories models may
        load from: :class:`Forbidden` outside them (naming them in the log only), :class:`BadRequest` for a URL or a
        NUL byte, :class:`NotFound` for no directory there. ``model_fn`` gets the resolved path, the one checked, so
        that a link changed after the check cannot lead it out."""
        if "\0" in url:
            raise BadRequest("the model's url holds a NUL byte")
        if _SCHEME.match(url):
            raise BadRequest(
                "the model's url is not fetched: give the path of a local directory (SageMaker copies a model from S3 "
                f"to {MULTI_MODEL_DIR} before it loads it; s3://, http:// and file:// URLs are not read)"
            )
        unpacked = (str(self._cache),) if self._cache is not None else ()  # tarballs of the model root, unpacked
        real = _archive.confined(url, (*self.allowed, *unpacked))
        if real is None:
            roots = ", ".join(os.path.realpath(root) for root in self.allowed)
            logger.warning(
                "Multi-model: refused to load %r: it is outside the directories models load from (%s); "
                "--allow-model-dir adds one",
                url,
                roots,
            )
            raise Forbidden(
                "the model directory is outside the directories this server loads models from (its log names them; "
                "--allow-model-dir adds one)"
            )
        if not os.path.isdir(real):
            raise NotFound("no model directory is at that url" if not os.path.exists(real) else
                           "the model's url is not a directory")  # fmt: skip
        return real

    def _unpacked(self) -> Path:
        if self._cache is None:
            self._cache = Path(tempfile.mkdtemp(prefix="inference-server-unpacked-"))
            weakref.finalize(self, shutil.rmtree, self._cache, True)
        self._cache.mkdir(exist_ok=True)
        return self._cache

    # -- loading and unloading here ------------------------------------------------------------------------------
    def _load(self, key: tuple[str, str], model_dir: str, make_room: bool = False) -> Any:
        """Load ``key`` here from ``model_dir`` unless it is loaded; within the budget unless it is a model loaded
        through ``/models`` already (registered: its load counted it in every worker)."""
        with self._loading:
            entry = self._store.entry(key)
            if entry is not None and entry.loaded:
                return entry.model
            if make_room:
                self._make_room(key, loaded=False)
            _memory.give_memory_back()  # (memory freed earlier, when reused, is resident again: counted)
            private, mapped = _memory.private_bytes(), _memory.mappings()
            started = time.perf_counter()
            try:
                model = self._store.load(key, self.pipeline, model_dir)
            except ModelLoadError:
                if self._recorder is not None:
                    self._recorder.load_failed(time.perf_counter() - started)
                entry = self._store.entry(key)
                error = entry.error if entry is not None else None
                self._store.unload(key)
                if isinstance(error, MemoryError):
                    raise InsufficientStorage(f"the model {key[1]!r} did not fit in memory (MemoryError)") from None
                if key[0] != "target":
                    raise  # the model management API's caller is the operator: the message says what to fix
                # An invoking client chose the directory: the exception's message (often a path of the server's disk)
                # is for the log, which has it with its traceback, not for the answer.
                kind = type(error).__name__ if error is not None else "an error"
                raise ModelLoadError(
                    f"the model {key[1]!r} failed to load: model_fn raised {kind} (its message is in the server's log)"
                ) from None
            cost = Cost(
                max(_memory.private_bytes() - private, 0),
                _memory.mapped_files(mapped, _memory.mappings(), model_dir),
            )
            if self._recorder is not None:
                self._recorder.loaded(key, time.perf_counter() - started)
            with self._lock:
                entry = self._store.entry(key)
                if entry is None or not entry.loaded:
                    return model  # unloaded (DELETE) while it loaded: nothing held here to account for
                self._costs[key] = cost
                self._used[key] = time.monotonic()
                self.registry.hold(self._costs)
            alone = cost.private + sum(cost.mapped.values())
            if self.budget and alone > self.budget:
                self._drop(key, "failed")
                raise InsufficientStorage(
                    f"the model {key[1]!r} takes {alone / _MB:.1f} MB, more than the {self.budget / _MB:.0f} MB the "
                    "models may cost the machine (--max-model-memory)"
                )
            if make_room:  # (what it cost is known now)
                self._make_room(key, loaded=True)
            counted = key[0] == "target" or self.registry.get(key[1]) is None  # (not a registered model's other copy)
            used = self.machine_bytes() if self.budget and counted else 0
            if used > self.budget:
                self._drop(key, "failed")
                size = (cost.private + sum(cost.mapped.values())) / _MB
                raise InsufficientStorage(
                    f"the model {key[1]!r} takes {size:.1f} MB here, and the models would cost the machine "
                    f"{used / _MB:.1f} MB, more than the {self.budget / _MB:.0f} MB they may (--max-model-memory); "
                    "unload one to load it"
                )
            return model

    def _make_room(self, key: tuple[str, str], loaded: bool) -> None:
        """Unload the least recently used ``--model-root`` models until ``key`` may load (``loaded``: stay) within the
        limits: this worker's own first; else, past the memory budget, one of the other worker that holds the most,
        one at a time."""
        deadline = time.monotonic() + UNLOAD_WAIT
        more = 0 if loaded else 1  # (before its load, the model needs room for one more model, and its bytes)
        while True:
            with self._lock:
                held = [other for other in self._costs if other[0] == "target" and other != key]
                over_count = self.max_models and len(self._costs) + more > self.max_models
            over_memory = self.budget and self.machine_bytes() + more > self.budget
            if not (over_count or over_memory):
                return
            if held:
                oldest = min(held, key=lambda other: self._used.get(other, 0.0))
                logger.info(
                    "Multi-model: unloading %r, the least recently used, to make room for %r", oldest[1], key[1]
                )
                self._drop(oldest, "evicted")
                continue
            if not over_memory:
                return
            others = collections.Counter(
                other.pid for other in self.registry.holdings() if other.kind == "target" and other.pid != os.getpid()
            )
            if not others or time.monotonic() > deadline:
                return  # a load goes on (and answers 507 if the machine has no room for it then)
            pid = others.most_common(1)[0][0]  # the worker holding the most: the likeliest to hold one unused
            logger.info("Multi-model: asking worker %d to unload a model to make room for %r", pid, key[1])
            self.registry.ask_to_unload(pid)
            used = self.machine_bytes()
            while self.machine_bytes() >= used and time.monotonic() < deadline:
                time.sleep(WATCH_INTERVAL / 5)

    def _drop(self, key: tuple[str, str], reason: str = "request") -> None:
        """Unload ``key`` here: the ``model_unload_fn`` hook, then the memory back to the system; ``reason`` is the
        metrics' (``request``, ``evicted``, ``failed``)."""
        entry = self._store.entry(key)
        unloaded = self._store.unload(key)
        with self._lock:
            self._used.pop(key, None)
            if self._costs.pop(key, None) is not None:
                self.registry.hold(self._costs)
        if not unloaded:
            return
        if entry is not None and entry.loaded:
            if self._recorder is not None:
                self._recorder.unloaded(key, reason)
            try:
                self.pipeline.pm.hook.model_unload_fn(model=entry.model)
            except Exception:
                logger.exception("model_unload_fn raised while unloading %r", key[1])
            entry.model = None
        del entry
        _give_memory_back()

    # -- keeping up with other workers ---------------------------------------------------------------------------
    def start_watching(self) -> None:
        """Unload, within :data:`WATCH_INTERVAL` s, the models another worker unregistered."""
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="multi-model-watch", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL)
            with contextlib.suppress(Exception):
                self.sync()
                if self.registry.asked_to_unload():
                    self._unload_oldest_target()

    def _unload_oldest_target(self) -> None:
        """Another worker needs room: unload this one's least recently used ``--model-root`` model, if it has one."""
        with self._lock:
            held = [key for key in self._costs if key[0] == "target"]
            oldest = min(held, key=lambda key: self._used.get(key, 0.0)) if held else None
        if oldest is not None:
            logger.info("Multi-model: unloading %r, the least recently used, to make room in another worker", oldest[1])
            self._drop(oldest, "evicted")

    def sync(self) -> None:
        """Drop the models held here that are no longer registered (not one this worker is registering now)."""
        version = self.registry.version()
        if version == self._version:
            return
        registered = {model.name for model in self.registry.all()}
        with self._lock:
            held = [key for key in self._costs if key not in self._registering]
        for key in held:
            if key[0] == "api" and key[1] not in registered:
                logger.info("Multi-model: %r was unloaded through another worker; unloading it here", key[1])
                self._drop(key)
        # Only now: until then, a request here looks its model up in the registry (model() trusts what it holds
        # while the version is the one it last synced with), so an unloaded model is never served while it drops.
        self._version = version
