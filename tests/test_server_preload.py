"""One copy of the model per machine (``--preload``, the default): the serving process loads the model before its
workers fork from it, and they share its memory, proven from ``/proc/PID/smaps_rollup`` on both backends; what
cannot cross a fork is found, and such a model is loaded by each worker instead."""

from __future__ import annotations

import _thread
import dataclasses
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from inference_server.server import _preload
from tests.conftest import ServerFactory, smaps_rollup, wait_until

MIB = 1 << 20
#: The model: an array this large, every page of it written (resident) by model_fn.
ARRAY_MIB = 64

MODEL = f"""
    import os
    import threading
    import time

    import numpy as np
    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        with open(os.environ["CALLS"], "a") as calls:
            calls.write(f"{{os.getpid()}}\\n")
        if os.environ.get("MODEL_THREAD"):
            threading.Thread(target=time.sleep, args=(3600,), name="model-pool", daemon=True).start()
        if os.environ.get("MODEL_FAILS"):
            raise ValueError("no weights in this directory")
        return np.full({ARRAY_MIB} * {MIB} // 8, 1.5)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return {{"pid": os.getpid(), "sum": float(model.sum())}}  # (reads every page)
"""


@pytest.fixture(params=["granian", "gunicorn"])
def backend(request: pytest.FixtureRequest, plugin_site: Any) -> str:
    """Each HTTP server backend, with the large-array model installed."""
    plugin_site.add("large", MODEL)
    return str(request.param)


def _start(servers: ServerFactory, backend: str, tmp_path: Path, *args: str, **env: str) -> Any:
    environment = {"CALLS": str(tmp_path / "calls"), **env}
    return servers.start("--server", backend, "--workers", "2", *args, env=environment)


def _calls(tmp_path: Path) -> list[int]:
    """The process ids that called model_fn, in order."""
    path = tmp_path / "calls"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _answering(server: Any, count: int) -> set[int]:
    """The workers that answered, once ``count`` different ones have (each answer checked)."""
    seen: set[int] = set()

    def all_seen() -> bool:
        reply = server.request("POST", "/invocations", b"[1]", {"Content-Type": "application/json"})
        assert reply.status == 200, reply.body
        assert reply.json()["sum"] == 1.5 * ARRAY_MIB * MIB / 8
        seen.add(reply.json()["pid"])
        return len(seen) >= count

    wait_until(all_seen, 30, f"{count} workers did not answer", poll=0)
    return seen


def _shared(pid: int) -> int:
    memory = smaps_rollup(pid)
    return memory["Shared_Clean"] + memory["Shared_Dirty"]


def _private(pid: int) -> int:
    memory = smaps_rollup(pid)
    return memory["Private_Clean"] + memory["Private_Dirty"]


def test_workers_share_the_model_the_serving_process_loaded(
    servers: ServerFactory, backend: str, tmp_path: Path
) -> None:
    """model_fn runs once, in the serving process; each worker reads the array from pages it shares (not a copy)."""
    server = _start(servers, backend, tmp_path)
    workers = _answering(server, 2)
    assert _calls(tmp_path) == [server.process.pid]
    for pid in workers:
        assert _shared(pid) >= ARRAY_MIB * MIB, smaps_rollup(pid)
        assert _private(pid) < ARRAY_MIB * MIB, smaps_rollup(pid)
    assert "before starting the workers: they share its memory" in server.output()
    assert server.metric("inference_server_model_loads_total") == 1
    assert server.metric("inference_server_model_loaded") == 2


def test_without_preload_each_worker_loads_a_copy(servers: ServerFactory, backend: str, tmp_path: Path) -> None:
    """--no-preload: each worker calls model_fn and holds the array in private pages; the serving process never."""
    server = _start(servers, backend, tmp_path, "--no-preload")
    workers = _answering(server, 2)
    assert sorted(_calls(tmp_path)) == sorted(workers)
    for pid in workers:
        assert _private(pid) >= ARRAY_MIB * MIB, smaps_rollup(pid)
    assert server.metric("inference_server_model_loads_total") == 2


