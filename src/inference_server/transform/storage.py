"""Where a transform job reads its inputs and writes its outputs: local paths, or any fsspec URL (``s3://...`` with
the ``[s3]`` extra), as SageMaker reads an S3 prefix and writes one.

An output never looks finished before it is: locally it is written as ``x.out.incomplete`` and renamed; on an object
store it is uploaded to its own key, which an object store publishes only when the upload completes (an upload that
fails is aborted, never completed).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from inference_server.errors import TransformError

INCOMPLETE = ".incomplete"
EXTRA = "pip install 'inference-server[s3]'"


def is_url(location: str) -> bool:
    """Whether ``location`` is a URL for fsspec rather than a local path."""
    return "://" in location and not location.startswith("file://")


class Store:
    """One side of a job (its inputs, or its outputs) on the local disk."""

    def __init__(self, root: str) -> None:
        self.root = root.removeprefix("file://")

    def inputs(self) -> list[tuple[str, str]]:
        """Every input file (``root`` itself, or every file under it, sorted) with its name relative to ``root``."""
        root = Path(self.root)
        if root.is_file():
            return [(str(root), root.name)]
        if not root.is_dir():
            raise TransformError(f"{self.root}: no such file or directory")
        return [(str(path), path.relative_to(root).as_posix()) for path in sorted(root.rglob("*")) if path.is_file()]

    def target(self, name: str) -> str:
        return str(Path(self.root) / f"{name}.out")

    def modified(self, path: str) -> float | None:
        """When ``path`` was last written (seconds since the epoch), or None if it does not exist."""
        with contextlib.suppress(FileNotFoundError):
            return os.stat(path).st_mtime
        return None

    def size(self, path: str) -> int:
        """The file's size in bytes."""
        return os.stat(path).st_size

    def open(self, path: str) -> BinaryIO:
        return open(path, "rb")

    def remove(self, path: str) -> None:
        """Delete ``path`` if it exists."""
        Path(path).unlink(missing_ok=True)

    @contextlib.contextmanager
    def writing(self, target: str, content_type: str | None = None) -> Iterator[BinaryIO]:
        """A file for ``target`` that appears under that name only if the block completes (``content_type``: the
        object's media type, where the store keeps one)."""
        partial = Path(target + INCOMPLETE)
        partial.parent.mkdir(parents=True, exist_ok=True)
        try:
            with partial.open("wb") as sink:
                yield sink
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)


class RemoteStore(Store):
    """One side of a job on an fsspec filesystem (S3 and the like)."""

    def __init__(self, root: str) -> None:
        try:
            import fsspec  # type: ignore[import-untyped]
        except ImportError:
            raise TransformError(f"{root}: URLs need fsspec and its filesystems: {EXTRA}") from None
        try:
            self.fs, path = fsspec.core.url_to_fs(root)
        except (ImportError, ValueError) as exc:
            raise TransformError(f"{root}: {exc} ({EXTRA} for s3://)") from None
        self.url = root
        self.root = path.rstrip("/")

    def inputs(self) -> list[tuple[str, str]]:
        if self.fs.isfile(self.root):
            return [(self.root, self.root.rsplit("/", 1)[-1])]
        found = sorted(self.fs.find(self.root))
        if not found:
            raise TransformError(f"{self.url}: no such file or directory (or nothing under it)")
        return [(path, path[len(self.root) :].lstrip("/")) for path in found]

    def target(self, name: str) -> str:
        return f"{self.root}/{name}.out"

    def modified(self, path: str) -> float | None:
        if not self.fs.exists(path):
            return None
        return float(self.fs.modified(path).timestamp())

    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    def open(self, path: str) -> BinaryIO:
        return self.fs.open(path, "rb")  # type: ignore[no-any-return]

    def remove(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm_file(path)

    @contextlib.contextmanager
    def writing(self, target: str, content_type: str | None = None) -> Iterator[BinaryIO]:
        sink: Any = self.fs.open(target, "wb", **({"ContentType": content_type} if content_type else {}))
        try:
            yield sink
        except BaseException:
            discard = getattr(sink, "discard", None)  # abort the upload, never complete it
            if discard is not None:
                discard()
            with contextlib.suppress(Exception):
                sink.closed = True
            raise
        sink.close()


def store(location: str) -> Store:
    """The store for a job's input or output location."""
    return RemoteStore(location) if is_url(location) else Store(location)
