"""Our serializers and deserializers against the SageMaker SDK v2's own classes, side by side: the same input gives
the same output (type and value) or the same exception type; the deliberate differences are pinned one by one."""

from __future__ import annotations

import inspect
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import scipy.sparse
import torch

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
import sagemaker.base_deserializers
import sagemaker.base_serializers
import sagemaker.deserializers
import sagemaker.serializers

from inference_server import client
from tests.conftest import outcome

Make = Callable[[], Any]


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _assert_same(ours: Any, sdk: Any) -> None:
    assert type(ours) is type(sdk), (ours, sdk)
    if isinstance(sdk, torch.Tensor):
        assert (ours.dtype, ours.shape, ours.device) == (sdk.dtype, sdk.shape, sdk.device)
        assert torch.equal(ours, sdk)
    elif isinstance(sdk, np.ndarray):
        assert (ours.dtype, ours.shape, ours.flags.writeable) == (sdk.dtype, sdk.shape, sdk.flags.writeable)
        assert np.array_equal(ours, sdk, equal_nan=ours.dtype.kind in "fc")
    elif isinstance(sdk, pd.DataFrame):
        assert ours.equals(sdk)
    elif isinstance(sdk, (list, tuple)) and sdk and isinstance(sdk[0], np.ndarray):
        for mine, theirs in zip(ours, sdk, strict=True):
            _assert_same(mine, theirs)
    else:
        assert ours == sdk


def _assert_parity(ours: Callable[[], Any], sdk: Callable[[], Any]) -> None:
    (our_kind, our_result), (sdk_kind, sdk_result) = outcome(ours), outcome(sdk)
    assert our_kind == sdk_kind, (our_result, sdk_result)
    if sdk_kind == "error":
        assert isinstance(our_result, type(sdk_result)), (our_result, sdk_result)
    else:
        _assert_same(our_result, sdk_result)


def _sdk_class(name: str) -> Any:
    for module in (sagemaker.serializers, sagemaker.deserializers):
        if hasattr(module, name):
            return getattr(module, name)
    return getattr(sagemaker.base_serializers if name.endswith("Serializer") else sagemaker.base_deserializers, name)


frame = pd.DataFrame({"a": [1, 2], "b": [0.5, float("nan")]})
grid = np.arange(6, dtype=np.float32).reshape(2, 3)