def test_a_replaced_worker_shares_the_model_without_loading_it(
    servers: ServerFactory, backend: str, tmp_path: Path
) -> None:
    """A worker killed and replaced: its successor forks from the serving process with the model (no model_fn)."""
    server = _start(servers, backend, tmp_path)
    first = _answering(server, 2)
    killed = min(first)
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: len(server.workers() - first) == 1, 30, "the killed worker was not replaced")
    (successor,) = server.workers() - first
    assert _answering(server, 2) == (first - {killed}) | {successor}
    assert _calls(tmp_path) == [server.process.pid]
    assert _shared(successor) >= ARRAY_MIB * MIB, smaps_rollup(successor)


def test_a_model_fn_that_leaves_a_thread_running_is_loaded_by_each_worker(
    servers: ServerFactory, backend: str, tmp_path: Path
) -> None:
    """A thread model_fn started is not in a forked worker: one WARNING names it, the serving process starts again
    (the same process id) without loading the model, and each worker loads its own."""
    server = _start(servers, backend, tmp_path, MODEL_THREAD="1")
    workers = _answering(server, 2)
    assert sorted(_calls(tmp_path)) == sorted([server.process.pid, *workers])
    warnings = [line for line in server.output().splitlines() if "WARNING" in line and "model_fn left" in line]
    assert len(warnings) == 1, server.output()
    assert "1 thread(s) running (model-pool)" in warnings[0]
    assert "--no-preload" in warnings[0]
    assert "Started again: each worker loads the model" in server.output()
    for pid in workers:
        assert _private(pid) >= ARRAY_MIB * MIB, smaps_rollup(pid)


def test_strict_refuses_a_model_that_cannot_be_preloaded(
    servers: ServerFactory, tmp_path: Path, plugin_site: Any
) -> None:
    """--strict: the warning about a model unsafe to fork stops start-up, as any start-up warning does."""
    plugin_site.add("large", MODEL)
    environment = {"CALLS": str(tmp_path / "calls"), "MODEL_THREAD": "1"}
    server = servers.start("--strict", "--model-dir", str(tmp_path), env=environment, wait=False)
    assert server.process.wait(60) == 1
    assert "--strict: a warning at start-up: model_fn left 1 thread(s) running" in server.output()


def test_a_failing_model_fn_stops_serve_at_start_up(servers: ServerFactory, backend: str, tmp_path: Path) -> None:
    """model_fn raising in the serving process: serve exits 1 at once, its traceback and the reason in the log."""
    environment = {"CALLS": str(tmp_path / "calls"), "MODEL_FAILS": "1"}
    server = servers.start("--server", backend, "--workers", "2", env=environment, wait=False)
    assert server.process.wait(60) == 1
    output = server.output()
    assert "Traceback" in output
    assert "ValueError: no weights in this directory" in output
    assert "error: the model failed to load: ValueError: no weights in this directory (in model_fn" in output
    assert _calls(tmp_path) == [server.process.pid]


def test_a_failing_model_fn_without_preload_leaves_ping_failing(
    servers: ServerFactory, backend: str, tmp_path: Path
) -> None:
    """--no-preload keeps what a worker does when model_fn fails: it serves, and /ping answers 503."""
    server = _start(servers, backend, tmp_path, "--no-preload", MODEL_FAILS="1")
    wait_until(lambda: len(_calls(tmp_path)) == 2, 30, "the workers did not try to load the model")
    assert server.request("GET", "/ping").status == 503


def test_an_async_model_fn_is_loaded_by_each_worker(servers: ServerFactory, plugin_site: Any, tmp_path: Path) -> None:
    """An async def model_fn is not preloaded (what it makes may belong to its loop): each worker loads it."""
    plugin_site.add(
        "asynchronous",
        """
        import os
        import inference_server

        @inference_server.plugin_hook
        async def model_fn(model_dir):
            with open(os.environ["CALLS"], "a") as calls:
                calls.write(f"{os.getpid()}\\n")
            return "model"
        """,
    )
    server = servers.start("--workers", "2", env={"CALLS": str(tmp_path / "calls")})
    wait_until(lambda: len(_calls(tmp_path)) == 2, 30, "the workers did not load the model")
    assert server.process.pid not in _calls(tmp_path)
    assert "model_fn is async def: each worker loads the model" in server.output()


