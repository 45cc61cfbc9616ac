"""The models loaded through SageMaker's model management API (``POST /models``), shared by every worker of a server.

The registry is a directory of small files, ``<run dir>/models`` when ``serve`` runs the app (a private temporary
directory otherwise), so that a load through one worker is seen by all of them without the serving process taking
part: one JSON file per model (``{"modelName", "modelUrl"}``) named by a hash of its name (names are opaque, and may
hold any character), written whole and renamed into place. A load in progress holds ``<key>.loading``, made with
``O_EXCL``: a second load of the same name, in any worker, is refused (409) until it is done. An entry also keeps
what the load cost the worker that made it in memory of its own (``privateBytes``). A worker notices changes by the
directory's modification time (one ``stat``), and loads a registered model lazily on its first use; it unloads a
model that left the registry within :data:`WATCH_INTERVAL` seconds.

Each worker also says what the models it holds (loaded through ``/models`` or as a ``TargetModel``) cost it, in
``held/<pid>.json`` (written whole: :class:`~inference_server._memory.Cost` by model), for ``GET /models``, the
machine's memory budget (``--max-model-memory``) and ``/metrics`` to add up; files of workers gone are skipped. A
worker that must make room for a ``TargetModel`` and holds none to unload asks the others to unload their least
recently used one (``held/evict-<pid>``), which they do within :data:`WATCH_INTERVAL` seconds.

A leaf but for :mod:`inference_server._memory`, another.
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

from inference_server._memory import Cost

#: Seconds between a worker's looks at the registry for models unloaded through another worker.
WATCH_INTERVAL = 0.25


class Registered(NamedTuple):
    """One model of the registry."""

    name: str
    url: str
    #: Bytes of its own memory the load made resident in the worker that loaded it (what each worker will pay).
    private: int = 0


class Holding(NamedTuple):
    """One model held by one worker, and what it cost that worker."""

    pid: int
    kind: str
    name: str
    cost: Cost


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
        #: Where each worker says what it holds (apart, so that writing there leaves :meth:`version` as it is).
        self.held = path / "held"
        self.held.mkdir(exist_ok=True)

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

    def add(self, name: str, url: str, private: int = 0) -> None:
        """Register ``name`` (whole, atomically), whose load cost ``private`` bytes of the worker's own memory."""
        key = self.key(name)
        temporary = self.path / f".{key}.{os.getpid()}.tmp"
        temporary.write_bytes(orjson.dumps({"modelName": name, "modelUrl": url, "privateBytes": private}))
        os.replace(temporary, self.path / f"{key}.json")

    def remove(self, name: str) -> bool:
        """Unregister ``name``; False if it was not registered."""
        key = self.key(name)
        try:
            (self.path / f"{key}.json").unlink()
        except FileNotFoundError:
            return False
        return True

    def get(self, name: str) -> Registered | None:
        """``name``'s entry, or None."""
        try:
            found = orjson.loads((self.path / f"{self.key(name)}.json").read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return None
        return Registered(found["modelName"], found["modelUrl"], int(found.get("privateBytes", 0)))

    def all(self) -> list[Registered]:
        """Every registered model, by name."""
        models = []
        for path in self.path.glob("*.json"):
            with contextlib.suppress(FileNotFoundError, orjson.JSONDecodeError):
                found = orjson.loads(path.read_bytes())
                models.append(Registered(found["modelName"], found["modelUrl"], int(found.get("privateBytes", 0))))
        return sorted(models)

    def claims(self) -> set[str]:
        """The keys (:meth:`key`) of the models being loaded now."""
        return {path.stem for path in self.path.glob("*.loading")}

    def count(self) -> int:
        """How many models are registered or being loaded."""
        return sum(1 for path in self.path.iterdir() if path.suffix in (".json", ".loading"))

    def hold(self, costs: dict[tuple[str, str], Cost]) -> None:
        """Say which models this worker holds now, by (kind, name), and what each cost it."""
        listed = [[kind, name, cost.private, cost.mapped] for (kind, name), cost in costs.items()]
        temporary = self.held / f".{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            temporary.write_bytes(orjson.dumps(listed))
            os.replace(temporary, self.held / f"{os.getpid()}.json")

    def holdings(self) -> list[Holding]:
        """What every live worker holds (from the files it wrote; a worker gone is skipped)."""
        found = []
        for path in self.held.glob("*.json"):
            pid = path.stem
            if not pid.isdigit() or (int(pid) != os.getpid() and not running(int(pid))):
                continue
            try:
                listed = orjson.loads(path.read_bytes())
                found += [Holding(int(pid), str(kind), str(name), Cost(int(private), {str(file): int(size)
                          for file, size in mapped.items()})) for kind, name, private, mapped in listed]  # fmt: skip
            except (OSError, ValueError, TypeError, AttributeError):  # removed meanwhile: skipped this time
                continue
        return found

    def ask_to_unload(self, pid: int) -> None:
        """Ask worker ``pid`` to unload its least recently used ``TargetModel``."""
        with contextlib.suppress(OSError):
            (self.held / f"evict-{pid}").touch()

    def asked_to_unload(self) -> bool:
        """Whether another worker asked this one to unload a ``TargetModel`` (the request is taken)."""
        try:
            (self.held / f"evict-{os.getpid()}").unlink()
        except OSError:
            return False
        return True

    def forget_worker(self, pid: int) -> None:
        """Worker ``pid`` is gone: what it held goes too."""
        for path in (self.held / f"{pid}.json", self.held / f"evict-{pid}"):
            path.unlink(missing_ok=True)


def running(pid: int) -> bool:
    """Whether process ``pid`` is running: neither gone nor a zombie (dead, not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[:1] != [b"Z"]  # (its name, before, may hold anything)
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False
    except OSError:
        return True
    try:  # no /proc: ask the kernel (a zombie counts as running)
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _alive(claim: Path) -> bool:
    """Whether the process that wrote ``claim`` is still running (a claim being written counts as alive)."""
    try:
        pid = int(claim.read_text() or 0)
    except (OSError, ValueError):
        return True
    return not pid or running(pid)
