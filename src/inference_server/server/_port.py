"""Who listens on a TCP port: checked before a backend binds, since both bind with SO_REUSEPORT (granian) or
would otherwise fail with a traceback, and read from ``/proc`` to name the process that holds it."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path

from inference_server._settings import Settings

_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp


def listening_sockets(port: int) -> set[str]:
    """The inodes of the sockets listening on ``port`` (any address), from ``/proc/net/tcp`` and ``tcp6``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    return inodes


def sockets_of(pid: int | str) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open (empty if it cannot be read)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def listening_fds(port: int) -> list[int]:
    """This process's file descriptors of sockets listening on ``port``."""
    listening = listening_sockets(port)
    fds = []
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith("socket:[") and target[8:-1] in listening:
                    fds.append(int(fd))
    return fds


def holders(port: int) -> list[int]:
    """The processes holding a socket that listens on ``port``, as far as ``/proc`` shows them."""
    listening = listening_sockets(port)
    if not listening:
        return []
    pids = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and sockets_of(entry) & listening:
                pids.append(int(entry))
    return sorted(pids)


def _parent(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1]) or None
    return None


def _is_serve(pid: int) -> bool:
    """Whether ``pid`` runs ``inference-server serve`` (or ``python -m inference_server serve``)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    for number, arg in enumerate(args[:-1]):
        if (arg.endswith("inference-server") or arg == "inference_server") and "serve" in args[number + 1 :]:
            return True
    return False


def owners(pids: list[int]) -> tuple[list[int], bool]:
    """The processes to stop to free a port that ``pids`` hold: the ``inference-server serve`` process they belong
    to (its workers hold the socket, but stop when it stops), else the holders whose parent holds nothing; and
    whether they are ours."""
    serving = set()
    for pid in pids:
        ancestor: int | None = pid
        found = None
        for _ in range(4):  # a worker (forked workers run the same command line), or a worker's helper process
            if ancestor is None or (found is not None and not _is_serve(ancestor)):
                break
            if _is_serve(ancestor):
                found = ancestor
            ancestor = _parent(ancestor)
        if found is not None:
            serving.add(found)
    if serving:
        return sorted(serving), True
    return [pid for pid in pids if _parent(pid) not in pids], False


def in_use(settings: Settings) -> str | None:
    """Why the server cannot listen on its address and ports (one line), or None when it can: its HTTP port, and its
    gRPC port if it has one (``--grpc-port``), which must differ.

    A plain bind, without SO_REUSEPORT, fails when anyone listens there, so a second server never shares the port
    with the first (granian's and gRPC's SO_REUSEPORT sockets would otherwise split the traffic between them).
    """
    if settings.grpc_port and settings.grpc_port == settings.port:
        return f"--grpc-port {settings.grpc_port} is the HTTP port too: give gRPC a port of its own"
    problem = _taken(settings, settings.port, "--port or SAGEMAKER_BIND_TO_PORT")
    if problem is None and settings.grpc_port:
        problem = _taken(settings, settings.grpc_port, "--grpc-port or INFERENCE_SERVER_GRPC_PORT")
    return problem


def _taken(settings: Settings, port: int, option: str) -> str | None:
    """Why the server cannot listen on ``port`` of its address (``option``: how to choose another), or None."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the backends do: TIME_WAIT is no conflict
        try:
            probe.bind((settings.host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return f"cannot listen on {settings.host} port {port}: {exc.strerror}"
            pids, ours = owners(holders(port))
            named = ", ".join(map(str, pids))
            by = ""
            if ours:
                by = f" by inference-server serve (pid {named}; kill {named} stops it)"
            elif pids:
                by = f" (by pid {named})"
            return f"port {port} on {settings.host} is already in use{by}; choose another with {option}"
    return None
