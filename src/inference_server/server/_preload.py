"""One copy of the model per machine: loaded in the serving process before its workers fork from it (``--preload``).

granian (Python 3.11-3.13 on Linux) and gunicorn start their workers with ``fork``, so what the serving process holds
when a worker starts is the worker's too, page for page, until one of them writes to a page (copy-on-write). A
model's arrays (numpy buffers, torch tensors' storage, a booster's C memory) that nobody writes stay one copy in
memory however many workers serve them, and a worker that replaces one that died starts with the model there: it
forks from the same serving process and never calls ``model_fn``. Before the first fork the serving process moves
every object it holds out of the garbage collector's sight (:func:`gc.freeze`): a collection in a worker would
otherwise write to the pages of every object it visits, and copy them.

What cannot cross a fork whole is looked for after ``model_fn`` returns (:func:`_leftovers`): threads it left
running, Python's or native (a child has only the thread that forked: a model whose own pool is gone would wait for
it for ever), sockets (the workers would share one connection with its peer), an epoll instance (an event loop that
means to wait on them) and GPU devices (a CUDA context cannot be used in a forked child). Any of them, and after one
WARNING naming what was found the serving process starts again (:class:`StartAgain`: the same command, the same
process id, the environment it was started with), told not to load the model, so that each worker loads its own.
Dropping the model is not enough: a worker forked from a process in which, say, xgboost had started its OpenMP pool
hangs at its own first use of OpenMP, waiting for threads that only the serving process has (seen in the tests). An
``async def model_fn`` is never preloaded: what it makes may belong to its event loop, which would be the serving
process's and not the worker's. A ``model_fn`` that raises stops ``serve`` at start-up, its traceback logged.

Native threads are counted from ``/proc/self/task`` (Linux; elsewhere only Python's threads are seen). Not every
pool is a danger: OpenBLAS stops its pool before a fork and starts it again after, and jemalloc (pyarrow's) does the
same with its background thread, so the threads of an OpenBLAS library that ``model_fn``'s imports loaded (scipy's,
which unpickling a scikit-learn model loads) are not counted, as many as it starts, nor jemalloc's (by name); the
serving process has loaded numpy's OpenBLAS before. An OpenMP pool (libgomp: xgboost's, a scikit-learn estimator's
``predict``) has no such care, and is what hung a worker.

The other things a serving process holds that must not be forked into the workers are handled where they live: the
metrics' memory-mapped files are opened again by the Prometheus client in each process (by pid), the
serving process records its load in a registry of its own (:func:`inference_server.metrics.model_preloaded`), and
the log's queue thread is the workers' own after they configure logging.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from inference_server import _logging, _loop, _models, metrics
from inference_server.errors import ModelLoadError

if TYPE_CHECKING:
    import pluggy

    from inference_server.wsgi._app import App

logger = logging.getLogger("inference_server")

#: Device files whose being held open means a GPU (or accelerator) context: NVIDIA's CUDA, AMD's ROCm, Intel's and
#: Linux's DRM render nodes, AWS Neuron.
GPU_DEVICES = ("/dev/nvidia", "/dev/kfd", "/dev/dri/", "/dev/neuron", "/dev/accel/")

#: Native threads, by name, of pools that are safe to fork (their library stops and starts them around a fork):
#: jemalloc's background thread (pyarrow's allocator).
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})

#: Seconds what model_fn left is looked for again before it counts (a thread that ended is listed a moment longer).
SETTLE = 0.5

#: Set (to the reason) in the environment of a serving process started again because its model was unsafe to fork.
AGAIN_ENV = "INFERENCE_SERVER_PRELOAD_REFUSED"

#: The plugin manager whose pipeline's model the serving process loaded, once it did: the workers of granian (which
#: make their app anew) serve with it, so that their pipeline names the model the store already holds.
shared: pluggy.PluginManager | None = None


@dataclass(frozen=True)
class _Process:
    """What the serving process holds at one moment, of what a fork does not carry whole."""

    threads: frozenset[int]  # Python threads' idents
    tasks: frozenset[tuple[int, str]]  # native threads: id and name (Linux)
    files: frozenset[tuple[int, str]]  # open file descriptors and what each is (Linux)
    blas: frozenset[str]  # the OpenBLAS libraries loaded (Linux)

    @classmethod
    def now(cls) -> _Process:
        tasks: set[tuple[int, str]] = set()
        files: set[tuple[int, str]] = set()
        blas: set[str] = set()
        if os.path.isdir("/proc/self/task"):
            for tid in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{tid}/comm") as comm:
                        tasks.add((int(tid), comm.read().strip()))
                except OSError:  # ended meanwhile
                    continue
            for name in os.listdir("/proc/self/fd"):
                try:
                    files.add((int(name), os.readlink(f"/proc/self/fd/{name}")))
                except OSError:  # closed meanwhile (the listing's own descriptor)
                    continue
            with open("/proc/self/maps") as maps:
                blas = {line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1].lower()}
        threads = frozenset(t.ident for t in threading.enumerate() if t.ident)
        return cls(threads, frozenset(tasks), frozenset(files), frozenset(blas))


def _blas_threads() -> int:
    """The threads an OpenBLAS library starts when it is loaded: its pool, one fewer than the threads it computes
    with (``OPENBLAS_NUM_THREADS``, ``GOTO_NUM_THREADS``, ``OMP_NUM_THREADS``, else the CPUs this process may use)."""
    for variable in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(variable, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value) - 1
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return len(cpus) - 1


def _leftovers(before: _Process, after: _Process) -> list[str]:
    """What ``model_fn`` left in this process (between ``before`` and ``after``) that its forked workers would not
    carry whole, each said in a few words; empty when the model can be shared."""
    found = []
    started = [t for t in threading.enumerate() if t.ident not in before.threads and t.is_alive()]
    if started:
        names = ", ".join(sorted(t.name for t in started)[:3])
        found.append(f"{len(started)} thread(s) running ({names}{', ...' if len(started) > 3 else ''})")
    python = {t.native_id for t in started}
    known = {tid for tid, _ in before.tasks} | python
    new = [name for tid, name in after.tasks if tid not in known and name not in FORK_SAFE_THREADS]
    native = len(new) - len(after.blas - before.blas) * _blas_threads()  # (an OpenBLAS loaded meanwhile: its pool)
    if native > 0:
        found.append(f"{native} native thread(s) running (a thread pool: OpenMP or the model's own)")
    opened = [target for _, target in after.files - before.files]
    sockets = sum(target.startswith("socket:") for target in opened)
    if sockets:
        found.append(f"{sockets} socket(s) open")
    if any(target == "anon_inode:[eventpoll]" for target in opened):
        found.append("an event loop's epoll instance open")
    devices = sorted({target for target in opened if target.startswith(GPU_DEVICES)})
    if devices:
        found.append(f"a GPU context ({', '.join(devices[:3])} open)")
    return found


def leftovers(before: _Process, settle: float = SETTLE) -> list[str]:
    """:func:`_leftovers` since ``before``, looked at again for up to ``settle`` seconds while anything is found: a
    thread that has just ended stays listed in ``/proc`` for a moment after ``join()`` returns."""
    deadline = time.monotonic() + settle
    while True:
        found = _leftovers(before, _Process.now())
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.01)


def _async_model_fn(pm: pluggy.PluginManager) -> bool:
    """Whether an implementation of ``model_fn`` is ``async def``."""
    return any(_loop.asynchronous(impl.function) for impl in pm.hook.model_fn.get_hookimpls())


class StartAgain(Exception):
    """The serving process ran a ``model_fn`` that made it unsafe to fork: start it again, without the load."""

    def __init__(self, warning: str, started: Started) -> None:
        super().__init__(warning)
        self.warning, self.started = warning, started

    def start(self) -> NoReturn:
        """Replace this process with the command it was started with (:data:`sys.orig_argv`), in the directory and
        environment it was started in, plus :data:`AGAIN_ENV`: the process id stays (a container's process 1 stays
        itself). Exits 1 saying why if the interpreter cannot be run again."""
        logger.info("Starting again, so that the workers fork from a process that never ran model_fn")
        _logging.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.chdir(self.started.directory)  # (model_fn may have changed it: the command's paths are relative to it)
            os.execve(sys.executable, sys.orig_argv, {**self.started.environment, AGAIN_ENV: self.warning})
        except OSError as exc:
            print(f"inference-server: error: could not start again without the model ({exc}): {self.warning}",
                  file=sys.stderr)  # fmt: skip
            os._exit(1)


@dataclass(frozen=True)
class Started:
    """How the serving process was started: what it starts again with."""

    directory: str
    environment: dict[str, str]

    @classmethod
    def now(cls) -> Started:
        return cls(os.getcwd(), dict(os.environ))


def preload(app: App, started: Started) -> None:
    """Load ``app``'s model in this process, the serving one, before the workers start (``--preload``; not for a
    multi-model endpoint, whose models come through ``/models``). Raises
    :class:`~inference_server.errors.ModelLoadError` when ``model_fn`` raised (its traceback logged; with
    ``--model-root``, whose models are named by requests, the failure is logged and shared instead), and
    :class:`StartAgain` (with the warning to log, and how the process was ``started``) when the model was found
    unsafe to fork."""
    global shared
    if not app.settings.preload or app.settings.multi_model:
        return
    if app.settings.server == "granian" and multiprocessing.get_start_method() != "fork":
        logger.info(  # (granian spawns its workers then: Python 3.14's forkserver default, macOS)
            "Each worker loads the model: granian starts its workers with %r, not fork, here, so they could not "
            "share a model loaded before they start",
            multiprocessing.get_start_method(),
        )
        return
    if os.environ.get(AGAIN_ENV):
        logger.info("Started again: each worker loads the model (the model was unsafe to fork, see above)")
        return
    if _async_model_fn(app.pipeline.pm):
        logger.info(
            "model_fn is async def: each worker loads the model on its own event loop (what an async model_fn makes "
            "may belong to its loop), not once before they start"
        )
        return
    _models.warn_missing_dir = False  # (the start-up summary warned)
    before, began = _Process.now(), time.perf_counter()
    try:
        app.model()
    except ModelLoadError:
        if not app.settings.model_root:
            raise
        logger.warning(  # (an endpoint of TargetModel models: the failure is shared, as a worker's was kept)
            "The model of --model-dir failed to load (its traceback above): /invocations without a TargetModel "
            "answers 503, and the models under --model-root load when asked for"
        )
    seconds = time.perf_counter() - began
    found = leftovers(before)
    if found:
        raise StartAgain(
            f"model_fn left {'; '.join(found)} in the serving process, which its workers would not inherit whole (a "
            "fork copies no thread, and shares sockets and devices): the server starts again without loading it, "
            f"and each of the {app.settings.workers} worker(s) loads its own model, whose memory is not shared. "
            "Serve with --no-preload (INFERENCE_SERVER_PRELOAD=false) to skip the load in the serving process",
            started,
        )
    if app.settings.metrics:
        metrics.model_preloaded(seconds)
    shared = app.pipeline.shared
    gc.freeze()  # the workers' collections leave the model's objects (and their pages) alone
    logger.info(
        "Loaded the model in %.2f s before starting the workers: they share its memory (copy-on-write; "
        "--no-preload to load it in each worker)",
        seconds,
    )


def preloaded() -> bool:
    """Whether this process (a worker) inherited its model from the serving process."""
    return shared is not None
