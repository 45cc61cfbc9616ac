"""The models loaded through SageMaker's model management API (``POST /models``), shared by every worker of a server.

The registry is a directory of small files, ``<run dir>/models`` when ``serve`` runs the app (a private temporary
directory otherwise), so that a load through one worker is seen by all of them without the serving process taking
part: one JSON file per model (``{"modelName", "modelUrl"}``) named by a hash of its name (names are opaque, and may
hold any character), written whole and renamed into place. A load in progress holds ``<key>.loading``, made with
``O_EXCL``: a second load of the same name, in any worker, is refused (409) until it is done. Each worker writes
what its own load of a model cost (``<key>.rss-<pid>``, the growth of its resident memory) for ``GET /models`` to
show. A worker notices changes by the directory's modification time (one ``stat``), and loads a registered model
lazily on its first use; it unloads a model that left the registry within :data:`WATCH_INTERVAL` seconds.

A leaf: it imports nothing of ours.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import orjson

#: Seconds between a worker's looks at the registry for models unloaded through another worker.
WATCH_INTERVAL = 0.25


class Registered(NamedTuple):
    """One model of the registry."""

    name: str
    url: str


class Busy(Exception):
    """The model is registered, or being loaded, already."""


class Registry:
    """The shared registry in ``path`` (created if missing; a private temporary directory when None)."""

    def __init__(self, path: Path | None = None) -> None:
        if path is None:
            path = Path(tempfile.mkdtemp(prefix="inference-server-models-"))
            weakref.finalize(self, shutil.rmtree, path, True)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path

    @staticmethod
    def key(name: str) -> str:
        """The file name stem of model ``name``."""
        return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]

    def version(self) -> int:
        """Changes whenever a model is registered or removed (the directory's modification time, in ns)."""
        return os.stat(self.path).st_mtime_ns

    @contextlib.contextmanager
    def claim(self, name: str) -> Iterator[None]:
        """Hold ``name`` while it is loaded; :class:`Busy` if it is registered or another load holds it. A claim left
        by a process that died is taken over."""
        key = self.key(name)
        claim = self.path / f"{key}.loading"
        if (self.path / f"{key}.json").exists():
            raise Busy(name)
        try:
            descriptor = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            if _alive(claim):
                raise Busy(name) from None
            claim.unlink(missing_ok=True)  # its loader died: take it over
            descriptor = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.write(descriptor, str(os.getpid()).encode())
            os.close(descriptor)
            if (self.path / f"{key}.json").exists():  # registered between the check and the claim
                raise Busy(name)
            yield
        finally:
            claim.unlink(missing_ok=True)

    def add(self, name: str, url: str) -> None:
        """Register ``name`` (whole, atomically)."""
        key = self.key(name)
        temporary = self.path / f".{key}.{os.getpid()}.tmp"
        temporary.write_bytes(orjson.dumps({"modelName": name, "modelUrl": url}))
        os.replace(temporary, self.path / f"{key}.json")

    def remove(self, name: str) -> bool:
        """Unregister ``name``; False if it was not registered."""
        key = self.key(name)
        try:
            (self.path / f"{key}.json").unlink()
        except FileNotFoundError:
            return False
        for cost in self.path.glob(f"{key}.rss-*"):
            cost.unlink(missing_ok=True)
        return True

    def get(self, name: str) -> Registered | None:
        """``name``'s entry, or None."""
        try:
            found = orjson.loads((self.path / f"{self.key(name)}.json").read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return None
        return Registered(found["modelName"], found["modelUrl"])

    def all(self) -> list[Registered]:
        """Every registered model, by name."""
        models = []
        for path in self.path.glob("*.json"):
            with contextlib.suppress(FileNotFoundError, orjson.JSONDecodeError):
                found = orjson.loads(path.read_bytes())
                models.append(Registered(found["modelName"], found["modelUrl"]))
        return sorted(models)

    def count(self) -> int:
        """How many models are registered or being loaded."""
        return sum(1 for path in self.path.iterdir() if path.suffix in (".json", ".loading"))

    def set_cost(self, name: str, rss_bytes: int) -> None:
        """What loading ``name`` cost this worker, in bytes of resident memory."""
        with contextlib.suppress(OSError):
            (self.path / f"{self.key(name)}.rss-{os.getpid()}").write_text(str(rss_bytes))

    def drop_cost(self, name: str) -> None:
        """This worker no longer holds ``name``."""
        (self.path / f"{self.key(name)}.rss-{os.getpid()}").unlink(missing_ok=True)

    def costs(self, name: str) -> dict[str, int]:
        """What each worker holding ``name`` paid for it: pid -> bytes of resident memory."""
        found = {}
        for path in self.path.glob(f"{self.key(name)}.rss-*"):
            with contextlib.suppress(OSError, ValueError):
                found[path.name.rsplit("-", 1)[1]] = int(path.read_text())
        return found

    def forget_worker(self, pid: int) -> None:
        """Worker ``pid`` is gone: its costs go too."""
        for path in self.path.glob(f"*.rss-{pid}"):
            path.unlink(missing_ok=True)


def _alive(claim: Path) -> bool:
    """Whether the process that wrote ``claim`` is still running (a claim being written counts as alive)."""
    try:
        pid = int(claim.read_text() or 0)
    except (OSError, ValueError):
        return True
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
