"""The built-in hooks end to end: codecs chosen by Content-Type and Accept through a real server."""

from __future__ import annotations

import contextlib
import io
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest

from inference_server import codecs

NPY, NPZ, JSON = "application/x-npy", "application/x-npz", "application/json"
ARROW = "application/vnd.apache.arrow.stream"

EXPLAINER = """
    import numpy as np
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        scores = data.sum(axis=1)
        return {"scores": scores, "conf": np.tanh(scores), "explains": data / scores[:, None]}
"""


@pytest.fixture
def echo(servers: Any) -> Any:
    """A server with only the built-in hooks: the model returns its decoded input."""
    return servers.start(plugins=[], env={"SAGEMAKER_MAX_PAYLOAD_IN_MB": "8"})


def test_npy_in_npy_out(echo: Any) -> None:
    """An npy request comes back as the same npy array, with the bare media type."""
    array = np.random.default_rng(1).random((100, 3, 4)).astype(np.float32)
    reply = echo.request("POST", "/invocations", codecs.dumps(array, NPY), {"Content-Type": NPY, "Accept": NPY})
    assert (reply.status, reply.headers["Content-Type"]) == (200, NPY)
    assert np.array_equal(np.load(io.BytesIO(reply.body)), array)


def test_npy_in_json_out(echo: Any) -> None:
    """Accept: application/json turns the array into nested lists."""
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    reply = echo.request("POST", "/invocations", codecs.dumps(array, NPY), {"Content-Type": NPY, "Accept": JSON})
    assert (reply.status, reply.headers["Content-Type"], reply.json()) == (200, JSON, [[0, 1, 2], [3, 4, 5]])


def test_npz_multi_array_out(servers: Any, plugin_site: Any) -> None:
    """A model returning several named arrays answers an npz that np.load unpacks by name (the seed's wish)."""
    plugin_site.add("explainer", EXPLAINER)
    server = servers.start()
    data = np.arange(1.0, 7.0).reshape(2, 3)
    reply = server.request("POST", "/invocations", codecs.dumps(data, NPY), {"Content-Type": NPY, "Accept": NPZ})
    assert (reply.status, reply.headers["Content-Type"]) == (200, NPZ)
    with np.load(io.BytesIO(reply.body)) as result:
        assert result.files == ["scores", "conf", "explains"]
        assert result["scores"].tolist() == [6.0, 15.0]
        assert np.allclose(result["explains"].sum(axis=1), 1)


def test_dict_of_arrays_is_npz_when_anything_is_accepted(servers: Any, plugin_site: Any) -> None:
    """Without Accept, a dict of arrays goes out as npz, its natural format."""
    plugin_site.add("explainer", EXPLAINER)
    server = servers.start()
    reply = server.request("POST", "/invocations", codecs.dumps(np.ones((1, 2)), NPY), {"Content-Type": NPY})
    assert reply.headers["Content-Type"] == NPZ


def test_arrow_in_arrow_out(echo: Any) -> None:
    """An Arrow stream request comes back as an equal Arrow table."""
    table = pa.table({"x": np.arange(5.0), "name": list("abcde")})
    reply = echo.request("POST", "/invocations", codecs.dumps(table, ARROW), {"Content-Type": ARROW})
    assert (reply.status, reply.headers["Content-Type"]) == (200, ARROW)
    assert pa.ipc.open_stream(reply.body).read_all().equals(table)


def test_csv_in(echo: Any) -> None:
    """A numeric CSV body reaches the model as a 2-D float array (here sent back as npy)."""
    reply = echo.request("POST", "/invocations", b"1,2\n3,4.5\n", {"Content-Type": "text/csv; charset=utf-8"})
    assert reply.headers["Content-Type"] == NPY
    assert np.load(io.BytesIO(reply.body)).tolist() == [[1.0, 2.0], [3.0, 4.5]]


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("application/json;q=0.5, application/x-npy;q=0.9", NPY),
        ("application/x-npy;q=0.2, application/json", JSON),
        ("text/*", "text/csv"),
        ("application/x-npy;q=0, */*;q=0.1", NPZ),
    ],
)
def test_q_values(echo: Any, accept: str, expected: str) -> None:
    """The acceptable type with the highest q is sent."""
    body = codecs.dumps(np.eye(2), NPY)
    reply = echo.request("POST", "/invocations", body, {"Content-Type": NPY, "Accept": accept})
    assert (reply.status, reply.headers["Content-Type"]) == (200, expected)


