"""Shared fixtures: a clean environment, plugin packages made on the fly, and real servers on free ports."""

from __future__ import annotations

import contextlib
import http.client
import io
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference_server import _models
from tests._every_item_reports import pytest_runtest_logreport, pytest_sessionfinish  # noqa: F401 (hooks)

READY_DEADLINE = 30.0


#: The plugins in-process tests run with: the example's, whatever else is installed (hermetic: a plugin of the
#: user's own in the same environment cannot change the tests' answers). Servers choose theirs explicitly too.
PLUGINS = "shipping_forecast"
#: ``TEST_GRANIAN_INTERFACE=rsgi``: every server the tests start on granian serves through the event-loop front.
GRANIAN_INTERFACE = os.environ.get("TEST_GRANIAN_INTERFACE", "")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without SageMaker or inference-server variables, with the example plugin selected."""
    for name in list(os.environ):
        if name.startswith(("SAGEMAKER_", "INFERENCE_SERVER_", "AWS_ENDPOINT_URL")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", PLUGINS)
    _models.cache_clear()


class PluginSite:
    """A directory of importable plugin packages, each with entry-point metadata, for ``PYTHONPATH``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.names: list[str] = []

    def add(self, name: str, source: str, requires: Sequence[str] = ()) -> str:
        """Write module ``name`` with ``source`` and register it in the ``inference_server`` entry-point group; its
        distribution declares ``requires`` (``Requires-Dist`` lines)."""
        (self.path / f"{name}.py").write_text(textwrap.dedent(source))
        dist_info = self.path / f"{name}-1.0.dist-info"
        dist_info.mkdir()
        requirements = "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n{requirements}")
        (dist_info / "entry_points.txt").write_text(f"[inference_server]\n{name} = {name}\n")
        self.names.append(name)
        return name


@pytest.fixture
def only_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Any], Any]]:
    """``only_plugin(plugin)``: the in-process plugin manager with the defaults and ``plugin`` only, for this test
    (registered now, unregistered at its end); returns the plugin."""
    from inference_server import _plugins

    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "")
    registered: list[Any] = []

    def register(plugin: Any) -> Any:
        _plugins.manager().register(plugin)
        registered.append(plugin)
        return plugin

    try:
        yield register
    finally:
        for plugin in registered:
            if _plugins.manager().is_registered(plugin):
                _plugins.manager().unregister(plugin)


@pytest.fixture
def plugin_site(tmp_path: Path) -> PluginSite:
    """An empty :class:`PluginSite`."""
    path = tmp_path / "site"
    path.mkdir()
    return PluginSite(path)