#: (class, constructor keywords, a function making the input afresh for each side).
SERIALIZE: list[tuple[str, dict[str, Any], Make]] = [
    ("CSVSerializer", {}, lambda: [1, 2.5, 3]),
    ("CSVSerializer", {}, lambda: [[1, 2], [3, 4]]),
    ("CSVSerializer", {}, lambda: ["1,2,3", "4,5,6"]),
    ("CSVSerializer", {}, lambda: "1,2,3"),
    ("CSVSerializer", {}, lambda: grid),
    ("CSVSerializer", {}, lambda: np.array([0.1, 1e-20, 3.0])),
    ("CSVSerializer", {}, lambda: np.array([[[1, 2]], [[3, 4]]])),
    ("CSVSerializer", {}, lambda: [["a,b", 'say "hi"', "x\ny"]]),
    ("CSVSerializer", {}, lambda: (1, 2)),
    ("CSVSerializer", {}, lambda: ((1, 2), (3, 4))),
    ("CSVSerializer", {}, lambda: frame),
    ("CSVSerializer", {}, lambda: io.StringIO("1,2\n3,4")),
    ("CSVSerializer", {}, lambda: io.BytesIO(b"1,2")),
    ("CSVSerializer", {}, lambda: b"12"),
    ("CSVSerializer", {}, lambda: []),
    ("CSVSerializer", {}, lambda: np.zeros((0, 3))),
    ("CSVSerializer", {}, lambda: [[]]),
    ("CSVSerializer", {}, lambda: 5),
    ("CSVSerializer", {"content_type": "text/csv; charset=utf-8"}, lambda: [1]),
    ("JSONSerializer", {}, lambda: [1, 2, 3]),
    ("JSONSerializer", {}, lambda: {"a": np.array([1, 2]), "b": "x"}),
    ("JSONSerializer", {}, lambda: grid),
    ("JSONSerializer", {}, lambda: {"nested": [1.0, 2.5e-10, float("nan"), float("inf")], "ü": None}),
    ("JSONSerializer", {}, lambda: "text"),
    ("JSONSerializer", {}, lambda: None),
    ("JSONSerializer", {}, lambda: io.StringIO('{"a": 1}')),
    ("JSONSerializer", {}, lambda: io.BytesIO(b"[1]")),
    ("JSONSerializer", {}, lambda: {1, 2}),
    ("JSONSerializer", {}, lambda: object()),
    ("JSONLinesSerializer", {}, lambda: [{"a": 1}, [2, 3], "x"]),
    ("JSONLinesSerializer", {}, lambda: "raw\nlines"),
    ("JSONLinesSerializer", {}, lambda: io.StringIO('{"a": 1}\n')),
    ("JSONLinesSerializer", {}, lambda: io.BytesIO(b"1\n2")),
    ("JSONLinesSerializer", {}, lambda: []),
    ("JSONLinesSerializer", {}, lambda: ({"k": v} for v in range(3))),
    ("JSONLinesSerializer", {}, lambda: {"a": 1, "b": 2}),
    ("JSONLinesSerializer", {}, lambda: 5),
    ("NumpySerializer", {}, lambda: grid),
    ("NumpySerializer", {}, lambda: np.asfortranarray(grid)),
    ("NumpySerializer", {}, lambda: grid[:, ::2]),
    ("NumpySerializer", {}, lambda: np.array([(1, 2.5)], dtype=[("a", "<i4"), ("b", ">f8")])),
    ("NumpySerializer", {}, lambda: np.array(["ab", "c"])),
    ("NumpySerializer", {}, lambda: np.array(7)),
    ("NumpySerializer", {"dtype": "float32"}, lambda: [[1, 2], [3, 4]]),
    ("NumpySerializer", {"dtype": "float32"}, lambda: np.arange(3)),
    ("NumpySerializer", {}, lambda: (1, 2)),
    ("NumpySerializer", {}, lambda: 5),
    ("NumpySerializer", {}, lambda: io.BytesIO(_npy(grid))),
    ("NumpySerializer", {}, lambda: np.zeros((0, 3))),
    ("NumpySerializer", {}, lambda: []),
    ("IdentitySerializer", {}, lambda: b"\x00raw"),
    ("IdentitySerializer", {}, lambda: "text"),
    ("IdentitySerializer", {"content_type": "image/png"}, lambda: 5),
    ("StringSerializer", {}, lambda: "héllo"),
    ("StringSerializer", {}, lambda: b"bytes"),
    ("LibSVMSerializer", {}, lambda: "1 1:0.5 3:2"),
    ("LibSVMSerializer", {}, lambda: io.StringIO("0 2:1")),
    ("LibSVMSerializer", {}, lambda: [1, 2]),
    ("DataSerializer", {}, lambda: b"\x89PNG"),
    ("DataSerializer", {}, lambda: {"data": b"raw"}),
    ("DataSerializer", {}, lambda: "/no/such/file.bin"),
    ("DataSerializer", {}, lambda: {"other": 1}),
    ("DataSerializer", {}, lambda: 5),
    ("TorchTensorSerializer", {}, lambda: torch.arange(6, dtype=torch.float32).reshape(2, 3)),
    ("TorchTensorSerializer", {}, lambda: torch.arange(6).reshape(2, 3).t()),
    ("TorchTensorSerializer", {}, lambda: torch.ones(3, requires_grad=True) * 2),
    ("TorchTensorSerializer", {}, lambda: torch.tensor(True)),
    ("TorchTensorSerializer", {}, lambda: torch.zeros(0)),
    ("TorchTensorSerializer", {}, lambda: torch.ones(2, dtype=torch.bfloat16)),
    ("TorchTensorSerializer", {}, lambda: np.ones(2)),
    ("TorchTensorSerializer", {"content_type": "application/x-npy"}, lambda: torch.ones(1)),
]


@pytest.mark.parametrize(("name", "kwargs", "make"), SERIALIZE)
def test_serializers_match_the_sdk(name: str, kwargs: dict[str, Any], make: Make) -> None:
    """Each serializer gives the SDK v2's output, type and text byte for byte, or the SDK's exception type."""
    ours, sdk = getattr(client, name)(**kwargs), _sdk_class(name)(**kwargs)
    assert ours.CONTENT_TYPE == sdk.CONTENT_TYPE
    _assert_parity(lambda: ours.serialize(make()), lambda: sdk.serialize(make()))


