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
    """A numeric CSV body reaches the model as a 2-D float array (here sent back as npy, as asked)."""
    headers = {"Content-Type": "text/csv; charset=utf-8", "Accept": NPY}
    reply = echo.request("POST", "/invocations", b"1,2\n3,4.5\n", headers)
    assert reply.headers["Content-Type"] == NPY
    assert np.load(io.BytesIO(reply.body)).tolist() == [[1.0, 2.0], [3.0, 4.5]]


def test_a_header_row_is_skipped_above_numbers(echo: Any) -> None:
    """A CSV header row (as pandas writes) above rows of numbers is skipped: the model gets the numbers."""
    headers = {"Content-Type": "text/csv", "Accept": NPY}
    reply = echo.request("POST", "/invocations", b"sepal,petal\n1,2\n3,4.5\n", headers)
    assert np.load(io.BytesIO(reply.body)).tolist() == [[1.0, 2.0], [3.0, 4.5]]


@pytest.mark.parametrize(
    ("body", "content_type"),
    [(b'{"a": [1, 2]}', JSON), (b"1,2\n3,4\n", "text/csv"), (b'{"a": 1}\n{"a": 2}\n', "application/jsonlines")],
)
def test_without_accept_the_answer_mirrors_the_request(echo: Any, body: bytes, content_type: str) -> None:
    """No Accept (curl's default): JSON in, JSON out; CSV in, CSV out; JSON Lines in, JSON Lines out."""
    reply = echo.request("POST", "/invocations", body, {"Content-Type": content_type})
    assert (reply.status, reply.headers["Content-Type"]) == (200, content_type)
    assert np.array_equal(codecs.loads(reply.body, content_type), codecs.loads(body, content_type))


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
    """An Accept no codec can satisfy is 406 quoting the Accept as the client sent it (no q=1 added) and listing
    what could be sent."""
    accept = "image/png, image/gif;q=0.5"
    reply = echo.request("POST", "/invocations", codecs.dumps(np.eye(2), NPY), {"Content-Type": NPY, "Accept": accept})
    assert reply.status == 406
    message = reply.json()["message"]
    assert message.startswith(f"cannot send a ndarray as {accept!r}; it can be sent as: application/x-npy, ")


def test_default_accept_variable(servers: Any, plugin_site: Any) -> None:
    """SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT picks the format when the client accepts anything and the request's
    own type cannot carry the prediction (here text in, an array out)."""
    plugin_site.add(
        "counter",
        """
        import numpy as np
        import inference_server

        @inference_server.plugin_hook
        def predict_fn(data, model):
            return np.arange(len(data))
        """,
    )
    server = servers.start(env={"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": JSON})
    reply = server.request("POST", "/invocations", b"abc", {"Content-Type": "text/plain"})
    assert (reply.headers["Content-Type"], reply.json()) == (JSON, [0, 1, 2])
    plain = servers.start()
    assert plain.request("POST", "/invocations", b"abc", {"Content-Type": "text/plain"}).headers["Content-Type"] == NPY


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
    assert reply.status == 413
    assert "would inflate to 1610612864 bytes; at most 83886080" in reply.json()["message"]
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


def test_chunked_body_over_limit_is_413(servers: Any) -> None:
    """A chunked body is refused as soon as it passes MaxPayloadInMB (the client may still be sending), on gunicorn
    (granian refuses chunked bodies under a limit before reading them: tests/test_hostile.py)."""
    echo = servers.start("--server", "gunicorn", plugins=[], env={"SAGEMAKER_MAX_PAYLOAD_IN_MB": "8"})
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


SKLEARN = """
    import numpy as np
    import inference_server
    from sklearn.linear_model import LogisticRegression

    @inference_server.plugin_hook
    def model_fn(model_dir):
        features = np.array([[0.0, 0.0], [0.0, 1.0], [5.0, 5.0], [5.0, 6.0]])
        labels = np.array(["calm", "calm", "gale", "gale"], dtype=object)  # as pandas gives them
        return LogisticRegression().fit(features, labels)
"""


@pytest.fixture
def sklearn_server(servers: Any, plugin_site: Any) -> Any:
    """A server whose model is a real scikit-learn classifier with string labels, run by the default predict_fn."""
    plugin_site.add("classifier", SKLEARN)
    return servers.start()


def test_estimator_without_call_is_run_with_predict(sklearn_server: Any) -> None:
    """A scikit-learn estimator is not callable: the default predict_fn calls its predict, labels come back."""
    reply = sklearn_server.request("POST", "/invocations", b"[[0, 0.5], [5, 5.5]]", {"Content-Type": JSON})
    assert (reply.status, reply.headers["Content-Type"], reply.json()) == (200, JSON, ["calm", "gale"])