def test_nothing_acceptable_is_406(echo: Any) -> None:
    """An Accept no codec can satisfy is 406 listing what could be sent."""
    reply = echo.request(
        "POST", "/invocations", codecs.dumps(np.eye(2), NPY), {"Content-Type": NPY, "Accept": "image/png"}
    )
    assert reply.status == 406
    assert "it can be sent as: application/x-npy, application/x-npz" in reply.json()["message"]


def test_default_accept_variable(servers: Any) -> None:
    """SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT picks the format when the client accepts anything."""
    server = servers.start(plugins=[], env={"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": JSON})
    reply = server.request("POST", "/invocations", codecs.dumps(np.arange(3), NPY), {"Content-Type": NPY})
    assert (reply.headers["Content-Type"], reply.json()) == (JSON, [0, 1, 2])


def test_unknown_content_type_passes_through_as_bytes(echo: Any) -> None:
    """A media type no codec knows reaches the model as bytes, and bytes go back as octet-stream."""
    reply = echo.request("POST", "/invocations", b"\x89PNG...", {"Content-Type": "image/png"})
    assert (reply.status, reply.body, reply.headers["Content-Type"]) == (200, b"\x89PNG...", "application/octet-stream")


def test_bad_bodies_are_400_with_a_reason(echo: Any) -> None:
    """Malformed npy, npz, JSON and CSV bodies are 400s that say what was wrong; the server keeps serving."""
    truncated = codecs.dumps(np.zeros(300, np.float32), NPY)[:-400]
    for body, content_type, message in [
        (truncated, NPY, "declares 1200 bytes of float32 data (shape (300,)), body has 800"),
        (b"PK\x05\x06junk", NPZ, "npz body is truncated"),
        (b'{"a": ', JSON, "invalid JSON"),
        (b"\xff\xfe", "text/csv", "not UTF-8"),
    ]:
        reply = echo.request("POST", "/invocations", body, {"Content-Type": content_type})
        assert reply.status == 400, reply.body
        assert message in reply.json()["message"]
    assert echo.request("GET", "/ping").status == 200


def test_pickle_bearing_npy_is_refused_and_never_runs(echo: Any, tmp_path: Path) -> None:
    """An object-dtype npy whose pickle would create a file is a 400, and the file never appears."""
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, str]]:
            return (open, (str(marker), "w"))

    buffer = io.BytesIO()
    np.save(buffer, np.array([Payload()], dtype=object), allow_pickle=True)
    reply = echo.request("POST", "/invocations", buffer.getvalue(), {"Content-Type": NPY})
    assert reply.status == 400
    assert "object dtype is refused" in reply.json()["message"]
    assert not marker.exists()


def test_npz_bomb_is_refused_before_inflating(echo: Any, npz_bomb: Callable[..., bytes]) -> None:
    """A 1.5 MB npz that would inflate to 1.5 GiB is refused by its declared size: the worker's peak memory
    does not grow by anything near the bomb (no timing: machines here are noisy)."""
    body = npz_bomb(1536)
    before = echo.peak_rss()
    reply = echo.request("POST", "/invocations", body, {"Content-Type": NPZ})
    assert reply.status == 400
    assert "would inflate to 1610612864 bytes; at most 1073741824" in reply.json()["message"]
    assert echo.peak_rss() - before < 100 << 20


def test_declared_body_over_limit_is_413(echo: Any) -> None:
    """A Content-Length over MaxPayloadInMB is refused before the body is read."""
    with contextlib.closing(echo.connection()) as connection:
        connection.putrequest("POST", "/invocations")
        connection.putheader("Content-Length", str(9 << 20))
        connection.endheaders()  # none of the 9 MB is sent
        response = connection.getresponse()
        assert response.status == 413
        assert "the limit (MaxPayloadInMB) is 8388608 bytes" in orjson.loads(response.read())["message"]


def test_chunked_body_over_limit_is_413(echo: Any) -> None:
    """A chunked body is refused as soon as it passes MaxPayloadInMB (the client may still be sending)."""
    with socket.create_connection(("127.0.0.1", echo.port), timeout=30) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"100000\r\n" + b"x" * (1 << 20) + b"\r\n"
        with contextlib.suppress(OSError):  # the server may answer and close before the last chunk
            for _ in range(12):
                sock.sendall(chunk)
            sock.sendall(b"0\r\n\r\n")
        received = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
                data = sock.recv(65536)
                if not data:
                    break
                received += data
    assert received.startswith(b"HTTP/1.1 413"), received[:200]
    assert b"chunked body passed the limit" in received