@pytest.mark.parametrize("mode", ["r", "rb"])
def test_file_objects_in_text_and_binary_mode(tmp_path: Path, mode: str) -> None:
    """open(path) and open(path, "rb") are read as the SDK reads them, by every serializer that takes files."""
    path = tmp_path / "rows.csv"
    path.write_text("1,2\n3,4\n")
    for name in ("CSVSerializer", "JSONSerializer", "JSONLinesSerializer", "NumpySerializer", "LibSVMSerializer"):
        ours, sdk = getattr(client, name)(), _sdk_class(name)()
        with open(path, mode) as mine, open(path, mode) as theirs:
            _assert_parity(lambda: ours.serialize(mine), lambda: sdk.serialize(theirs))  # noqa: B023


def test_data_serializer_reads_a_path(tmp_path: Path) -> None:
    """DataSerializer sends a file's bytes given its path, as the SDK's does."""
    path = tmp_path / "image.bin"
    path.write_bytes(b"\x00\x01\x02")
    sdk = _sdk_class("DataSerializer")()
    _assert_parity(lambda: client.DataSerializer().serialize(str(path)), lambda: sdk.serialize(str(path)))


@pytest.mark.parametrize("kind", ["csr", "csc", "coo", "bsr", "dia"])
def test_sparse_matrix_serializer_writes_what_scipy_loads(kind: str) -> None:
    """A sparse matrix round-trips through scipy.sparse.load_npz from our body as from the SDK's."""
    matrix = scipy.sparse.random(5, 4, density=0.4, format=kind, random_state=0)
    ours, sdk = client.SparseMatrixSerializer(), _sdk_class("SparseMatrixSerializer")()
    assert ours.CONTENT_TYPE == sdk.CONTENT_TYPE == "application/x-npz"
    mine = scipy.sparse.load_npz(io.BytesIO(ours.serialize(matrix)))
    theirs = scipy.sparse.load_npz(io.BytesIO(sdk.serialize(matrix)))
    assert mine.format == theirs.format == kind
    assert (mine != theirs).nnz == 0


def test_a_content_type_that_is_not_a_string_is_refused_alike() -> None:
    """SimpleBaseSerializer's check: a content_type that is not a str is a ValueError."""
    _assert_parity(lambda: client.CSVSerializer(content_type=5), lambda: _sdk_class("CSVSerializer")(content_type=5))  # type: ignore[arg-type]


class Stream(io.BytesIO):
    """A response body as botocore hands it over: read() and close()."""


