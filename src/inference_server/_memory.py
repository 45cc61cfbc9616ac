"""What loading a model costs this process, in the two kinds of memory that add up differently on a machine.

- **Private**: the growth of this process's memory that no file backs (anonymous and shared memory, from
  ``/proc/self/status``) while ``model_fn`` ran: the arrays it read into memory. Each worker that loads the model
  pays it again.
- **Mapped**: the bytes of the model's own files (under its directory) that ``model_fn`` mapped into memory
  (:func:`inference_server.mapped`, ``np.load(mmap_mode="r")``, safetensors): they live once in the page cache,
  however many workers map them, so a machine pays them once (each file counted by its device and inode).

Where ``/proc`` is missing both are 0. A leaf: it imports nothing of ours.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from typing import NamedTuple


class Mapping(NamedTuple):
    """One file-backed region of this process's memory (a line of ``/proc/self/maps``)."""

    start: int
    end: int
    offset: int
    #: The file's device and inode, ``"dev:inode"``: the same file in every process.
    file: str
    path: str


class Cost(NamedTuple):
    """What one model cost one worker."""

    #: Bytes of anonymous memory its load made resident here.
    private: int
    #: Bytes of its files mapped here, by file (``"dev:inode"``).
    mapped: dict[str, int]


def private_bytes() -> int:
    """This process's resident memory now that no file backs: anonymous memory and shared memory it made
    (``RssAnon`` + ``RssShmem`` of ``/proc/self/status``; 0 without it)."""
    total = 0
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith((b"RssAnon:", b"RssShmem:")):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return total


def mappings() -> frozenset[Mapping]:
    """This process's file-backed mappings now (empty without ``/proc``)."""
    found = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as maps:
            for line in maps:
                fields = line.rstrip("\n").split(maxsplit=5)
                if len(fields) < 6 or fields[4] == "0" or not fields[5].startswith("/"):
                    continue  # anonymous, or a pseudo-file ([heap], [stack], [vdso])
                start, _, end = fields[0].partition("-")
                path = fields[5].removesuffix(" (deleted)")
                found.add(Mapping(int(start, 16), int(end, 16), int(fields[2], 16), f"{fields[3]}:{fields[4]}", path))
    except OSError:
        pass
    return frozenset(found)


def files_under(directory: str) -> frozenset[str]:
    """The files under ``directory`` (links followed, so a file linked in from elsewhere is the model's too), by
    device and inode as ``/proc/self/maps`` writes them."""
    found = set()
    for folder, _, names in os.walk(directory, followlinks=True):
        for name in names:
            with contextlib.suppress(OSError):
                stat = os.stat(os.path.join(folder, name))
                found.add(f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}")
    return frozenset(found)


def mapped_files(before: frozenset[Mapping], after: frozenset[Mapping], directory: str) -> dict[str, int]:
    """The files under ``directory`` (:func:`files_under`) that regions new since ``before`` map, with the bytes of
    each they cover (the union of the regions' ranges of the file)."""
    files = files_under(directory)
    ranges: dict[str, list[tuple[int, int]]] = {}
    for region in after - before:
        if region.file in files:
            ranges.setdefault(region.file, []).append((region.offset, region.offset + region.end - region.start))
    return {file: _covered(spans) for file, spans in ranges.items()}


def _covered(spans: list[tuple[int, int]]) -> int:
    """How many bytes the ranges ``spans`` cover together."""
    total, reached = 0, 0
    for start, end in sorted(spans):
        start = max(start, reached)
        if end > start:
            total += end - start
            reached = end
    return total


def machine_bytes(costs: list[Cost]) -> tuple[int, int]:
    """What ``costs`` (of any models, in any workers) cost a machine together: their private bytes summed, and the
    bytes of the files they map, each file once (the most of it any of them maps)."""
    files: dict[str, int] = {}
    for cost in costs:
        for file, size in cost.mapped.items():
            files[file] = max(files.get(file, 0), size)
    return sum(cost.private for cost in costs), sum(files.values())


def give_memory_back() -> None:
    """Ask the C allocator to return the memory freed in its pools to the system (glibc's ``malloc_trim``; nothing
    elsewhere)."""
    name = ctypes.util.find_library("c")
    if name:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(name).malloc_trim(0)