def test_leftovers_name_threads_sockets_and_event_loops() -> None:
    """What model_fn leaves that a fork does not carry whole is found and named; nothing left, nothing said."""
    before = _preload._Process.now()
    assert _preload.leftovers(before) == []
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="pool-worker")
    thread.start()
    try:
        with socket.socket() as connection, _epoll() as _:
            found = _preload.leftovers(before)
    finally:
        stop.set()
        thread.join()
    assert found == ["1 thread(s) running (pool-worker)", "1 socket(s) open", "an event loop's epoll instance open"]
    assert connection.fileno() == -1  # (closed)
    assert _preload.leftovers(before) == []


def test_a_thread_that_ended_is_not_a_leftover() -> None:
    """A thread model_fn started and joined is gone before the fork: the model can be shared."""
    before = _preload._Process.now()
    thread = threading.Thread(target=time.sleep, args=(0.01,))
    thread.start()
    thread.join()
    assert _preload.leftovers(before) == []


def test_a_thread_outside_threading_is_a_native_leftover() -> None:
    """A thread that Python's threading module does not list (an OpenMP or BLAS pool's) is found from /proc."""
    before = _preload._Process.now()
    release = _thread.allocate_lock()
    release.acquire()
    _thread.start_new_thread(release.acquire, ())  # (a thread that threading.enumerate() does not show)
    try:
        assert _preload.leftovers(before) == ["1 native thread(s) running (a thread pool: OpenMP or the model's own)"]
    finally:
        release.release()


def test_an_openblas_pool_and_jemalloc_are_not_leftovers() -> None:
    """An OpenBLAS library loaded meanwhile starts its pool (fork-safe: it is stopped and started again around a
    fork), as many threads as it computes with less one; jemalloc's background thread is fork-safe too. One thread
    more is a pool that is not (OpenMP's)."""
    before = _preload._Process.now()
    pool = _preload._blas_threads()
    tasks = {(10_000_000 + i, "python") for i in range(pool)} | {(20_000_000, "jemalloc_bg_thd")}
    loaded = frozenset({"/site-packages/scipy_openblas32/lib/libscipy_openblas.so"})
    after = dataclasses.replace(before, tasks=before.tasks | tasks, blas=before.blas | loaded)
    assert _preload._leftovers(before, after) == []
    omp = dataclasses.replace(after, tasks=after.tasks | {(30_000_000, "python")})
    assert _preload._leftovers(before, omp) == ["1 native thread(s) running (a thread pool: OpenMP or the model's own)"]
    assert _preload._leftovers(before, dataclasses.replace(omp, blas=before.blas)) == [
        f"{pool + 1} native thread(s) running (a thread pool: OpenMP or the model's own)"
    ]


def test_a_scikit_learn_import_in_model_fn_is_preloaded(
    servers: ServerFactory, plugin_site: Any, tmp_path: Path
) -> None:
    """model_fn importing scikit-learn (what unpickling its model does) starts scipy's OpenBLAS pool: fork-safe, so the
    model is still loaded once and shared, and the workers' estimator answers."""
    plugin_site.add(
        "sklearn_inside",
        """
        import os
        import inference_server

        @inference_server.plugin_hook
        def model_fn(model_dir):
            with open(os.environ["CALLS"], "a") as calls:
                calls.write(f"{os.getpid()}\\n")
            from sklearn.linear_model import LinearRegression

            return LinearRegression().fit([[0.0], [1.0], [2.0]], [0.0, 2.0, 4.0])

        @inference_server.plugin_hook
        def predict_fn(data, model):
            return [round(value, 6) for value in model.predict([[float(data[0])]]).tolist()]
        """,
    )
    server = servers.start("--workers", "2", "--model-dir", str(tmp_path), env={"CALLS": str(tmp_path / "calls")})
    reply = server.request("POST", "/invocations", b"[3]", {"Content-Type": "application/json"})
    assert (reply.status, reply.json()) == (200, [6.0])
    assert _calls(tmp_path) == [server.process.pid]
    assert "model_fn left" not in server.output()


def _epoll() -> Any:
    import select

    return select.epoll()