#: (class, constructor keywords, body, content type).
DESERIALIZE: list[tuple[str, dict[str, Any], bytes, str]] = [
    ("BytesDeserializer", {}, b"\x00abc", "application/octet-stream"),
    ("StringDeserializer", {}, "héllo".encode(), "text/plain"),
    ("StringDeserializer", {"encoding": "latin-1"}, "héllo".encode("latin-1"), "text/plain"),
    ("StringDeserializer", {}, b"\xff", "text/plain"),
    ("CSVDeserializer", {}, b"1,2\n3,4\n", "text/csv"),
    ("CSVDeserializer", {}, b"1,2\n\n3,4", "text/csv"),
    ("CSVDeserializer", {}, b'"a,b",c\r\n"say ""hi""",d', "text/csv"),
    ("CSVDeserializer", {}, b"", "text/csv"),
    ("JSONDeserializer", {}, b'{"a": [1, 2.5, null], "b": "\\u00fc"}', "application/json"),
    ("JSONDeserializer", {}, b"[1, NaN, Infinity, -Infinity]", "application/json"),
    ("JSONDeserializer", {}, b"123456789012345678901234567890", "application/json"),
    ("JSONDeserializer", {}, b'{"id": 12345678901234567890123, "x": 0.12345678901234567890}', "application/json"),
    ("JSONDeserializer", {}, b'{"a": 1, "a": 2}', "application/json"),
    ("JSONDeserializer", {}, b"[1, 2]", "text/csv"),
    ("JSONDeserializer", {}, b"not json", "application/json"),
    ("JSONDeserializer", {}, b"", "application/json"),
    ("JSONDeserializer", {}, b"\xff", "application/json"),
    ("JSONLinesDeserializer", {}, b'{"a": 1}\n[2]\n"x"\n', "application/jsonlines"),
    ("JSONLinesDeserializer", {}, b"1\n2", "application/jsonlines"),
    ("JSONLinesDeserializer", {}, b"1\n\n2", "application/jsonlines"),
    ("JSONLinesDeserializer", {}, b"", "application/jsonlines"),
    ("JSONLinesDeserializer", {}, b"{bad", "application/jsonlines"),
    ("NumpyDeserializer", {}, _npy(grid), "application/x-npy"),
    ("NumpyDeserializer", {}, _npy(np.asfortranarray(grid)), "application/x-npy"),
    ("NumpyDeserializer", {}, _npy(np.array([(1, 2.5)], dtype=[("a", "<i4"), ("b", ">f8")])), "application/x-npy"),
    ("NumpyDeserializer", {}, _npy(np.array(["ab", "c"])), "application/x-npy"),
    ("NumpyDeserializer", {}, _npy(grid)[:-3], "application/x-npy"),
    ("NumpyDeserializer", {}, b"\x93NUMPY garbage", "application/x-npy"),
    ("NumpyDeserializer", {}, b"1,2,3", "text/csv"),
    ("NumpyDeserializer", {}, b"1,2\n3,4", "text/csv"),
    ("NumpyDeserializer", {}, b"1.5,2\n3,4.25", "text/csv"),
    ("NumpyDeserializer", {"dtype": "float32"}, b"1,2\n3,4", "text/csv"),
    ("NumpyDeserializer", {}, b"[[1, 2], [3, 4]]", "application/json"),
    ("NumpyDeserializer", {"dtype": "float32"}, b"[1, 2]", "application/json"),
    ("NumpyDeserializer", {}, b"[1, NaN]", "application/json"),
    ("NumpyDeserializer", {}, b"[1, ", "application/json"),
    ("NumpyDeserializer", {}, b"<html>", "text/html"),
    ("PandasDeserializer", {}, b"a,b\n1,2\n3,4\n", "text/csv"),
    ("PandasDeserializer", {}, b'{"a": {"0": 1, "1": 2}}', "application/json"),
    ("PandasDeserializer", {}, b"a,b\n1,2", "text/plain"),
    ("TorchTensorDeserializer", {}, _npy(grid), "tensor/pt"),
    ("TorchTensorDeserializer", {}, _npy(np.asfortranarray(grid)), "tensor/pt"),
    ("TorchTensorDeserializer", {}, _npy(np.array([1, 2], dtype=np.int64)), "application/x-npy"),
    ("TorchTensorDeserializer", {}, _npy(np.array([1.5], dtype=">f8")), "tensor/pt"),
    ("TorchTensorDeserializer", {}, _npy(np.array(["ab", "c"])), "tensor/pt"),
    ("TorchTensorDeserializer", {}, _npy(grid)[:-3], "tensor/pt"),
    ("TorchTensorDeserializer", {}, b"[1, 2]", "application/json"),
    ("TorchTensorDeserializer", {"accept": "application/x-npy"}, _npy(grid), "application/x-npy"),
]


@pytest.mark.parametrize(("name", "kwargs", "body", "content_type"), DESERIALIZE)
def test_deserializers_match_the_sdk(name: str, kwargs: dict[str, Any], body: bytes, content_type: str) -> None:
    """Each deserializer gives the SDK v2's result (type, value, dtype, writability) or its exception type, and
    closes the stream (also where the SDK's PandasDeserializer leaves it open)."""
    ours, sdk = getattr(client, name)(**kwargs), _sdk_class(name)(**kwargs)
    assert ours.ACCEPT == sdk.ACCEPT
    mine, theirs = Stream(body), Stream(body)
    _assert_parity(lambda: ours.deserialize(mine, content_type), lambda: sdk.deserialize(theirs, content_type))
    assert mine.closed


def test_a_bad_json_answer_raises_json_decode_error_with_the_decoders_message() -> None:
    """Not a werkzeug exception: json.JSONDecodeError, with the standard library's message and position."""
    with pytest.raises(json.JSONDecodeError) as ours:
        client.JSONDeserializer().deserialize(Stream(b'{"a": 1,}'), "application/json")
    with pytest.raises(json.JSONDecodeError) as sdk:
        _sdk_class("JSONDeserializer")().deserialize(Stream(b'{"a": 1,}'), "application/json")
    assert str(ours.value) == str(sdk.value)


def test_stream_deserializer_leaves_the_stream_open() -> None:
    """StreamDeserializer hands back the stream unread with its content type, as the SDK's does."""
    stream = Stream(b"raw")
    assert client.StreamDeserializer().deserialize(stream, "x/y") == (stream, "x/y")
    assert not stream.closed


