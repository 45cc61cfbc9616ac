"""What a model's load costs a process: private memory from /proc/self/statm, the model's files mapped from
/proc/self/maps (each file once, by device and inode), and how the costs of many workers add up on a machine."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from inference_server import _memory
from inference_server._memory import Cost

_MB = 1 << 20


def test_arrays_read_into_memory_grow_private_memory() -> None:
    """64 MB of touched anonymous memory raise private_bytes by about 64 MB."""
    before = _memory.private_bytes()
    array = np.ones(64 * _MB // 8)
    grown = _memory.private_bytes() - before
    assert 60 * _MB < grown < 72 * _MB, grown
    del array


def _identity(path: Path) -> str:
    stat = path.stat()
    return f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"


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
    assert float(weights.sum()) > 0  # every page read
    assert float(other.sum()) > 0
    mapped = _memory.mapped_files(before, _memory.mappings(), str(model))
    assert _memory.private_bytes() - private < 4 * _MB
    size = (model / "w.npy").stat().st_size
    assert list(mapped) == [_identity(model / "w.npy")]
    assert size <= mapped[_identity(model / "w.npy")] < size + 8192
    del weights, other


def test_a_file_linked_in_or_under_an_odd_name_is_the_models(tmp_path: Path) -> None:
    """A weights file that the model's directory links to from elsewhere (as a Hugging Face cache's snapshot links
    its blobs), in a directory whose name holds a newline and spaces, is the model's: files are matched by device
    and inode, not by the path /proc/self/maps writes."""
    blobs, model = tmp_path / "blobs", tmp_path / "a model\nv2" / "snapshot"
    blobs.mkdir()
    model.mkdir(parents=True)
    np.save(blobs / "w.npy", np.ones(1 << 18))
    (model / "w.npy").symlink_to(blobs / "w.npy")
    before = _memory.mappings()
    weights = np.load(model / "w.npy", mmap_mode="r")
    assert float(weights.sum()) == 1 << 18
    mapped = _memory.mapped_files(before, _memory.mappings(), str(model))
    assert list(mapped) == [_identity(blobs / "w.npy")]
    del weights


def test_ranges_of_one_file_count_once() -> None:
    """Two regions over the same bytes of a file, and one past them, cover the bytes they cover together."""
    assert _memory._covered([(0, 0x4000), (0x2000, 0x4000), (0x8000, 0x9000)]) == 0x5000
    assert _memory._covered([(0x2000, 0x4000)]) == 0x2000
    assert _memory._covered([]) == 0


def test_a_machine_pays_private_memory_per_worker_and_a_file_once() -> None:
    """Two workers holding one model: their private bytes add up, the file they both map counts once (the most of
    it either maps), another file adds its own."""
    one = Cost(10, {"fd:01:7": 1000})
    two = Cost(20, {"fd:01:7": 800, "fd:01:8": 5})
    assert _memory.machine_bytes([one, two]) == (30, 1005)
    assert _memory.machine_bytes([]) == (0, 0)
