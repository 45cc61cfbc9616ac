"""What the HTTP benchmarks share: servers in subprocesses on free loopback ports, plugins, load generators."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
#: inference-server 1.3.3 from PyPI, in a virtualenv of its own (made on first use).
LEGACY_VENV = ROOT / "benchmarks" / ".venv-inference-server-1.3.3"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plugin_site(plugins: dict[str, str]) -> Path:
    """A temporary directory of plugin modules with entry-point metadata, for ``PYTHONPATH``."""
    site = Path(tempfile.mkdtemp(prefix="bench-plugins-"))
    for name, source in plugins.items():
        (site / f"{name}.py").write_text(textwrap.dedent(source))
        dist_info = site / f"{name}-1.0.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (dist_info / "entry_points.txt").write_text(f"[inference_server]\n{name} = {name}\n")
    return site


def legacy_python() -> Path:
    """The Python of a virtualenv with inference-server 1.3.3 and gunicorn, created if missing."""
    python = LEGACY_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {LEGACY_VENV} with inference-server==1.3.3 ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(LEGACY_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "inference-server==1.3.3", "gunicorn", "orjson"],
            check=True,
        )
    return python


class Server:
    """A server command on a free port, ready when ``path`` answers."""

    def __init__(
        self,
        name: str,
        command: list[str],
        port: int,
        env: dict[str, str],
        ready_path: str = "/ping",
        stdin: IO[bytes] | None = None,
    ):
        self.name, self.port = name, port
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(command, env=env, stdin=stdin, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited: {Path(self.log.name).read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                connection.request("GET", ready_path)
                connection.getresponse().read()
                connection.close()
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{name} not ready after 60 s")

    def _status(self, field: str) -> dict[str, int]:
        """``field`` (VmRSS, VmHWM) in bytes for the server process and each of its children."""
        pids = [str(self.process.pid)]
        pids += subprocess.run(["pgrep", "-P", pids[0]], capture_output=True, text=True).stdout.split()
        values = {}
        for pid in pids:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith(field + ":"):
                        values[pid] = int(line.split()[1]) * 1024
        return values

    def cpu_seconds(self) -> float:
        """CPU time (user and system) used so far by the server process and its children now alive: a cost per
        request that other load on a shared machine disturbs far less than a throughput does."""
        pids = [str(self.process.pid)]
        pids += subprocess.run(["pgrep", "-P", pids[0]], capture_output=True, text=True).stdout.split()
        ticks = 0
        for pid in pids:
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
        return ticks / os.sysconf("SC_CLK_TCK")

    def rss(self) -> dict[str, int]:
        """Resident memory now, per process."""
        return self._status("VmRSS")

    def peak_above(self, idle: dict[str, int]) -> int:
        """The largest rise of peak resident memory (VmHWM) over ``idle`` among the server's processes."""
        return max(peak - idle.get(pid, 0) for pid, peak in self._status("VmHWM").items())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@contextlib.contextmanager
def running(
    name: str,
    command: list[str],
    port: int,
    env: dict[str, str],
    ready_path: str = "/ping",
    stdin: IO[bytes] | None = None,
) -> Iterator[Server]:
    server = Server(name, command, port, env, ready_path, stdin)
    try:
        yield server
    finally:
        server.stop()


def ready(server: Server, path: str, seconds: float = 60) -> None:
    """Wait until ``path`` answers 200 (``running`` waits for any answer: MLServer answers its model's readiness with
    400 while the model loads, and 404 when it failed to, then may exit)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited: {Path(server.log.name).read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2)
            connection.request("GET", path)
            status = connection.getresponse().status
            connection.close()
            if status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{server.name}: {path} did not answer 200 within {seconds:g} s")


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "INFERENCE_SERVER_"))}
    env.update(extra)
    return env


def wrk(url: str, seconds: float, connections: int, lua: str | None = None) -> float:
    """Requests per second from wrk (2 threads); a bounded Python load generator where wrk is absent."""
    if shutil.which("wrk") is None:
        return python_load(url, seconds, connections, lua)
    command = ["wrk", "-t2", f"-c{connections}", f"-d{round(seconds)}s", url]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        if lua:
            script.write(lua)
            command[1:1] = ["-s", script.name]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} error responses:\n{output}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if not match:
        raise RuntimeError(output)
    return float(match.group(1))


def python_load(url: str, seconds: float, connections: int, lua: str | None) -> float:
    """Keep-alive http.client threads for ``seconds``: slower than wrk, but bounded and dependency-free."""
    host, port_path = url.removeprefix("http://").split(":", 1)
    port, _, path = port_path.partition("/")
    body = re.search(r"wrk.body\s*=\s*'(.*)'", lua or "")
    method = "POST" if body else "GET"
    payload = body.group(1).encode() if body else None
    counts = [0] * connections
    end = time.monotonic() + seconds

    def run(i: int) -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        while time.monotonic() < end:
            connection.request(method, "/" + path, body=payload, headers={"Content-Type": "application/json"})
            connection.getresponse().read()
            counts[i] += 1
        connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / seconds


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    """The min-max of the rounds, as the recorded tables quote it."""
    return f"{min(values):.0f}-{max(values):.0f}" if max(values) >= 100 else f"{min(values):.2f}-{max(values):.2f}"


def load() -> str:
    """The machine's load average (1, 5, 15 min): these machines are shared, so every run says how busy it was."""
    return "load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg())