@pytest.mark.parametrize("accept", ["text/csv", ("a/b", "c/d"), ["a/b"]])
def test_accept_is_the_sdks(accept: Any) -> None:
    """ACCEPT: a str becomes a 1-tuple, anything else is returned as given, as the SDK does."""
    assert client.JSONDeserializer(accept=accept).ACCEPT == _sdk_class("JSONDeserializer")(accept=accept).ACCEPT


@pytest.mark.parametrize(
    "array",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
        np.arange(6, dtype=np.float64).reshape(3, 2) * -1.5,
        np.array([[1, -2, 3], [2**31 - 1, -(2**31), 0]]),
        np.array([0.5, float("nan"), float("inf")], dtype=np.float32),
        np.zeros((2, 0), dtype=np.float32),
        np.zeros((0, 3)),
    ],
    ids=["float32", "float64", "int64", "1-D", "empty rows", "no rows"],
)
def test_record_serializer_writes_the_sdks_bytes(array: np.ndarray) -> None:
    """RecordIO-protobuf written without protobuf is byte for byte the SDK's (a BytesIO at position 0)."""
    ours, sdk = client.RecordSerializer().serialize(array), _sdk_class("RecordSerializer")().serialize(array)
    assert type(ours) is type(sdk)
    assert ours.tell() == sdk.tell() == 0
    assert ours.getvalue() == sdk.getvalue()


@pytest.mark.parametrize(
    "data",
    [np.zeros((2, 2, 2)), np.array([[1.5]], dtype=np.float16), np.array([[2**31]]), [[1.0, 2.0]]],
    ids=["3-D", "float16", "int32 overflow", "a list"],
)
def test_record_serializer_refuses_alike(data: Any) -> None:
    """What the SDK's RecordSerializer refuses, ours refuses with the same exception type."""
    _assert_parity(
        lambda: client.RecordSerializer().serialize(data), lambda: _sdk_class("RecordSerializer")().serialize(data)
    )


def test_record_deserializer_reads_what_the_sdk_reads() -> None:
    """Every record's features and labels, tensor by tensor, as the SDK's protobuf Records hold them: dense
    float32, float64 and int32 values, sparse keys and shape, labels."""
    from sagemaker.amazon.common import write_numpy_to_dense_tensor, write_spmatrix_to_sparse_tensor

    buffer = io.BytesIO()
    write_numpy_to_dense_tensor(buffer, np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1.0, 0.0]))
    write_numpy_to_dense_tensor(buffer, np.array([[-5, 7]]), np.array([3]))
    write_numpy_to_dense_tensor(buffer, np.array([[0.25, -1e300]]))
    sparse = scipy.sparse.csr_matrix(np.array([[0, 2.5, 0, 1.0], [0, 0, 0, 0]]))
    write_spmatrix_to_sparse_tensor(buffer, sparse, np.array([1.0, 2.0]))
    body = buffer.getvalue()
    ours = client.RecordDeserializer().deserialize(Stream(body), "application/x-recordio-protobuf")
    sdk = _sdk_class("RecordDeserializer")().deserialize(Stream(body), "application/x-recordio-protobuf")
    assert len(ours) == len(sdk) == 6
    for mine, theirs in zip(ours, sdk, strict=True):
        for field in ("features", "label"):
            assert sorted(getattr(mine, field)) == sorted(getattr(theirs, field))
            for name, value in getattr(theirs, field).items():
                for kind in ("float32_tensor", "float64_tensor", "int32_tensor"):
                    for part in ("values", "keys", "shape"):
                        expected = list(getattr(getattr(value, kind), part))
                        assert getattr(getattr(getattr(mine, field)[name], kind), part) == expected, (field, kind)


@pytest.mark.parametrize(
    "body",
    [b"\x0a\x23\xd7\xce\x05\x00\x00", b"\x0b\x23\xd7\xce\x00\x00\x00\x00", b"\x0a\x23\xd7\xce\x08\x00\x00\x00\x0a\xff"],
    ids=["cut-short header", "bad magic", "record past the end"],
)
def test_record_deserializer_says_what_is_wrong(body: bytes) -> None:
    """A malformed RecordIO body is a ValueError naming the problem (the SDK asserts or stops silently)."""
    with pytest.raises(ValueError, match="RecordIO"):
        client.RecordDeserializer().deserialize(Stream(body), "application/x-recordio-protobuf")


