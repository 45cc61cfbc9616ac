"""Model loads stay inside their allowed directories, and model names and ``TargetModel`` values are checked, on
real servers on both backends: each hostile form of a model's path (``..``, links out, a root that is a link,
``/proc``, URLs, NUL bytes, very long paths, hostile archives) gets a 4xx naming no directory of the server's disk,
and ``model_fn`` never runs for it; a ``TargetModel`` on ``/invocations`` routes or is refused, never ignored."""

from __future__ import annotations

import os
import socket
import tarfile
from pathlib import Path
from typing import Any

import orjson
import pytest

from inference_server._settings import Settings
from inference_server.errors import ConfigurationError
from tests.conftest import GRANIAN_INTERFACE

MODEL = """
    import os

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        with open({log!r}, "a") as log:
            log.write(model_dir + "\\n")
        if os.path.exists(os.path.join(model_dir, "broken")):
            raise FileNotFoundError("no such file: " + os.path.join(model_dir, "model.joblib"))
        return os.path.basename(model_dir.rstrip("/"))

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return {{"model": model}}
"""

JSON = {"Content-Type": "application/json"}
BACKENDS = ["granian", "gunicorn"]


class Disk:
    """Directories as a multi-model server's disk holds them: three allowed roots (one a symbolic link to the real
    directory), the model root, and a secret directory outside all of them that links lead to."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.log = tmp_path / "loaded.txt"
        self.secret = tmp_path / "secret"
        self.secret.mkdir()
        (self.secret / "model.joblib").write_bytes(b"not a model")
        self.allowed = tmp_path / "allowed"
        self.model_root = tmp_path / "root"
        self.real = tmp_path / "real"
        self.linked = tmp_path / "linked"
        for directory in (self.allowed / "m", self.model_root / "r", self.real / "m3"):
            directory.mkdir(parents=True)
        os.symlink(self.real, self.linked)
        os.symlink("../secret", self.allowed / "link-out")
        os.symlink("../root/r", self.allowed / "link-in")
        os.symlink(self.secret, self.model_root / "out")
        with tarfile.open(self.model_root / "packed.tar.gz", "w:gz") as tar:
            tar.addfile(tarfile.TarInfo("weights"))
        with tarfile.open(self.model_root / "evil.tar.gz", "w:gz") as tar:
            for name in ("size", "../escaped", "/tmp/absolute-escaped"):
                info = tarfile.TarInfo(name)
                tar.addfile(info)

    def args(self, *more: str) -> tuple[str, ...]:
        """The options of a server whose models may come from these roots only."""
        roots = ("--model-root", str(self.model_root), "--allow-model-dir", str(self.allowed))
        return (*roots, "--allow-model-dir", str(self.linked), *more)

    def loaded(self) -> list[str]:
        """The directories model_fn ran over, in order (but the default /opt/ml/model, which a server with
        --model-root loads too)."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [line for line in lines if line != "/opt/ml/model"]

    def paths(self) -> list[str]:
        """Every spelling of a directory of this disk that an answer must not show."""
        return [str(self.tmp), os.path.realpath(self.tmp), "/opt/ml/models"]


@pytest.fixture
def disk(tmp_path: Path, plugin_site: Any) -> Disk:
    layout = Disk(tmp_path)
    plugin_site.add("recorder", MODEL.format(log=str(layout.log)))
    return layout


def _load(server: Any, name: str, url: str) -> Any:
    return server.request("POST", "/models", orjson.dumps({"model_name": name, "url": url}), JSON)


