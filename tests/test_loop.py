"""The worker's event loop: async hooks run on it and their callers wait; async generators as sync iterators; the
blocking warning; not started for sync hooks; a new loop after a fork."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from inference_server import _loop

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen")


async def _double(value: int) -> tuple[int, str]:
    await asyncio.sleep(0)
    _seen.set(f"set by the hook on {threading.current_thread().name}")
    return value * 2, threading.current_thread().name


def test_a_coroutine_runs_on_the_loop_thread_and_its_context_changes_reach_the_caller() -> None:
    """The caller gets the result of a coroutine run on the loop's thread, and a context variable the hook set."""
    call = _loop.synchronous(_double, "hook _double")
    assert call(21) == (42, _loop.THREAD_NAME)
    assert _seen.get() == f"set by the hook on {_loop.THREAD_NAME}"


def test_a_sync_function_is_returned_as_it_is() -> None:
    """A sync function (a generator function too) is not wrapped: nothing is added to its calls."""
    assert _loop.synchronous(len, "len") is len
    assert (
        _loop.synchronous(test_a_sync_function_is_returned_as_it_is, "t") is test_a_sync_function_is_returned_as_it_is
    )


async def _fails() -> None:
    await asyncio.sleep(0)
    raise KeyError("inside")


def test_an_exception_of_the_hook_reaches_the_caller() -> None:
    """What the coroutine raises is raised in the calling thread."""
    with pytest.raises(KeyError, match="inside"):
        _loop.synchronous(_fails, "hook _fails")()


def test_an_async_generator_is_iterated_item_by_item_and_closed_on_the_loop(tmp_path: Any) -> None:
    """An async generator's items come one by one; close() runs its finally (aclose on the loop); a finished one
    closes without a call."""
    made: list[int] = []

    async def count(n: int) -> AsyncGenerator[int, None]:
        try:
            for i in range(n):
                await asyncio.sleep(0)
                made.append(i)
                yield i
        finally:
            (tmp_path / "closed").write_text(threading.current_thread().name)

    items = _loop.synchronous(count, "hook count")(100)
    assert (next(items), next(items)) == (0, 1)
    assert made == [0, 1]
    items.close()
    assert (tmp_path / "closed").read_text() == _loop.THREAD_NAME
    assert list(_loop.synchronous(count, "hook count")(3)) == [0, 1, 2]


async def _blocks() -> str:
    time.sleep(0.3)  # the mistake the warning is for
    await asyncio.sleep(0)
    return "done"


def test_a_hook_that_blocks_the_loop_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """An async def that calls time.sleep is named in one WARNING saying how long it held the loop, however often
    it runs."""
    call = _loop.synchronous(_blocks, "hook _blocks (the test's)")
    with caplog.at_level(logging.WARNING, logger="inference_server"):
        assert (call(), call()) == ("done", "done")
    warnings = [record.getMessage() for record in caplog.records if "held the event loop" in record.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith("hook _blocks (the test's) held the event loop for 0.")


def test_calling_from_the_loop_thread_is_an_error_not_a_deadlock() -> None:
    """A hook called from the loop's own thread (waiting there would never end) raises at once."""
    call = _loop.synchronous(_double, "hook _double")
    call(1)
    loop = _loop.running()
    assert loop is not None

    async def inside() -> Any:
        return call(1)

    with pytest.raises(RuntimeError, match="event loop's own thread"):
        asyncio.run_coroutine_threadsafe(inside(), loop).result(10)


_SYNC_ONLY = """
import threading
from inference_server import _loop, _plugins, plugin_hook

class Sync:
    @plugin_hook
    def predict_fn(self, data, model):
        return data

pm = _plugins.build_manager([], [Sync()])
assert _plugins.first_result_caller(pm, "predict_fn")(1, None) == 1
print(_loop.running(), [thread.name for thread in threading.enumerate()])
"""


def test_the_loop_is_not_started_for_sync_hooks() -> None:
    """A process whose hooks are all sync never starts the loop (nor its thread)."""
    done = subprocess.run([sys.executable, "-c", _SYNC_ONLY], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "None ['MainThread']"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_a_loop_of_its_own() -> None:
    """After a fork the child runs async hooks on a new loop (the parent's thread is not there)."""
    call = _loop.synchronous(_double, "hook _double")
    call(1)
    parent = _loop.running()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        try:
            answer = call(4)
            os.write(write, f"{answer[0]} {_loop.running() is not parent}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as reader:
        reported = reader.read()
    os.waitpid(pid, 0)
    assert reported == "8 True"
