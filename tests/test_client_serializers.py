"""The client serializers and deserializers beyond what the SDK v2 has (the parity with it: test_client_sdk_parity)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from inference_server import client, codecs


class Stream(io.BytesIO):
    """A response stream that records whether the deserializer closed it (as the SDK requires)."""


def _stream(data: bytes) -> Stream:
    return Stream(data)


@pytest.mark.parametrize(
    ("serializer", "content_type"),
    [
        (client.NumpySerializer(), "application/x-npy"),
        (client.NpzSerializer(), "application/x-npz"),
        (client.JSONSerializer(), "application/json"),
        (client.JSONLinesSerializer(), "application/jsonlines"),
        (client.CSVSerializer(), "text/csv"),
        (client.IdentitySerializer(), "application/octet-stream"),
        (client.ArrowSerializer(), "application/vnd.apache.arrow.stream"),
        (client.NumpySerializer(content_type="application/x-custom"), "application/x-custom"),
    ],
)
def test_serializers_declare_their_content_type(serializer: Any, content_type: str) -> None:
    """CONTENT_TYPE is the SDK's attribute, settable through the constructor."""
    assert content_type == serializer.CONTENT_TYPE


def test_npz_serializer_keeps_names() -> None:
    """A dict of arrays keeps its names and order; a tuple is arr_0, arr_1."""
    body = client.NpzSerializer().serialize({"b": np.ones(2), "a": [1, 2]})
    with np.load(io.BytesIO(body)) as archive:
        assert archive.files == ["b", "a"]
    assert list(codecs.loads(client.NpzSerializer().serialize((np.ones(1), np.zeros(1))), "application/x-npz")) == [
        "arr_0",
        "arr_1",
    ]


def test_arrow_serializer_writes_a_stream() -> None:
    """A dict of columns becomes an Arrow stream pyarrow reads."""
    body = client.ArrowSerializer().serialize({"x": np.arange(3)})
    assert pa.ipc.open_stream(body).read_all().column("x").to_pylist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("deserializer", "accept"),
    [
        (client.NumpyDeserializer(), ("application/x-npy",)),
        (client.NumpyDeserializer(accept="application/x-npz"), ("application/x-npz",)),
        (client.NpzDeserializer(), ("application/x-npz",)),
        (client.JSONDeserializer(), ("application/json",)),
        (client.JSONLinesDeserializer(), ("application/jsonlines",)),
        (client.CSVDeserializer(), ("text/csv",)),
        (client.BytesDeserializer(), ("*/*",)),
        (client.StringDeserializer(), ("application/json",)),
        (client.StreamDeserializer(), ("*/*",)),
        (client.PandasDeserializer(), ("text/csv", "application/json")),
        (client.ArrowDeserializer(), ("application/vnd.apache.arrow.stream",)),
    ],
)
def test_deserializers_declare_accept_as_a_tuple(deserializer: Any, accept: tuple[str, ...]) -> None:
    """ACCEPT is a tuple, as the SDK's Predictor expects."""
    assert accept == deserializer.ACCEPT


@pytest.mark.parametrize("content_type", ["application/x-npy", "Application/X-NPY; charset=binary"])
def test_numpy_deserializer_reads_npy_and_closes_the_stream(content_type: str) -> None:
    """npy answers become arrays whatever the media type's case or parameters; the stream is closed."""
    stream = _stream(codecs.dumps(np.arange(4.0), "application/x-npy"))
    assert client.NumpyDeserializer().deserialize(stream, content_type).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert stream.closed


def test_numpy_deserializer_unpacks_npz_into_a_plain_dict() -> None:
    """The seed's wish: npz answers unpack into named arrays, a plain dict in archive order."""
    body = codecs.dumps({"scores": np.ones(2), "conf": np.zeros(2), "explains": np.eye(2)}, "application/x-npz")
    result = client.NumpyDeserializer(accept="application/x-npz").deserialize(_stream(body), "APPLICATION/X-NPZ")
    assert type(result) is dict
    assert list(result) == ["scores", "conf", "explains"]
    assert result["explains"].tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_numpy_deserializer_reads_json_and_csv_with_dtype() -> None:
    """JSON and CSV answers become arrays of ``dtype`` whatever the media type's parameters."""
    deserializer = client.NumpyDeserializer(dtype="float32")
    assert deserializer.deserialize(_stream(b"[[1, 2]]"), "application/json").dtype == np.float32
    assert deserializer.deserialize(_stream(b"1,2,3"), "text/csv; charset=utf-8").tolist() == [1.0, 2.0, 3.0]


def test_numpy_deserializer_says_what_it_got() -> None:
    """An unreadable media type names the type and what the deserializer reads."""
    with pytest.raises(ValueError, match=r"^NumpyDeserializer cannot read content type text/html\.$"):
        client.NumpyDeserializer().deserialize(_stream(b"<html>"), "text/html")


def test_numpy_deserializer_refuses_allow_pickle() -> None:
    """allow_pickle=True is refused with an explanation."""
    with pytest.raises(ValueError, match="allow_pickle=True is refused: unpickling"):
        client.NumpyDeserializer(allow_pickle=True)


def test_npz_deserializer_reads_npy_too() -> None:
    """A single-array answer is a dict with ``arr_0``."""
    body = codecs.dumps(np.ones(2), "application/x-npy")
    assert list(client.NpzDeserializer().deserialize(_stream(body), "application/x-npy")) == ["arr_0"]


def test_arrow_deserializer_reads_stream_and_file() -> None:
    """Arrow answers in either IPC format become Tables."""
    table = pa.table({"x": [1, 2]})
    for media_type in ("application/vnd.apache.arrow.stream", "application/vnd.apache.arrow.file"):
        body = codecs.dumps(table, media_type)
        assert client.ArrowDeserializer().deserialize(_stream(body), media_type.upper()).equals(table)


def test_client_package_exports() -> None:
    """The client's public names are exactly the SDK-style classes, the Predictor and its error."""
    assert set(client.__all__) == {name for name in vars(client) if not name.startswith("_")} - {"annotations"} - {
        name for name in vars(client) if type(getattr(client, name)).__name__ == "module"
    }
