"""A port already in use stops start-up with one line, on both backends, and the server already there keeps it."""

from __future__ import annotations

import os
import signal
import socket
from typing import Any

import pytest

NAMED = """
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return b"{name}"
"""


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_second_server_on_a_port_exits_and_the_first_keeps_all_traffic(
    servers: Any, plugin_site: Any, backend: str
) -> None:
    """A second ``serve`` on the same port exits 1 naming the port and the serving process that holds it (not one of
    its workers); every request reaches the first; killing the named pid frees the port."""
    plugin_site.add("first", NAMED.format(name="first"))
    plugin_site.add("second", NAMED.format(name="second"))
    first = servers.start("--server", backend, plugins=["first"])
    second = servers.start("--server", backend, plugins=["second"], env={"SAGEMAKER_BIND_TO_PORT": str(first.port)},
                           wait=False)  # fmt: skip
    assert second.process.wait(30) == 1
    lines = second.output().strip().splitlines()
    pid = first.process.pid
    assert lines[-1] == (
        f"inference-server: error: port {first.port} on 127.0.0.1 is already in use by inference-server serve "
        f"(pid {pid}; kill {pid} stops it); choose another with --port or SAGEMAKER_BIND_TO_PORT"
    )
    assert "Traceback" not in second.output()
    bodies = {first.request("POST", "/invocations", b"x").body for _ in range(20)}
    assert bodies == {b"first"}
    os.kill(pid, signal.SIGTERM)
    assert first.process.wait(30) == 0
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", first.port))


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_port_held_by_another_program_is_named(servers: Any, backend: str, unused_port: int) -> None:
    """A port that some other program listens on gives the same one-line error, with that program's pid."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", unused_port))
        holder.listen()
        server = servers.start("--server", backend, env={"SAGEMAKER_BIND_TO_PORT": str(unused_port)}, wait=False)
        assert server.process.wait(30) == 1
    assert f"already in use (by pid {os.getpid()})" in server.output()
    assert len(server.output().strip().splitlines()) == 1


def test_the_grpc_port_is_checked_too(servers: Any, unused_port: int) -> None:
    """--grpc-port held by another program, or equal to the HTTP port, stops serve at start-up with one line."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", unused_port))
        holder.listen()
        server = servers.start("--grpc-port", str(unused_port), wait=False)
        assert server.process.wait(30) == 1
    assert f"port {unused_port} on 127.0.0.1 is already in use (by pid {os.getpid()})" in server.output()
    assert "--grpc-port or INFERENCE_SERVER_GRPC_PORT" in server.output()
    same = servers.start("--grpc-port", str(unused_port), env={"SAGEMAKER_BIND_TO_PORT": str(unused_port)}, wait=False)
    assert same.process.wait(30) == 1
    assert "is the HTTP port too" in same.output()