def _raw(port: int, path: str, target: bytes | None) -> tuple[int, bytes]:
    """POST ``[1]`` to ``path`` with ``target`` as the TargetModel header's bytes, exactly as given; the status and
    the body."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3\r\n".encode()
    if target is not None:
        head += b"X-Amzn-SageMaker-Target-Model: " + target + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head + b"Connection: close\r\n\r\n[1]")
        received = b""
        for _ in range(10_000):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    assert received.startswith(b"HTTP/1."), received[:200]
    return int(received.split(b" ", 2)[1]), received.partition(b"\r\n\r\n")[2]


def _discloses(body: bytes, disk: Disk) -> list[str]:
    return [path for path in disk.paths() if path.encode() in body]


@pytest.mark.parametrize("backend", BACKENDS)
def test_loads_outside_the_allowed_directories_are_403_and_never_reach_model_fn(
    backend: str, servers: Any, disk: Disk
) -> None:
    """POST /models from /etc, /root, /proc/self, a link out, .. out of a root, a root's parent, a path of 5,000
    bytes: 403 naming no directory (the log names the allowed ones, /opt/ml/models first); URLs and NUL bytes: 400;
    absent or over-long names inside a root: 404; the allowed roots (a root that is a link resolved, a link from one
    root into another followed) load, and model_fn ran for those only."""
    server = servers.start("--server", backend, "--multi-model", *disk.args(), plugins=["recorder"])
    allowed, secret = str(disk.allowed), str(disk.secret)
    outside = [
        "/etc",
        "/root",
        "/proc/self",
        "/proc/self/cwd",
        f"/proc/self/root{secret}",
        secret,
        f"{allowed}/../secret",
        f"{allowed}/./m/../../secret",
        f"{allowed}/link-out",
        f"{disk.model_root}/out",
        f"{disk.linked}/../secret",
        str(disk.tmp),
        "/",
        "/" + "a" * 5000,
        "relative/dir",
    ]
    for index, url in enumerate(outside):
        reply = _load(server, f"outside-{index}", url)
        assert reply.status == 403, (url, reply.body)
        assert "outside the directories" in reply.json()["message"]
        assert _discloses(reply.body, disk) == [], (url, reply.body)
    for index, url in enumerate(["file:///etc", "s3://bucket/model", "http://127.0.0.1:1/m", f"file://{allowed}/m"]):
        reply = _load(server, f"url-{index}", url)
        assert reply.status == 400, (url, reply.body)
        assert "not fetched" in reply.json()["message"]
    for index, url in enumerate(["/etc\0", f"{allowed}/m\0/x"]):
        reply = _load(server, f"nul-{index}", url)
        assert reply.status == 400, (url, reply.body)
        assert "NUL" in reply.json()["message"]
    for index, url in enumerate([f"{allowed}/missing", f"{allowed}/%2e%2e", f"{allowed}/" + "a" * 300]):
        reply = _load(server, f"absent-{index}", url)
        assert reply.status == 404, (url, reply.body)
        assert _discloses(reply.body, disk) == [], (url, reply.body)
    good = {
        "m": f"{allowed}/m",
        "r": f"{disk.model_root}/r",
        "m3": f"{disk.linked}/m3",
        "m3-real": f"{disk.real}/m3",
        "link-in": f"{allowed}/link-in",
    }
    for name, url in good.items():
        assert _load(server, name, url).status == 200, name
    # model_fn ran over the link's target, the directory checked (a link changed after the check leads nowhere)
    assert server.request("POST", "/models/link-in/invoke", b"[1]", JSON).json() == {"model": "r"}
    assert disk.loaded() == [os.path.realpath(url) for url in good.values()]  # (resolved: the path checked)
    refusals = [line for line in server.output().splitlines() if "outside the directories" in line]
    assert len(refusals) == len(outside)
    roots = [os.path.realpath(path) for path in (disk.model_root, disk.allowed, disk.linked)]
    assert all(all(root in line for root in ["/opt/ml/models", *roots]) for line in refusals), refusals[0]
    assert "Traceback" not in server.output()
    assert server.request("GET", "/ping").status == 200


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_v2_repository_and_target_model_stay_inside_the_model_root(backend: str, servers: Any, disk: Disk) -> None:
    """The v2 repository's load and SageMaker Runtime's TargetModel of a link out of --model-root, of .. (a 400 in
    the v2 path, percent-encoded: no model name), or of an absolute path: 403 naming no directory; a tarball with
    ../ and absolute members: 400, nothing written outside; model_fn ran for none of them, and then loads a tarball
    of the root (unpacked into the server's cache, which loads may come from too)."""
    server = servers.start("--server", backend, "--multi-model", *disk.args(), plugins=["recorder"])
    for name, status in (("out", 403), ("%2e%2e", 400), ("%2E%2E", 400)):  # (.. is no model name: refused first)
        reply = server.request("POST", f"/v2/repository/models/{name}/load", b"{}", JSON)
        assert reply.status == status, (name, reply.body)
        assert _discloses(reply.body, disk) == [], (name, reply.body)
    for target in (b"out", b"..", b"../secret", b"r/../../secret", b"/etc", b"out/model.joblib"):
        for path, wrapped in (("/endpoints/x/invocations", True), ("/invocations", False)):
            status, body = _raw(server.port, path, target)
            assert (status, orjson.loads(body).get("OriginalStatusCode")) == ((424, 403) if wrapped else (403, None))
            assert _discloses(body, disk) == [], (target, body)
    status, body = _raw(server.port, "/endpoints/x/invocations", b"evil.tar.gz")
    assert (status, orjson.loads(body)["OriginalStatusCode"]) == (424, 400)
    assert b"member '../escaped'" in body
    assert _discloses(body, disk) == [], body
    assert not (disk.tmp / "escaped").exists()
    assert not Path("/tmp/absolute-escaped").exists()
    assert disk.loaded() == []
    assert server.request("POST", "/v2/repository/models/packed/load", b"{}", JSON).status == 200
    assert server.request("POST", "/models/packed/invoke", b"[1]", JSON).status == 200
    assert [Path(path).name for path in disk.loaded()] == [Path(disk.loaded()[0]).name]  # one load, unpacked
    assert server.request("GET", "/ping").status == 200


#: Each hostile TargetModel's status, the same on both backends: the value as sent, and the status.
TARGETS = [
    (b"a" * 255, 404),
    (b"a" * 300, 404),
    (b"a/" * 500, 404),
    (b"b" * 1024, 404),
    (b"c" * 1025, 400),
    (b"d" * 6000, 400),
    (b"%2e%2e", 404),
    (b"%2e%2e/%2e%2e/etc", 404),
    (b"..%2f..%2fetc", 404),
    (b"caf\xc3\xa9", 400),
    (b"\xff\xfe", 400),
    (b"", 400),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_hostile_target_models_are_400_or_404_alike_on_both_backends_never_500(
    backend: str, servers: Any, disk: Disk
) -> None:
    """Long (255 bytes and more), percent-encoded, non-ASCII and empty TargetModel values: the same 400 or 404 on
    granian and gunicorn, on /invocations and on /endpoints/NAME/invocations (the 400 as SageMaker Runtime's own,
    the 404 inside its 424), with no directory of the server in the body and no traceback in the log; a good one
    still loads."""
    server = servers.start("--server", backend, *disk.args(), plugins=["recorder"])
    for target, expected in TARGETS:
        if backend == "granian" and GRANIAN_INTERFACE == "rsgi" and not target.isascii():
            continue  # granian's RSGI interface drops such a header before the app sees it (docs: backends.md)
        status, body = _raw(server.port, "/endpoints/x/invocations", target)
        answer = orjson.loads(body)
        got = (status, answer["OriginalStatusCode"]) if status == 424 else (status, None)
        assert got == ((400, None) if expected == 400 else (424, expected)), (target[:40], body[:300])
        assert _discloses(body, disk) == [], body
        status, body = _raw(server.port, "/invocations", target)
        assert status == expected, (target[:40], body[:300])
        assert _discloses(body, disk) == [], body
    status, body = _raw(server.port, "/invocations", b"c" * 1025)
    assert "1 to 1024 printable ASCII characters" in orjson.loads(body)["message"]
    assert "Traceback" not in server.output()
    assert _raw(server.port, "/endpoints/x/invocations", b"r") == (200, b'{"model":"r"}')
    assert disk.loaded() == [str(disk.model_root / "r")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_target_model_on_invocations_routes_or_is_refused_never_ignored(
    backend: str, servers: Any, disk: Disk
) -> None:
    """/invocations with a TargetModel: routed to that model under --model-root; 400 on a single-model server (as
    SageMaker refuses TargetModel for an endpoint of one model) and on --multi-model without --model-root; without
    the header, the single model answers."""
    routed = servers.start("--server", backend, *disk.args(), plugins=["recorder"])
    assert _raw(routed.port, "/invocations", b"r") == (200, b'{"model":"r"}')
    single = servers.start("--server", backend, "--model-dir", str(disk.allowed / "m"), plugins=["recorder"])
    assert _raw(single.port, "/invocations", None) == (200, b'{"model":"m"}')
    status, body = _raw(single.port, "/invocations", b"r")
    assert status == 400
    assert "serves one model" in orjson.loads(body)["message"]
    several = servers.start("--server", backend, "--multi-model", plugins=["recorder"])
    status, body = _raw(several.port, "/invocations", b"r")
    assert status == 400
    assert "--model-root" in orjson.loads(body)["message"]
    assert sorted(disk.loaded()) == sorted([str(disk.model_root / "r"), str(disk.allowed / "m")])


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_names_are_one_printable_bounded_segment(backend: str, servers: Any, disk: Disk) -> None:
    """POST /models with a name holding ../, /, a NUL byte, CR LF, a space, non-ASCII, 10,000 characters, or
    starting with . or -: 400 naming the rule, nothing loaded; names of letters, digits, . _ - up to 255 load."""
    server = servers.start("--server", backend, "--multi-model", *disk.args(), plugins=["recorder"])
    url = str(disk.allowed / "m")
    for name in ["../x", "a/b", "a\0b", "a\r\nb", "a b", "café", "x" * 10_000, "x" * 256, ".", "..", ".hidden", "-a"]:
        reply = _load(server, name, url)
        assert reply.status == 400, (name[:20], reply.body[:200])
        assert "1 to 255 letters, digits" in reply.json()["message"]
    assert server.request("GET", "/models").json() == {"models": []}
    for name in ["m", "model-00", "a.b_c", "A" * 255, "0"]:
        assert _load(server, name, url).status == 200, name
    assert len(disk.loaded()) == 5


def test_allowed_model_dirs_come_from_the_option_repeated_or_the_variable(tmp_path: Path) -> None:
    """--allow-model-dir repeated, or INFERENCE_SERVER_ALLOW_MODEL_DIRS separated by os.pathsep, give the
    directories in order; the option wins over the variable; workers get them back through the environment."""
    a, b, c = (str(tmp_path / name) for name in "abc")
    from_env = Settings.from_env({"INFERENCE_SERVER_ALLOW_MODEL_DIRS": f"{a}{os.pathsep}{b}{os.pathsep}"})
    assert from_env.allow_model_dir == (a, b)
    given = Settings.from_env({"INFERENCE_SERVER_ALLOW_MODEL_DIRS": a}, allow_model_dir=[b, c])
    assert given.allow_model_dir == (b, c)
    assert Settings.from_env(given.environ()).allow_model_dir == (b, c)
    assert Settings.from_env({}).allow_model_dir == ()
    with pytest.raises(ConfigurationError, match="INFERENCE_SERVER_ALLOW_MODEL_DIRS='a\\\\x00b' is invalid"):
        Settings.from_env({"INFERENCE_SERVER_ALLOW_MODEL_DIRS": "a\0b"})


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_model_that_fails_to_load_names_its_error_not_the_servers_paths(
    backend: str, servers: Any, disk: Disk
) -> None:
    """A model_fn that raises with a path of the server's disk in its message, for a TargetModel an invoking client
    chose: the answer (424 of 503) names the exception's class only, the message and its traceback are in the log.
    POST /models, the operator's API, says the whole message (what to fix)."""
    (disk.model_root / "r" / "broken").touch()
    (disk.allowed / "m" / "broken").touch()
    server = servers.start("--server", backend, "--multi-model", *disk.args(), plugins=["recorder"])
    status, body = _raw(server.port, "/endpoints/x/invocations", b"r")
    assert (status, orjson.loads(body)["OriginalStatusCode"]) == (424, 503)
    assert b"model_fn raised FileNotFoundError" in body
    assert _discloses(body, disk) == [], body
    assert f"no such file: {os.path.realpath(disk.model_root)}/r/model.joblib" in server.output()
    reply = _load(server, "m", f"{disk.allowed}/m")
    assert reply.status == 503, reply.body
    assert f"{os.path.realpath(disk.allowed)}/m/model.joblib" in reply.json()["message"]
