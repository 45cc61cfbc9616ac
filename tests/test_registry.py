"""The shared registry of a multi-model endpoint's workers: what each worker holds and what it cost, read back by
any worker; a worker gone (exited, or a zombie) is left out; requests to unload a TargetModel are taken once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

from inference_server._memory import Cost
from inference_server._registry import Registry, running


def test_what_a_worker_holds_is_read_back_whole_and_replaced_on_each_change(tmp_path: Path) -> None:
    """hold() writes this worker's models and costs; holdings() reads them with its pid; a later hold() replaces
    them, and writing them leaves the registry's version alone (invocations keep their fast path)."""
    registry = Registry(tmp_path / "models")
    version = registry.version()
    registry.hold({("api", "a"): Cost(5, {"fd:01:7": 100}), ("target", "t"): Cost(7, {})})
    pid = os.getpid()
    assert sorted(registry.holdings()) == sorted(
        [(pid, "api", "a", Cost(5, {"fd:01:7": 100})), (pid, "target", "t", Cost(7, {}))]
    )
    registry.hold({("target", "t"): Cost(7, {})})
    assert [held.name for held in registry.holdings()] == ["t"]
    assert registry.version() == version


def test_a_worker_gone_or_a_zombie_is_left_out_and_forgotten(tmp_path: Path) -> None:
    """The file of a process that exited (reaped, or a zombie not yet reaped) is skipped; forget_worker removes it."""
    registry = Registry(tmp_path / "models")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while running(child.pid):  # it exits, and is not reaped yet: a zombie
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (registry.held / f"{child.pid}.json").write_bytes(orjson.dumps([["api", "z", 1, {}]]))
    assert registry.holdings() == []
    child.wait()
    assert not running(child.pid)
    assert running(os.getpid())
    registry.forget_worker(child.pid)
    assert not (registry.held / f"{child.pid}.json").exists()


def test_a_request_to_unload_is_taken_once_by_the_worker_asked(tmp_path: Path) -> None:
    """ask_to_unload(pid) is seen once by that worker (asked_to_unload is True, then False), by no other."""
    registry = Registry(tmp_path / "models")
    assert not registry.asked_to_unload()
    registry.ask_to_unload(os.getpid() + 1_000_000)
    assert not registry.asked_to_unload()
    registry.ask_to_unload(os.getpid())
    assert registry.asked_to_unload()
    assert not registry.asked_to_unload()


def test_a_half_written_or_foreign_file_is_skipped(tmp_path: Path) -> None:
    """A file that is not a list of models, or not named by a pid, does not break the reading of the others."""
    registry = Registry(tmp_path / "models")
    registry.hold({("api", "a"): Cost(1, {})})
    (registry.held / f"{os.getppid()}.json").write_bytes(b"[[")  # (of a live process: this one's parent)
    (registry.held / "notes.json").write_bytes(b"[]")
    assert [held.name for held in registry.holdings()] == ["a"]
