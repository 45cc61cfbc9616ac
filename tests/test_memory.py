"""What a model's load costs a process: private memory from /proc/self/statm, the model's files mapped from
/proc/self/maps (each file once, by device and inode), and how the costs of many workers add up on a machine."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from inference_server import _memory
from inference_server._memory import Cost

_MB = 1 << 20


def test_arrays_read_into_memory_are_private_and_a_mapped_file_is_not() -> None:
    """64 MB of touched anonymous memory raise private_bytes by about 64 MB; a 64 MB file mapped and read through
    raises it by almost nothing (its pages are the page cache's)."""
    before = _memory.private_bytes()
    array = np.ones(64 * _MB // 8)
    grown = _memory.private_bytes() - before
    assert 60 * _MB < grown < 72 * _MB, grown
    del array


def test_a_mapped_file_counts_as_mapped_not_private(tmp_path: Path) -> None:
    """A 32 MB .npy mapped and read whole: the file under the model's directory is counted at its mapped size, the
    private memory barely moves, and a file mapped outside the directory is not the model's."""
    model, elsewhere = tmp_path / "model", tmp_path / "elsewhere"
    model.mkdir()
    elsewhere.mkdir()
    np.save(model / "w.npy", np.arange(32 * _MB // 8, dtype=np.float64))
    np.save(elsewhere / "x.npy", np.ones(1 << 16))
    before, private = _memory.mappings(), _memory.private_bytes()
    weights = np.load(model / "w.npy", mmap_mode="r")
    other = np.load(elsewhere / "x.npy", mmap_mode="r")
    assert float(weights.sum()) > 0
    assert float(other.sum()) > 0
    mapped = _memory.mapped_files(before, _memory.mappings(), str(model))
    assert _memory.private_bytes() - private < 4 * _MB
    (size,) = mapped.values()
    assert (model / "w.npy").stat().st_size <= size < (model / "w.npy").stat().st_size + 8192
    stat = (model / "w.npy").stat()
    assert list(mapped) == [f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"]
    del weights, other


def test_one_file_mapped_twice_counts_once() -> None:
    """Two regions over the same bytes of a file, and one past them: the file counts the bytes they cover together."""
    first = _memory.Mapping(0x1000, 0x5000, 0, "fd:01:7", "/m/w")
    again = _memory.Mapping(0x9000, 0xB000, 0x2000, "fd:01:7", "/m/w")
    beyond = _memory.Mapping(0xC000, 0xD000, 0x8000, "fd:01:7", "/m/w")
    assert _memory.mapped_files(frozenset(), frozenset({first, again, beyond}), "/m") == {"fd:01:7": 0x5000}
    assert _memory.mapped_files(frozenset({first}), frozenset({first, again}), "/m") == {"fd:01:7": 0x2000}
    assert _memory.mapped_files(frozenset(), frozenset({first}), "/mo") == {}  # (not under /mo: a prefix of a name)


def test_a_machine_pays_private_memory_per_worker_and_a_file_once() -> None:
    """Two workers holding one model: their private bytes add up, the file they both map counts once (the most of
    it either maps), another file adds its own."""
    one = Cost(10, {"fd:01:7": 1000})
    two = Cost(20, {"fd:01:7": 800, "fd:01:8": 5})
    assert _memory.machine_bytes([one, two]) == (30, 1005)
    assert _memory.machine_bytes([]) == (0, 0)