@pytest.mark.parametrize(
    ("accept", "body"),
    [("text/csv", b"calm\ngale\n"), ("application/jsonlines", b'"calm"\n"gale"\n'), (JSON, b'["calm","gale"]')],
)
def test_string_labels_go_out_as_text_formats(sklearn_server: Any, accept: str, body: bytes) -> None:
    """An object array of strings (scikit-learn's labels) is sent as CSV, JSON Lines or JSON; nothing is pickled."""
    reply = sklearn_server.request(
        "POST",
        "/invocations",
        codecs.dumps(np.array([[0, 0.5], [5, 5.5]]), NPY),
        {"Content-Type": NPY, "Accept": accept},
    )
    assert (reply.status, reply.headers["Content-Type"], reply.body) == (200, accept, body)


def test_string_labels_as_npy_are_a_406_listing_the_text_formats(sklearn_server: Any) -> None:
    """Asking for npy of string labels is a real mismatch with Accept: 406 with what could be sent."""
    reply = sklearn_server.request(
        "POST", "/invocations", codecs.dumps(np.zeros((1, 2)), NPY), {"Content-Type": NPY, "Accept": NPY}
    )
    assert reply.status == 406
    assert "it can be sent as: application/json, application/jsonlines, text/csv" in reply.json()["message"]


def test_csv_with_a_header_reaches_the_estimator(sklearn_server: Any) -> None:
    """A CSV body with a header row, as pandas writes it, is predicted on; the answer mirrors CSV."""
    reply = sklearn_server.request("POST", "/invocations", b"wind,waves\n0,0.5\n5,5.5\n", {"Content-Type": "text/csv"})
    assert (reply.status, reply.body) == (200, b"calm\ngale\n")


def test_a_prediction_no_codec_can_encode_is_a_500_naming_its_type(servers: Any, plugin_site: Any) -> None:
    """A model answering something no codec encodes is the server side's fault: 500 naming the type, not 406."""
    plugin_site.add(
        "odd",
        """
        import numpy as np
        import inference_server

        @inference_server.plugin_hook
        def predict_fn(data, model):
            return np.array([{"a": 1}, object()], dtype=object)
        """,
    )
    reply = servers.start().request("POST", "/invocations", b"x")
    assert reply.status == 500
    assert reply.json()["message"].startswith(
        "no codec can encode the prediction, a ndarray of dtype object holding dict, object; "
    )


def test_a_model_neither_callable_nor_with_predict_says_how_to_fix_it(servers: Any, plugin_site: Any) -> None:
    """The default predict_fn's error names the model's type and says to implement predict_fn."""
    plugin_site.add(
        "inert",
        """
        import inference_server

        @inference_server.plugin_hook
        def model_fn(model_dir):
            return {"weights": [1, 2]}
        """,
    )
    message = servers.start().request("POST", "/invocations", b"x").json()["message"]
    assert message.startswith("the model, a dict, is not callable and has no predict method: implement the predict_fn")


@pytest.mark.parametrize(
    ("flavour", "status", "body"),
    [("null", 200, b"[1.0,null,null]"), ("literal", 200, b"[1.0,NaN,-Infinity]"), ("error", 500, None)],
)
def test_nan_in_json_follows_the_configured_flavour(servers: Any, flavour: str, status: int, body: bytes) -> None:
    """NaN and infinity in a JSON answer: null by default, NaN/Infinity tokens, or a 500 saying why."""
    server = servers.start(plugins=[], env={"INFERENCE_SERVER_JSON_NAN": flavour})
    array = codecs.dumps(np.array([1.0, np.nan, -np.inf]), NPY)
    reply = server.request("POST", "/invocations", array, {"Content-Type": NPY, "Accept": JSON})
    assert reply.status == status
    if body is None:
        assert "holds NaN or infinity, which strict JSON cannot represent" in reply.json()["message"]
    else:
        assert reply.body == body


def test_passthrough_hands_the_model_bytes_and_sends_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """INFERENCE_SERVER_DEFAULT_HOOKS=passthrough in-process: a JSON or CSV body reaches the model as bytes and its
    bytes go back as octet-stream, whatever Accept says."""
    from inference_server import testing

    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "")
    monkeypatch.setenv("INFERENCE_SERVER_DEFAULT_HOOKS", "passthrough")
    for body, content_type in ((b'{"a": 1}', JSON), (b"1,2,3", "text/csv")):
        response = testing.post_invocations(data=body, content_type=content_type, headers={"Accept": content_type})
        assert (response.status_code, response.content_type, response.data) == (200, "application/octet-stream", body)


def test_passthrough_with_a_prediction_that_is_not_bytes_is_a_500_saying_so(servers: Any, plugin_site: Any) -> None:
    """A model that returns a dict under passthrough: 500 naming output_fn and the type, and the server goes on."""
    plugin_site.add(
        "dicts",
        """
        import inference_server

        @inference_server.plugin_hook
        def model_fn(model_dir):
            return lambda data: {"length": len(data)}
        """,
    )
    server = servers.start("--default-hooks", "passthrough")
    reply = server.request("POST", "/invocations", b"abc", {"Content-Type": "text/csv"})
    assert reply.status == 500
    assert b"output_fn returned a body of type dict" in reply.body
    assert server.request("GET", "/ping").status == 200