# The deliberate differences, each as the README's table states it.


def test_difference_object_arrays_are_never_pickled() -> None:
    """The SDK pickles object arrays into .npy and unpickles them with allow_pickle=True; we refuse both."""
    objects = np.array([{"a": 1}, None], dtype=object)
    sdk_body = _sdk_class("NumpySerializer")().serialize(objects)
    assert sdk_body[sdk_body.index(b"\n") + 1] == 0x80  # the SDK's body goes on with a pickle (PROTO), never loaded
    with pytest.raises(ValueError, match="never pickles"):
        client.NumpySerializer().serialize(objects)
    with pytest.raises(ValueError, match="allow_pickle=True is refused"):
        client.NumpyDeserializer(allow_pickle=True)
    with pytest.raises(ValueError, match="object"):
        client.NumpyDeserializer().deserialize(Stream(_npy(objects)), "application/x-npy")


def test_difference_npz_is_a_plain_dict() -> None:
    """The SDK returns numpy's lazy NpzFile (which must be closed); ours is a dict with the same arrays in order."""
    buffer = io.BytesIO()
    np.savez(buffer, scores=grid, labels=np.array([1, 2]))
    ours = client.NumpyDeserializer().deserialize(Stream(buffer.getvalue()), "application/x-npz")
    with _sdk_class("NumpyDeserializer")().deserialize(Stream(buffer.getvalue()), "application/x-npz") as sdk:
        assert type(ours) is dict
        assert list(ours) == sdk.files
        for name in sdk.files:
            _assert_same(ours[name], sdk[name])


def test_difference_media_types_match_as_http_says() -> None:
    """A type in another case or with parameters (charset) is read; the SDK compares the header's text exactly."""
    body = b"[1, 2]"
    with pytest.raises(ValueError, match="cannot read content type"):
        _sdk_class("NumpyDeserializer")().deserialize(Stream(body), "application/json; charset=utf-8")
    assert client.NumpyDeserializer().deserialize(Stream(body), "Application/JSON; charset=utf-8").tolist() == [1, 2]


def test_difference_numpy_values_inside_json_are_written() -> None:
    """NumPy scalars inside lists, dicts or JSON Lines records are written as numbers; the SDK raises TypeError."""
    data = [{"score": np.float32(0.5), "label": np.int64(3)}]
    with pytest.raises(TypeError):
        _sdk_class("JSONSerializer")().serialize(data)
    assert client.JSONSerializer().serialize(data) == '[{"score": 0.5, "label": 3}]'
    assert client.JSONLinesSerializer().serialize(np.array([1, 2])) == "1\n2"


#: Every serializer and deserializer class of the SDK v2.
SDK_NAMES = [
    "SimpleBaseSerializer",
    "CSVSerializer",
    "NumpySerializer",
    "JSONSerializer",
    "IdentitySerializer",
    "JSONLinesSerializer",
    "SparseMatrixSerializer",
    "LibSVMSerializer",
    "DataSerializer",
    "StringSerializer",
    "SimpleBaseDeserializer",
    "StringDeserializer",
    "BytesDeserializer",
    "CSVDeserializer",
    "StreamDeserializer",
    "NumpyDeserializer",
    "JSONDeserializer",
    "PandasDeserializer",
    "JSONLinesDeserializer",
    "RecordSerializer",
    "RecordDeserializer",
    "TorchTensorSerializer",
    "TorchTensorDeserializer",
]


@pytest.mark.parametrize("name", SDK_NAMES)
def test_constructor_arguments_match_the_sdk(name: str) -> None:
    """Each class the SDK v2 also has takes the same constructor arguments, with the same defaults."""

    def arguments(cls: type) -> list[tuple[str, Any]]:
        return [(p.name, p.default) for p in inspect.signature(cls.__init__).parameters.values()]

    assert arguments(getattr(client, name)) == arguments(_sdk_class(name))


def test_every_sdk_class_is_listed() -> None:
    """The list above is every serializer and deserializer class the SDK v2 defines."""
    defined = {
        name
        for module in (sagemaker.base_serializers, sagemaker.base_deserializers)
        for name, value in vars(module).items()
        if inspect.isclass(value) and value.__module__ == module.__name__ and not inspect.isabstract(value)
    }
    assert defined == set(SDK_NAMES) - {"SimpleBaseSerializer", "SimpleBaseDeserializer"}  # abstract in the SDK