def local_aws_env(url: str) -> dict[str, str]:
    """Dummy credentials, no AWS configuration files, and SageMaker Runtime at ``url``: boto3 and the SageMaker SDKs
    talk to the local server and nothing else."""
    return {
        "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    }


def pip(python: Path | str, *args: str) -> None:
    """Run ``python -m pip *args`` quietly, failing the test with pip's last words."""
    command = [str(python), "-m", "pip", "--disable-pip-version-check", "--quiet", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


#: What the tests fetch from PyPI (virtualenvs of other versions and tools, sdists), kept between runs and keyed by
#: what it holds, so that a second run on the same machine needs no network. INFERENCE_SERVER_TEST_CACHE moves it.
CACHE = Path(os.environ.get("INFERENCE_SERVER_TEST_CACHE") or Path.home() / ".cache" / "inference-server-tests")


def cached(kind: str, key: Sequence[str], make: Callable[[Path], object]) -> Path:
    """The directory ``make(directory)`` filled for ``key`` (and this Python): made on first use, reused after; one
    that was left half made is made again."""
    import fcntl
    import hashlib
    import shutil

    digest = hashlib.sha256("\0".join([sys.version, *key]).encode()).hexdigest()[:16]
    where = CACHE / f"{kind}-{digest}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{kind}-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run on this machine may be making the same directory
        if not (where / ".complete").exists():
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir(parents=True)
            make(where)
            (where / ".complete").write_text("\n".join(key) + "\n")
    return where


def make_venv(*requirements: str) -> Path:
    """A virtualenv with ``requirements`` installed from PyPI, made once per machine (see :data:`CACHE`); returns
    its Python."""

    def make(where: Path) -> None:
        import venv

        venv.create(where, with_pip=True)
        pip(where / "bin" / "python", "install", *requirements)

    return cached("venv", requirements, make) / "bin" / "python"


def downloaded(*requirements: str, sdists: bool = False) -> Path:
    """A directory with ``requirements`` downloaded from PyPI (without dependencies; ``sdists``: source only), made
    once per machine (see :data:`CACHE`)."""
    only = ["--no-binary", ":all:"] if sdists else []
    key = [*requirements, *only]
    return cached("download", key, lambda where: pip(sys.executable, "download", "--no-deps", *only, "-d", str(where),
                                                     *requirements))  # fmt: skip


#: The framework containers' inference toolkits, whose code the container defaults are compared with.
TOOLKITS = (
    "sagemaker-pytorch-inference==2.0.25",  # its sdist carries the sagemaker_inference toolkit it was built with
    "sagemaker-huggingface-inference-toolkit==2.6.0",
    "multi-model-server==1.1.11",  # the Hugging Face toolkit's exceptions come from its mms.service
    "retrying",
)


@pytest.fixture(scope="session")
def toolkits() -> Iterator[None]:
    """The toolkits' code importable (downloaded from PyPI without their dependencies on first use, never
    installed)."""
    import shutil
    import tarfile

    def make(site: Path) -> None:
        where = downloaded(*TOOLKITS)
        for wheel in where.glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(site)
        (sdist,) = where.glob("sagemaker_pytorch_inference-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(site / "sdist", filter="data")
        shutil.copytree(site / "sdist" / sdist.name.removesuffix(".tar.gz") / "src", site, dirs_exist_ok=True)

    site = cached("toolkits", TOOLKITS, make)
    sys.path.insert(0, str(site))
    yield
    sys.path.remove(str(site))


def install_this_checkout(where: Path) -> Path:
    """This checkout (without dependencies) installed into ``where/site``, built without the network: a directory
    for ``PYTHONPATH`` beside a cached virtualenv that has the dependencies."""
    root = Path(__file__).resolve().parent.parent
    tree = where / "tree"  # a copy: setuptools builds in the tree's build/, which another build may be using
    shutil.copytree(root / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(root / name, tree / name)
    pip(sys.executable, "wheel", "--no-deps", "--no-build-isolation", "-w", str(where), str(tree))
    (wheel,) = where.glob("inference_server-*.whl")
    pip(sys.executable, "install", "--no-deps", "--target", str(where / "site"), str(wheel))
    return where / "site"


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """``("value", result)`` of ``call()``, or ``("error", exception)``: two implementations compared side by side."""
    try:
        return "value", call()
    except Exception as exc:
        return "error", exc


def save_torchscript(module: Any, path: Path) -> None:
    """Save a torch ``module`` as TorchScript at ``path``, as models for the PyTorch container are saved (PyTorch
    2.13 deprecates TorchScript: its warnings are silenced here)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), str(path))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _npz_bomb(mebibytes: int, declared: int | None = None) -> bytes:
    """A zip whose one deflated npy member inflates to 128 bytes + ``mebibytes`` MiB of zeros, declaring
    ``declared`` bytes (default: the truth). Built in milliseconds: after a full flush, deflating the same MiB
    gives the same bytes, so one compressed MiB is repeated."""
    size = 128 + (mebibytes << 20)
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "|u1", "fortran_order": False, "shape": (size - 128,)})
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = deflate.compress(buffer.getvalue().ljust(128, b" ")) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(bytes(1 << 20)) + deflate.flush(zlib.Z_FULL_FLUSH)
    compressed = head + block * mebibytes + deflate.flush()
    crc, zeros = zlib.crc32(buffer.getvalue().ljust(128, b" ")), bytes(1 << 20)
    for _ in range(mebibytes):
        crc = zlib.crc32(zeros, crc)
    name, stated = b"bomb.npy", size if declared is None else declared
    zip64 = stated >= 0xFFFFFFFF
    extra = struct.pack("<HHQQ", 1, 16, stated, len(compressed)) if zip64 else b""
    stated32 = 0xFFFFFFFF if zip64 else stated
    local = struct.pack(zipfile.structFileHeader, b"PK\x03\x04", 45, 0, 0, 8, 0, 0, crc, len(compressed), stated32,
                        len(name), len(extra))  # fmt: skip
    central = struct.pack(zipfile.structCentralDir, b"PK\x01\x02", 45, 0, 45, 0, 0, 8, 0, 0, crc, len(compressed),
                          stated32, len(name), len(extra), 0, 0, 0, 0, 0)  # fmt: skip
    offset = len(local) + len(name) + len(extra) + len(compressed)
    directory = central + name + extra
    end = struct.pack(zipfile.structEndArchive, b"PK\x05\x06", 0, 0, 1, 1, len(directory), offset, 0)
    return local + name + extra + compressed + directory + end


@pytest.fixture
def npz_bomb() -> Callable[..., bytes]:
    """Makes npz zip bombs: ``npz_bomb(size, declared=None)``."""
    return _npz_bomb


@pytest.fixture
def unused_port() -> int:
    """A free TCP port on 127.0.0.1."""
    return free_port()


def wait_until(condition: Callable[[], Any], deadline: float, message: str, poll: float = 0.02) -> Any:
    """Wait for ``condition()`` to be true (returns its value), polling, or fail with ``message`` after ``deadline``
    seconds: a test waits for the thing it needs, never for a fixed time."""
    end = time.monotonic() + deadline
    while not (value := condition()):
        if time.monotonic() > end:
            raise AssertionError(f"{message} (waited {deadline} s)")
        time.sleep(poll)
    return value


#: Model code for a test's plugin: ``arrived()`` appends a line to the file named by ``ARRIVALS`` (if set) as a call
#: begins, so that the test can wait for calls to be in the model (see :class:`Arrivals`).
ARRIVED = """
    def arrived():
        import os

        path = os.environ.get("ARRIVALS")
        if path:
            with open(path, "a") as log:
                log.write("x\\n")
"""


def smaps_rollup(pid: int) -> dict[str, int]:
    """Process ``pid``'s memory from ``/proc/PID/smaps_rollup``: bytes by field (``Pss``, ``Shared_Dirty``, ...)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) * 1024
    return fields


class Arrivals:
    """The file a test model's :data:`ARRIVED` code appends to: how many calls have begun, and a wait for them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()
        #: The environment that tells a server's model where to write.
        self.env = {"ARRIVALS": str(path)}

    def count(self) -> int:
        return self.path.read_bytes().count(b"\n")

    def wait(self, count: int, deadline: float = 30) -> None:
        """Wait until ``count`` calls have begun in all."""
        wait_until(lambda: self.count() >= count, deadline, f"{count} calls did not reach the model")


@pytest.fixture
def arrivals(tmp_path: Path) -> Arrivals:
    """An empty :class:`Arrivals` file for this test."""
    return Arrivals(tmp_path / "arrivals")


@dataclass
class Reply:
    """A response read whole."""

    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        import orjson

        return orjson.loads(self.body)


def _sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` (with these labels) in the Prometheus text ``text``."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


class Server:
    """``inference-server serve`` in a subprocess on a free port of 127.0.0.1."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, new_session: bool = False) -> None:
        self.log = log
        command = [sys.executable, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--workers", "1", *args]
        if "SAGEMAKER_BIND_TO_PORT" in env:
            self.port = int(env["SAGEMAKER_BIND_TO_PORT"])
        else:
            self.port = free_port()
            command += ["--port", str(self.port)]
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=new_session
            )

    def wait_ready(self, deadline: float = READY_DEADLINE) -> Server:
        """Wait until ``/ping`` answers (any status), or fail with the server's log."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.output()}")
            with contextlib.suppress(OSError):
                self.request("GET", "/ping", timeout=2)
                return self
            time.sleep(0.05)
        raise AssertionError(f"server not ready after {deadline} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def connection(self, timeout: float = 30) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> Reply:
        connection = self.connection(timeout)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return Reply(response.status, response.headers, response.read())
        finally:
            connection.close()

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` (with these labels) that ``/metrics`` shows now."""
        return _sum(self.request("GET", "/metrics").body.decode(), name, **labels)

    def wait_in_flight(self, count: int, deadline: float = 30) -> None:
        """Wait until the server counts ``count`` requests in flight (arrived and not answered; scrapes excepted)."""
        wait_until(
            lambda: self.metric("inference_server_requests_in_flight") >= count,
            deadline,
            f"{count} requests were not in flight together",
        )

    def wait_arrived(self, count: int, deadline: float = 30) -> None:
        """Wait until ``count`` requests to ``/invocations`` have reached the server: in flight now or answered
        (counted from one scrape; a short request may be answered before the others arrive)."""

        def arrived() -> bool:
            text = self.request("GET", "/metrics").body.decode()
            return (
                _sum(text, "inference_server_requests_in_flight")
                + _sum(text, "inference_server_requests_total", route="/invocations")
                >= count
            )

        wait_until(arrived, deadline, f"{count} requests did not reach the server")

    def peak_rss(self) -> int:
        """The largest peak resident memory (VmHWM, bytes) among the server's processes."""
        pids = [self.process.pid]
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        pids += [int(pid) for pid in children.read_text().split()]
        peaks = []
        for pid in pids:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) * 1024)
        return max(peaks)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        """Stop the server (SIGKILL if it does not exit in time) and any worker of it still alive."""
        workers = self.workers() if self.process.poll() is None else set()
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return self.process.returncode

    def workers(self) -> set[int]:
        """The server's child processes now."""
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
            return {int(pid) for pid in children.split()}
        return set()


class ServerFactory:
    """Starts servers for one test and stops them all at its end."""

    def __init__(self, tmp_path: Path, plugin_site: PluginSite) -> None:
        self.tmp_path = tmp_path
        self.plugin_site = plugin_site
        self.servers: list[Server] = []

    def environment(self, plugins: list[str] | None, env: dict[str, str] | None) -> dict[str, str]:
        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "INFERENCE_SERVER_", "HF_"))
        }
        paths = [str(self.plugin_site.path), environment.get("PYTHONPATH", "")]
        environment["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        environment["INFERENCE_SERVER_PLUGINS"] = ",".join(self.plugin_site.names if plugins is None else plugins)
        if GRANIAN_INTERFACE:  # the whole suite's servers on granian's event-loop front (issue 39's transition)
            environment["INFERENCE_SERVER_GRANIAN_INTERFACE"] = GRANIAN_INTERFACE
        environment.update(env or {})
        return environment

    def start(
        self,
        *args: str,
        plugins: list[str] | None = None,
        env: dict[str, str] | None = None,
        wait: bool = True,
        new_session: bool = False,
    ) -> Server:
        """Start a server with the site's plugins (or only ``plugins``) on a free port, unless ``env`` names one.

        ``new_session``: in a process group of its own, so that a test may signal the whole group."""
        log = self.tmp_path / f"server-{len(self.servers)}.log"
        server = Server(list(args), self.environment(plugins, env), log, new_session)
        self.servers.append(server)
        return server.wait_ready() if wait else server

    def close(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="module")
def forecast_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory for the forecast plugin (which reads nothing from it), shared by a module's servers."""
    path = tmp_path_factory.mktemp("model")
    (path / "model.txt").write_text("the forecast needs no file")
    return path


@pytest.fixture
def servers(tmp_path: Path, plugin_site: PluginSite) -> Iterator[ServerFactory]:
    """Start real servers; each is sent SIGTERM at the end of the test."""
    factory = ServerFactory(tmp_path, plugin_site)
    try:
        yield factory
    finally:
        factory.close()


def save_bert_classifier(where: Path, **sizes: int) -> Path:
    """Save into ``where`` a random text classifier as transformers saves one (config.json naming
    BertForSequenceClassification, model.safetensors, a word-level tokenizer of ten words), made here: nothing is
    downloaded. ``sizes`` are BertConfig's (hidden_size, num_hidden_layers, ...); the default is tiny."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "movie", "was", "good", "bad"]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    special = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, mask_token="[MASK]", **special).save_pretrained(where)
    torch.manual_seed(0)
    shape = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16,
             "max_position_embeddings": 16, **sizes}  # fmt: skip
    labels = {"id2label": {0: "NEGATIVE", 1: "POSITIVE"}, "label2id": {"NEGATIVE": 0, "POSITIVE": 1}}
    BertForSequenceClassification(BertConfig(vocab_size=len(words), **shape, **labels)).save_pretrained(where)
    return where


#: The credentials every local S3 client uses (moto accepts any).
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3(unused_port: int) -> Iterator[Any]:
    """A moto S3 server on 127.0.0.1 with a bucket ``jobs``; the fixture's value is a boto3 client for it, its
    ``endpoint`` the server's URL (``AWS_ENDPOINT_URL_S3`` for a server's s3fs)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=unused_port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{unused_port}"
        # moto keeps its state per process, not per server: start from nothing
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10)
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="jobs")
        client.endpoint = endpoint
        yield client
    finally:
        server.stop()
