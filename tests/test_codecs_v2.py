"""The Open Inference Protocol v2 codec: round trips, zero copies, the real tritonclient, and precise refusals."""

from __future__ import annotations

import contextlib
import math
import struct
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from inference_server.codecs import v2
from inference_server.codecs._registry import Limits
from inference_server.errors import DecodeError, EncodeError, NotAcceptable

# -- helpers ---------------------------------------------------------------------------------------------------------

#: A sample array of every datatype (BF16 as its raw uint16 bits), with extremes where the type has them.
SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 1, 255]], dtype=np.uint8),
    "UINT16": np.array([0, 65535], dtype=np.uint16),
    "UINT32": np.array([0, 2**32 - 1], dtype=np.uint32),
    "UINT64": np.array([0, 2**64 - 1], dtype=np.uint64),
    "INT8": np.array([-128, 0, 127], dtype=np.int8),
    "INT16": np.array([-(2**15), 2**15 - 1], dtype=np.int16),
    "INT32": np.array([[-(2**31)], [2**31 - 1]], dtype=np.int32),
    "INT64": np.array([-(2**63), 0, 2**63 - 1], dtype=np.int64),
    "FP16": np.array([0.5, -1.0, 65504.0], dtype=np.float16),
    "FP32": np.array([[0.1, -3.4028235e38], [1e-45, 7.0]], dtype=np.float32),
    "FP64": np.array([0.1, 1.7976931348623157e308, -5e-324]),
    "BF16": np.array([0x3F80, 0xC000, 0x7F7F], dtype=np.uint16),
    "BYTES": np.array([[b"", b"ab\x00", "é".encode()]], dtype=object),
}
JSONABLE = [name for name, datatype in v2.DATATYPES.items() if datatype.json]


def _object_array(items: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


def _join(buffers: list[Any]) -> bytes:
    return b"".join(bytes(buffer) for buffer in buffers)


def _serialize_bytes(array: np.ndarray) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in array.reshape(-1).tolist())


def _raw(datatype: str, array: np.ndarray) -> bytes:
    return _serialize_bytes(array) if datatype == "BYTES" else array.astype(array.dtype.newbyteorder("<")).tobytes()


def _json_values(datatype: str, array: np.ndarray) -> list[Any]:
    if datatype == "BYTES":
        return [item.decode() for item in array.reshape(-1).tolist()]
    return array.reshape(-1).tolist()


def _body(
    inputs: list[dict[str, Any]],
    tail: bytes = b"",
    outputs: Any = None,
    **fields: Any,
) -> tuple[bytes, int | None]:
    """A request body (JSON object then ``tail``) and its header length (``None`` when there is no tail)."""
    request: dict[str, Any] = {**fields, "inputs": inputs}
    if outputs is not None:
        request["outputs"] = outputs
    header = orjson.dumps(request)
    return header + tail, (len(header) if tail else None)


def _tensor(name: str, datatype: str, array: np.ndarray, binary: bool) -> tuple[dict[str, Any], bytes]:
    entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
    if binary:
        raw = _raw(datatype, array)
        entry["parameters"] = {"binary_data_size": len(raw)}
        return entry, raw
    entry["data"] = _json_values(datatype, array)
    return entry, b""


def _request(tensors: list[tuple[str, str, np.ndarray, bool]], **fields: Any) -> tuple[bytes, int | None]:
    entries, tails = zip(*(_tensor(*tensor) for tensor in tensors), strict=True) if tensors else ((), ())
    return _body(list(entries), b"".join(tails), **fields)


def _decode_error(body: bytes, header_length: int | None = None, limits: Limits | None = None) -> str:
    with pytest.raises(DecodeError) as info:
        v2.decode_request(body, header_length, limits)
    return str(info.value)


def _assert_same(decoded: np.ndarray, expected: np.ndarray) -> None:
    assert decoded.shape == expected.shape
    assert decoded.dtype == (np.dtype(object) if expected.dtype == object else expected.dtype)
    assert decoded.tolist() == expected.tolist()


@pytest.fixture(scope="module")
def triton() -> ModuleType:
    """``tritonclient.http``: the real client the codec must interoperate with."""
    return pytest.importorskip("tritonclient.http")


def _triton_request(
    triton: ModuleType, inputs: list[Any], outputs: list[Any] | None = None, request_id: str = ""
) -> tuple[bytes, int | None]:
    """The exact body and Inference-Header-Content-Length that tritonclient's InferenceServerClient.infer sends:
    its public generate_request_body calls the same _utils._get_inference_request that infer does."""
    body, header_length = triton.InferenceServerClient.generate_request_body(inputs, outputs, request_id=request_id)
    return body, header_length


def _triton_result(triton: ModuleType, response: v2.EncodedResponse) -> Any:
    return triton.InferResult.from_response_body(_join(response.body), header_length=response.header_length)


# -- the datatype table ----------------------------------------------------------------------------------------------


def test_datatype_table_is_the_specs() -> None:
    """The table holds exactly the spec's datatypes plus BF16, little-endian, with the spec's element sizes."""
    sizes = {"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2, "INT32": 4}
    sizes |= {"INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2, "BYTES": 0}
    assert {name: datatype.size for name, datatype in v2.DATATYPES.items()} == sizes
    for datatype in v2.DATATYPES.values():
        assert datatype.dtype == datatype.dtype.newbyteorder("<")
        if datatype.name != "BYTES":
            assert datatype.dtype.itemsize == datatype.size
    assert [name for name, datatype in v2.DATATYPES.items() if not datatype.json] == ["FP16", "BF16"]


@pytest.mark.parametrize("datatype", [name for name in SAMPLES if name != "BF16"])
def test_datatype_of_names_every_sample(datatype: str) -> None:
    """Each sample array's dtype maps back to its own datatype."""
    assert v2.datatype_of(SAMPLES[datatype]) == datatype


# -- decoding --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_binary_round_trip_of_every_datatype(datatype: str) -> None:
    """Every datatype sent as binary data decodes to the same values, dtype and shape."""
    array = SAMPLES[datatype]
    body, header_length = _request([("x", datatype, array, True)])
    request = v2.decode_request(body, header_length)
    _assert_same(request.inputs["x"], array)
    assert request.datatypes == {"x": datatype}


@pytest.mark.parametrize("datatype", JSONABLE)
def test_json_round_trip_of_every_datatype_flat_and_nested(datatype: str) -> None:
    """Every JSON datatype decodes the same from flat data and from data nested as the shape."""
    array = SAMPLES[datatype]
    flat, _ = _request([("x", datatype, array, False)])
    entry = {"name": "x", "shape": list(array.shape), "datatype": datatype}
    nested_values = array.tolist() if datatype != "BYTES" else [[item.decode() for item in row] for row in array]
    nested, _ = _body([{**entry, "data": nested_values}])
    for body in (flat, nested):
        decoded = v2.decode_request(body).inputs["x"]
        _assert_same(decoded, array)
        assert decoded.flags.writeable


def test_binary_inputs_are_views_on_the_body() -> None:
    """Binary tensors share the body's memory (no copy), whatever the buffer type."""
    tensors = [(f"x{i}", name, SAMPLES[name], True) for i, name in enumerate(("FP32", "BOOL", "INT64", "FP16"))]
    body, header_length = _request(tensors)
    for buffer in (body, bytearray(body), memoryview(body)):
        request = v2.decode_request(buffer, header_length)
        whole = np.frombuffer(buffer, np.uint8)
        for name, *_ in tensors:
            assert np.shares_memory(request.inputs[name], whole), name
    mutable = bytearray(body)
    request = v2.decode_request(mutable, header_length)
    mutable[-6:] = np.full(3, 7, np.float16).tobytes()
    assert request.inputs["x3"].tolist() == [7.0, 7.0, 7.0]


def test_mixed_json_and_binary_inputs_in_order() -> None:
    """JSON and binary inputs mix; binary data is taken in the order of the inputs; names keep the request's order."""
    tensors = [
        ("a", "INT32", SAMPLES["INT32"], True),
        ("b", "FP64", SAMPLES["FP64"], False),
        ("c", "BYTES", SAMPLES["BYTES"], True),
        ("d", "UINT8", SAMPLES["UINT8"], True),
    ]
    body, header_length = _request(tensors, id="req-7", parameters={"custom": "yes", "binary_data_output": True})
    request = v2.decode_request(body, header_length)
    assert list(request.inputs) == ["a", "b", "c", "d"]
    for name, _, array, _ in tensors:
        _assert_same(request.inputs[name], array)
    assert request.id == "req-7"
    assert request.parameters == {"custom": "yes", "binary_data_output": True}
    assert request.binary_data_output is True
    assert request.input_parameters["a"] == {"binary_data_size": 8}
    assert request.outputs is None


def test_requested_outputs_resolve_binary_against_the_default() -> None:
    """Each output's binary_data overrides the request's binary_data_output; absent, the default applies."""
    outputs = [{"name": "p", "parameters": {"binary_data": False}}, {"name": "q"}]
    body, _ = _request(
        [("x", "INT8", SAMPLES["INT8"], False)], outputs=outputs, parameters={"binary_data_output": True}
    )
    request = v2.decode_request(body)
    assert [(output.name, output.binary) for output in request.outputs or ()] == [("p", False), ("q", True)]
    assert request.binary("p") is False
    assert request.binary("q") is True
    body, _ = _request([("x", "INT8", SAMPLES["INT8"], False)], outputs=[{"name": "p"}])
    assert v2.decode_request(body).binary("p") is False


def test_empty_tensors_and_scalars() -> None:
    """Zero-element tensors (binary or JSON) and shape-[] scalars decode with their shapes."""
    tensors = [
        ("e", "FP32", np.zeros((0, 3), np.float32), True),
        ("s", "BYTES", np.empty((2, 0), object), True),
        ("j", "INT16", np.zeros((3, 0), np.int16), False),
        ("k", "INT64", np.array(5), False),
        ("b", "BOOL", np.array(True), True),
    ]
    body, header_length = _request(tensors)
    request = v2.decode_request(body, header_length)
    for name, _, array, _ in tensors:
        _assert_same(request.inputs[name], array)


def test_bytes_elements_are_python_bytes_never_strings() -> None:
    """BYTES tensors are object arrays of bytes, from binary data and from JSON strings alike."""
    body, header_length = _request([("b", "BYTES", SAMPLES["BYTES"], True), ("j", "BYTES", SAMPLES["BYTES"], False)])
    request = v2.decode_request(body, header_length)
    for name in ("b", "j"):
        assert all(type(item) is bytes for item in request.inputs[name].flat)


def test_parse_header_length() -> None:
    """The header's value parses as a non-negative integer; anything else is a 400 naming the header."""
    assert v2.parse_header_length(None) is None
    assert v2.parse_header_length(" 42 ") == 42
    for bad in ("-1", "x", "1.5", "", "²"):
        with pytest.raises(DecodeError, match="Inference-Header-Content-Length"):
            v2.parse_header_length(bad)


# -- decoding errors -------------------------------------------------------------------------------------------------

FP32_2x2 = {"name": "x", "shape": [2, 2], "datatype": "FP32"}


def _binary_entry(size: int, **overrides: Any) -> dict[str, Any]:
    return {**FP32_2x2, "parameters": {"binary_data_size": size}, **overrides}


ERRORS: list[tuple[str, bytes, int | None, list[str]]] = [
    ("malformed JSON", b'{"inputs": [', None, ["not valid JSON"]),
    ("not an object", b"[1, 2]", None, ["must be a JSON object", "array"]),
    ("no inputs", b'{"id": "1"}', None, ["no inputs"]),
    ("inputs not an array", b'{"inputs": {}}', None, ["inputs must be a JSON array"]),
    ("input not an object", b'{"inputs": [3]}', None, ["inputs[0]", "JSON object"]),
    ("no name", _body([{"shape": [1], "datatype": "FP32", "data": [1]}])[0], None, ["inputs[0]", "no name"]),
    ("name not str", _body([{"name": 3, "shape": [1], "datatype": "FP32"}])[0], None, ["inputs[0]", "integer name"]),
    ("no shape", _body([{"name": "x", "datatype": "FP32", "data": [1]}])[0], None, ["'x'", "no shape"]),
    ("no datatype", _body([{"name": "x", "shape": [1], "data": [1]}])[0], None, ["'x'", "no datatype"]),
    ("unknown datatype", _body([{**FP32_2x2, "datatype": "FLOAT32"}])[0], None, ["'x'", "unknown datatype 'FLOAT32'"]),
    ("negative dim", _body([{**FP32_2x2, "shape": [2, -1]}])[0], None, ["'x'", "negative dimension"]),
    ("float dim", _body([{**FP32_2x2, "shape": [2.0, 2]}])[0], None, ["'x'", "non-integer number dimension (#0)"]),
    ("bool dim", _body([{**FP32_2x2, "shape": [True]}])[0], None, ["'x'", "boolean dimension"]),
    ("shape not array", _body([{**FP32_2x2, "shape": "2x2"}])[0], None, ["'x'", "shape must be a JSON array"]),
    ("dim over u64", b'{"inputs":[{"name":"x","shape":[18446744073709551616],"datatype":"INT8","data":[]}]}', None,
     ["'x'", "dimension"]),
    ("huge shape", _body([{**FP32_2x2, "shape": [2**62, 2**62, 0]}])[0], None, ["'x'", "too large"]),
    ("huge empty shape", _body([{**FP32_2x2, "shape": [0, 2**60], "data": []}])[0], None, ["'x'", "too large"]),
    ("too many dims", _body([{**FP32_2x2, "shape": [1] * 33}])[0], None, ["'x'", "33 dimensions"]),
    ("count != shape, flat", _body([{**FP32_2x2, "data": [1, 2, 3]}])[0], None, ["'x'", "neither flat with 4"]),
    ("count != shape, 1-D", _body([{**FP32_2x2, "shape": [4], "data": [1, 2, 3]}])[0], None,
     ["'x'", "3 elements", "needs 4"]),
    ("nested wrongly", _body([{**FP32_2x2, "data": [[1, 2, 3], [4]]}])[0], None,
     ["'x'", "nested as shape [2, 2]", "list of 3 at depth 1"]),
    ("nested too deep", _body([{**FP32_2x2, "shape": [2], "data": [[1], [2]]}])[0], None,
     ["'x'", "nests deeper than shape [2]"]),
    ("data not array", _body([{**FP32_2x2, "data": "1,2,3,4"}])[0], None, ["'x'", "data must be a JSON array"]),
    ("strings for FP32", _body([{**FP32_2x2, "data": [1, 2, "3", 4]}])[0], None, ["'x'", "FP32", "numbers", "string"]),
    ("bools for FP32", _body([{**FP32_2x2, "data": [1, 2, True, 4]}])[0], None, ["'x'", "numbers", "boolean (true)"]),
    ("floats for INT32", _body([{**FP32_2x2, "datatype": "INT32", "data": [1, 2.5, 3, 4]}])[0], None,
     ["'x'", "INT32 data must be integers", "non-integer number (2.5)"]),
    ("bools for INT32", _body([{**FP32_2x2, "datatype": "INT32", "data": [1, False, 3, 4]}])[0], None,
     ["'x'", "integers", "boolean (false)"]),
    ("over INT8", _body([{**FP32_2x2, "datatype": "INT8", "data": [1, 300, 3, 4]}])[0], None,
     ["'x'", "INT8 data holds 300, outside [-128, 127]"]),
    ("under INT8", _body([{**FP32_2x2, "datatype": "INT8", "data": [1, -129, 3, 4]}])[0], None,
     ["'x'", "INT8 data holds -129"]),
    ("negative UINT32", _body([{**FP32_2x2, "datatype": "UINT32", "data": [-1, 0, 3, 4]}])[0], None,
     ["'x'", "UINT32 data holds -1"]),
    ("over UINT64", b'{"inputs":[{"name":"x","shape":[1],"datatype":"UINT64","data":[18446744073709551616]}]}', None,
     ["'x'", "UINT64 data must be integers"]),
    ("ints for BOOL", _body([{**FP32_2x2, "datatype": "BOOL", "data": [True, 1, 0, False]}])[0], None,
     ["'x'", "BOOL data must be true or false", "integer (1)"]),
    ("numbers for BYTES", _body([{**FP32_2x2, "datatype": "BYTES", "data": ["a", "b", 3, "d"]}])[0], None,
     ["'x'", "BYTES data must be strings", "integer (3)"]),
    ("objects in data", _body([{**FP32_2x2, "data": [1, 2, {}, 4]}])[0], None,
     ["'x'", "FP32 data must be numbers, but holds an object"]),
    ("FP32 overflow", _body([{**FP32_2x2, "data": [1, 2, 3, 1e39]}])[0], None, ["'x'", "outside the range of FP32"]),
    ("FP16 as JSON", _body([{**FP32_2x2, "datatype": "FP16", "data": [1, 2, 3, 4]}])[0], None,
     ["'x'", "FP16 data cannot be sent as JSON"]),
    ("BF16 as JSON", _body([{**FP32_2x2, "datatype": "BF16", "data": [1, 2, 3, 4]}])[0], None,
     ["'x'", "BF16 data cannot be sent as JSON"]),
    ("neither data nor binary", _body([FP32_2x2])[0], None, ["'x'", "neither data nor parameters.binary_data_size"]),
    ("data and binary", *_body([{**_binary_entry(16), "data": [1, 2, 3, 4]}], bytes(16)), ["'x'", "both data"]),
    ("size not int", *_body([_binary_entry("16")], bytes(16)), ["'x'", "binary_data_size must be a non-negative"]),
    ("size negative", *_body([_binary_entry(-16)], bytes(16)), ["'x'", "binary_data_size must be a non-negative"]),
    ("size != shape x element", *_body([_binary_entry(12)], bytes(12)), ["'x'", "binary_data_size is 12", "needs 16"]),
    ("sizes over the tail", *_body([_binary_entry(16), _binary_entry(16, name="y")], bytes(20)),
     ["'y'", "runs past the body", "4 bytes"]),
    ("sizes under the tail", *_body([_binary_entry(16), _binary_entry(16, name="y")], bytes(40)),
     ["'y'", "last binary input", "8 more bytes"]),
    ("tail without binary inputs", *_body([{**FP32_2x2, "data": [1, 2, 3, 4]}], bytes(4)),
     ["4 bytes follow", "no input has binary_data_size"]),
    ("binary without header length", _body([_binary_entry(16)])[0], None,
     ["'x'", "binary_data_size 16", "no Inference-Header-Content-Length"]),
    ("binary data without header length", _body([_binary_entry(16)], bytes(16))[0], None,
     ["not valid JSON", "binary tensor data after the JSON object needs an Inference-Header-Content-Length"]),
    ("header length past body", b'{"inputs": []}', 15, ["Inference-Header-Content-Length is 15", "only 14 bytes"]),
    ("header length negative", b'{"inputs": []}', -1, ["Inference-Header-Content-Length is -1"]),
    ("raw binary request", bytes(16), 0, ["raw binary requests", "not supported"]),
    ("BOOL byte 2", *_body([{**_binary_entry(2), "datatype": "BOOL", "shape": [2]}], b"\x01\x02"),
     ["'x'", "BOOL binary data holds a byte other than 0 and 1"]),
    ("BYTES prefix past tensor", *_body([{**_binary_entry(9), "datatype": "BYTES", "shape": [2]}],
     struct.pack("<I", 1) + b"a" + struct.pack("<I", 9)), ["'x'", "BYTES element 1 has length 9", "9 bytes"]),
    ("BYTES too few elements", *_body([{**_binary_entry(10), "datatype": "BYTES", "shape": [2]}],
     struct.pack("<I", 6) + b"abcdef"), ["'x'", "end after 1 elements", "needs 2"]),
    ("BYTES too many for the size", *_body([{**_binary_entry(4), "datatype": "BYTES", "shape": [2]}],
     struct.pack("<I", 0)), ["'x'", "needs 2 BYTES elements", "at most 1"]),
    ("BYTES left over", *_body([{**_binary_entry(10), "datatype": "BYTES", "shape": [1]}],
     struct.pack("<I", 1) + b"a" + b"zzzzz"), ["'x'", "more than the 1 elements", "5 bytes left over"]),
    ("duplicate inputs", _body([{**FP32_2x2, "data": [1, 2, 3, 4]}] * 2)[0], None, ["'x'", "given twice"]),
    ("duplicate outputs", _body([], outputs=[{"name": "y"}, {"name": "y"}])[0], None, ["'y'", "requested twice"]),
    ("output not an object", _body([], outputs=["y"])[0], None, ["outputs[0]", "JSON object"]),
    ("output without name", _body([], outputs=[{}])[0], None, ["outputs[0]", "no name"]),
    ("outputs not an array", _body([], outputs={"name": "y"})[0], None, ["outputs must be a JSON array"]),
    ("binary_data not bool", _body([], outputs=[{"name": "y", "parameters": {"binary_data": 1}}])[0], None,
     ["'y'", "binary_data must be true or false"]),
    ("classification", _body([], outputs=[{"name": "y", "parameters": {"classification": 3}}])[0], None,
     ["'y'", "classification extension is not supported"]),
    ("output shared memory", _body([], outputs=[{"name": "y", "parameters": {"shared_memory_region": "r"}}])[0], None,
     ["'y'", "shared memory"]),
    ("input shared memory", _body([{**FP32_2x2, "parameters": {"shared_memory_region": "r"}}])[0], None,
     ["'x'", "shared memory"]),
    ("input parameters not object", _body([{**FP32_2x2, "parameters": [1]}])[0], None,
     ["'x'", "parameters must be a JSON object"]),
    ("binary_data_output not bool", _body([], parameters={"binary_data_output": "true"})[0], None,
     ["the request", "binary_data_output must be true or false"]),
    ("request parameters not object", _body([], parameters=3)[0], None, ["parameters must be a JSON object"]),
    ("id not a string", _body([], id=42)[0], None, ["request id must be a string"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "header_length", "expected"), [case[1:] for case in ERRORS], ids=[c[0] for c in ERRORS]
)
def test_invalid_requests_are_400s_naming_the_tensor_and_problem(
    body: bytes, header_length: int | None, expected: list[str]
) -> None:
    """Each invalid request is a DecodeError (400) whose message names the tensor and says what is wrong."""
    message = _decode_error(body, header_length)
    for part in expected:
        assert part in message, (part, message)


def test_limits_bound_tensor_count_and_decoded_bytes() -> None:
    """Over-limit tensor counts and decoded sizes (JSON arrays, BYTES elements) are 400s naming the tensor."""
    few = Limits(max_archive_members=2)
    body, _ = _body([{**FP32_2x2, "name": f"x{i}", "data": [1, 2, 3, 4]} for i in range(3)])
    assert "3 inputs; at most 2" in _decode_error(body, None, few)
    body, _ = _body([], outputs=[{"name": f"y{i}"} for i in range(3)])
    assert "3 outputs; at most 2" in _decode_error(body, None, few)
    small = Limits(max_decompressed_bytes=100)
    body, _ = _body([{"name": "big", "shape": [20], "datatype": "FP64", "data": [0.5] * 20}])
    assert "'big'" in _decode_error(body, None, small)
    assert "over 100 bytes" in _decode_error(body, None, small)
    raw = struct.pack("<I", 0) * 10
    body, header_length = _body(
        [{"name": "s", "shape": [10], "datatype": "BYTES", "parameters": {"binary_data_size": 40}}], raw
    )
    assert "'s'" in _decode_error(body, header_length, small)
    body, _ = _body([{"name": "j", "shape": [3], "datatype": "BYTES", "data": ["a", "b", "c"]}])
    assert "'j'" in _decode_error(body, None, small)
    body, _ = _body([{"name": "fine", "shape": [10], "datatype": "INT8", "data": list(range(10))}])
    assert v2.decode_request(body, None, small).inputs["fine"].tolist() == list(range(10))


def test_binary_data_size_zero_needs_no_header_length() -> None:
    """An empty binary tensor needs no binary data, so no Inference-Header-Content-Length either."""
    body, _ = _body([{**_binary_entry(0), "shape": [0, 2]}])
    assert v2.decode_request(body).inputs["x"].shape == (0, 2)


def test_empty_outputs_list_means_every_output() -> None:
    """An empty outputs array asks for every output, like an absent one."""
    body, _ = _body([], outputs=[])
    assert v2.decode_request(body).outputs is None


# -- encoding --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", [name for name in SAMPLES if name != "BF16"])
def test_binary_response_round_trip_of_every_datatype(datatype: str) -> None:
    """Every datatype sent as binary data comes back from the body exactly (BYTES length-prefixed)."""
    array = SAMPLES[datatype]
    response = v2.encode_response("m", None, [("y", array)], binary=True)
    assert response.content_type == "application/octet-stream"
    body = _join(response.body)
    header = orjson.loads(body[: response.header_length])
    (output,) = header["outputs"]
    assert output == {
        "name": "y",
        "datatype": datatype,
        "shape": list(array.shape),
        "parameters": {"binary_data_size": len(body) - (response.header_length or 0)},
    }
    assert body[response.header_length :] == _raw(datatype, array)


@pytest.mark.parametrize("datatype", JSONABLE)
def test_json_response_round_trip_of_every_datatype(datatype: str) -> None:
    """Every JSON datatype is written flat, row-major, and decodes back to the same values."""
    array = SAMPLES[datatype]
    response = v2.encode_response("m", "7", [("y", array)])
    assert response.content_type == "application/json"
    assert response.header_length is None
    (output,) = orjson.loads(_join(response.body))["outputs"]
    if datatype == "FP32":  # the shortest digits that read back as the same float32
        assert np.array(output["data"], np.float32).tobytes() == array.tobytes()
    else:
        assert output["data"] == _json_values(datatype, array)
    request_body, _ = _body([{"name": "y", "shape": output["shape"], "datatype": datatype, "data": output["data"]}])
    _assert_same(v2.decode_request(request_body).inputs["y"], array)


def test_response_object_fields() -> None:
    """The response has model_name, the request's id when it had one, and outputs; never model_version."""
    array = np.arange(3, dtype=np.int32)
    with_id = orjson.loads(_join(v2.encode_response("m", "abc", [("y", array)]).body))
    assert with_id == {
        "model_name": "m",
        "id": "abc",
        "outputs": [{"name": "y", "datatype": "INT32", "shape": [3], "data": [0, 1, 2]}],
    }
    without = orjson.loads(_join(v2.encode_response("m", None, [("y", array)]).body))
    assert "id" not in without
    assert "model_version" not in without


def test_binary_outputs_are_the_arrays_own_memory() -> None:
    """Binary outputs are the arrays' memory (no copy); non-contiguous and big-endian arrays are converted."""
    own = np.arange(12, dtype=np.float32).reshape(3, 4)
    flags = np.array([True, False])
    strided = np.arange(20, dtype=np.int64)[::2]
    swapped = np.arange(4, dtype=">i4")
    response = v2.encode_response("m", None, [("a", own), ("b", flags), ("c", strided), ("d", swapped)], binary=True)
    header, a, b, c, d = response.body
    assert np.shares_memory(np.frombuffer(a, np.uint8), own)
    assert np.shares_memory(np.frombuffer(b, np.uint8), flags)
    assert np.frombuffer(c, "<i8").tolist() == strided.tolist()
    assert np.frombuffer(d, "<i4").tolist() == [0, 1, 2, 3]
    assert response.header_length == len(header)


def test_binary_per_output_and_empty_binary_outputs() -> None:
    """binary may be per output; an empty binary output adds no buffer but still sets binary_data_size 0."""
    outputs = [("j", np.arange(2)), ("e", np.zeros((0,), np.float32)), ("b", np.ones(2, np.uint8))]
    response = v2.encode_response("m", None, outputs, binary={"e": True, "b": True})
    assert len(response.body) == 2
    header = orjson.loads(bytes(response.body[0]))
    assert [output.get("parameters") for output in header["outputs"]] == [
        None,
        {"binary_data_size": 0},
        {"binary_data_size": 2},
    ]
    assert header["outputs"][0]["data"] == [0, 1]


@pytest.mark.parametrize(
    ("array", "problem"),
    [
        (SAMPLES["FP16"], "FP16, which cannot be sent as JSON"),
        (np.array([1.0, np.nan], np.float32), "NaN or infinity"),
        (np.array([np.inf]), "NaN or infinity"),
        (np.array([b"\xff"], dtype=object), "not UTF-8"),
    ],
)
def test_outputs_json_cannot_carry_are_406s(array: np.ndarray, problem: str) -> None:
    """FP16/BF16, NaN/infinity and non-UTF-8 bytes requested as JSON are 406s naming the output; binary works."""
    with pytest.raises(NotAcceptable) as info:
        v2.encode_response("m", None, [("y", array)])
    assert "'y'" in str(info.value)
    assert problem in str(info.value)
    assert "binary_data" in str(info.value)
    v2.encode_response("m", None, [("y", array)], binary=True)


@pytest.mark.parametrize(
    ("array", "problem"),
    [
        (np.array([1 + 2j]), "complex128"),
        (np.array(["a", None], dtype=object), "holding NoneType"),
        (np.array(["2024-01-01"], dtype="datetime64[D]"), "datetime64"),
    ],
)
def test_outputs_without_a_datatype_are_500s(array: np.ndarray, problem: str) -> None:
    """An output of a dtype with no v2 datatype is an EncodeError (500) naming it."""
    with pytest.raises(EncodeError, match=problem) as info:
        v2.encode_response("m", None, [("y", array)])
    assert "'y'" in str(info.value)


def test_strings_and_fixed_width_arrays_are_bytes() -> None:
    """str, np.str_ and np.bytes_ arrays are BYTES (str as UTF-8)."""
    outputs = [("u", np.array(["é", "b"])), ("s", np.array([b"x", b"yz"])), ("o", np.array(["é", b"q"], dtype=object))]
    response = v2.encode_response("m", None, outputs, binary=True)
    body = _join(response.body)
    header = orjson.loads(body[: response.header_length])
    assert [output["datatype"] for output in header["outputs"]] == ["BYTES"] * 3
    tail = body[response.header_length :]
    assert tail == _serialize_bytes(np.array(["é".encode(), b"b", b"x", b"yz", "é".encode(), b"q"], dtype=object))


def test_uint16_declared_bf16() -> None:
    """A uint16 output is UINT16 unless declared BF16, then sent as BF16 raw bits; other mismatches are 500s."""
    bits = SAMPLES["BF16"]
    assert v2.datatype_of(bits) == "UINT16"
    response = v2.encode_response("m", None, [("y", bits)], binary=True, datatypes={"y": "BF16"})
    body = _join(response.body)
    assert orjson.loads(body[: response.header_length])["outputs"][0]["datatype"] == "BF16"
    assert body[response.header_length :] == bits.tobytes()
    with pytest.raises(EncodeError, match="declared FP32"):
        v2.encode_response("m", None, [("y", bits)], datatypes={"y": "FP32"})
    with pytest.raises(NotAcceptable, match="BF16"):
        v2.encode_response("m", None, [("y", bits)], datatypes={"y": "BF16"})


# -- named outputs ---------------------------------------------------------------------------------------------------


def test_named_outputs_from_every_prediction_shape() -> None:
    """ndarray -> output_0; dict -> its keys; tuple or list of arrays -> output_i; scalars/lists via np.asarray."""
    a, b = np.arange(3), np.ones(2)

    def names(prediction: Any) -> list[tuple[str, list[Any]]]:
        return [(name, array.tolist()) for name, array in v2.named_outputs(prediction)]

    assert names(a) == [("output_0", [0, 1, 2])]
    assert names({"p": a, "q": [1.5]}) == [("p", [0, 1, 2]), ("q", [1.5])]
    assert names([a, b]) == [("output_0", [0, 1, 2]), ("output_1", [1.0, 1.0])]
    assert names((a, 3)) == [("output_0", [0, 1, 2]), ("output_1", 3)]
    assert names(4.5) == [("output_0", 4.5)]
    assert names([[1, 2], [3, 4]]) == [("output_0", [[1, 2], [3, 4]])]
    assert names(["x", "y"]) == [("output_0", ["x", "y"])]


def test_named_outputs_selection_and_unknown_names() -> None:
    """Requested outputs come in the requested order; an unknown requested name is a 400 naming it."""
    prediction = {"p": np.arange(2), "q": np.arange(3), "r": np.arange(4)}
    assert [name for name, _ in v2.named_outputs(prediction, ["r", "p"])] == ["r", "p"]
    with pytest.raises(DecodeError, match="requested output 'zz' is not among the model's outputs: 'p', 'q', 'r'"):
        v2.named_outputs(prediction, ["p", "zz"])
    with pytest.raises(EncodeError, match="int key"):
        v2.named_outputs({1: np.arange(2)})
    with pytest.raises(EncodeError, match="'output_0' cannot be made an array"):
        v2.named_outputs([[1], [2, 3]])


def test_respond_applies_the_requests_outputs_and_flags() -> None:
    """respond keeps the requested outputs, each binary or JSON as asked, and echoes the id."""
    outputs = [{"name": "q", "parameters": {"binary_data": True}}, {"name": "p"}]
    body, _ = _body([], outputs=outputs, id="r1")
    request = v2.decode_request(body)
    response = v2.respond("m", request, {"p": np.arange(2), "q": np.arange(3, dtype=np.int8), "r": 1})
    body = _join(response.body)
    header = orjson.loads(body[: response.header_length])
    assert header["id"] == "r1"
    assert [(output["name"], "data" in output) for output in header["outputs"]] == [("q", False), ("p", True)]
    assert body[response.header_length :] == bytes([0, 1, 2])
    everything, _ = _body([], parameters={"binary_data_output": True})
    response = v2.respond("m", v2.decode_request(everything), np.arange(2, dtype=np.int16))
    assert response.content_type == "application/octet-stream"


# -- the real tritonclient -------------------------------------------------------------------------------------------

TRITON_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16"]
TRITON_DATATYPES += ["FP32", "FP64", "BYTES"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", TRITON_DATATYPES)
def test_decodes_what_tritonclient_sends(triton: ModuleType, datatype: str, binary: bool) -> None:
    """Requests built by tritonclient.http decode to the arrays given to set_data_from_numpy (FP16 JSON refused)."""
    array = SAMPLES[datatype]
    tensor = triton.InferInput("x", list(array.shape), datatype).set_data_from_numpy(array, binary_data=binary)
    other = triton.InferInput("n", [2], "INT64").set_data_from_numpy(np.array([5, 6]), binary_data=not binary)
    outputs = [triton.InferRequestedOutput("y", binary_data=False), triton.InferRequestedOutput("z")]
    body, header_length = _triton_request(triton, [tensor, other], outputs, request_id="id-1")
    if datatype == "FP16" and not binary:
        assert "'x': FP16 data cannot be sent as JSON" in _decode_error(body, header_length)
        return
    request = v2.decode_request(body, header_length)
    _assert_same(request.inputs["x"], array)
    assert request.inputs["n"].tolist() == [5, 6]
    assert request.id == "id-1"
    assert [(output.name, output.binary) for output in request.outputs or ()] == [("y", False), ("z", True)]
    if binary and datatype != "BYTES":
        assert np.shares_memory(request.inputs["x"], np.frombuffer(body, np.uint8))


def test_decodes_tritonclient_bf16(triton: ModuleType) -> None:
    """tritonclient's BF16 (ml_dtypes.bfloat16) arrives as its raw uint16 bits, a view on the body."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    array = np.array([[1.0, -2.0, 0.15625]], dtype=ml_dtypes.bfloat16)
    tensor = triton.InferInput("x", [1, 3], "BF16").set_data_from_numpy(array)
    body, header_length = _triton_request(triton, [tensor])
    request = v2.decode_request(body, header_length)
    assert request.datatypes == {"x": "BF16"}
    assert request.inputs["x"].dtype == np.uint16
    assert request.inputs["x"].tolist() == array.view(np.uint16).tolist()
    assert request.inputs["x"].view(ml_dtypes.bfloat16).tolist() == array.tolist()
    assert request.binary_data_output is True  # tritonclient asks for binary outputs when it names none


@pytest.mark.parametrize(
    ("datatype", "binary"),
    [(name, binary) for name in TRITON_DATATYPES for binary in (True, False) if binary or name != "FP16"],
)
def test_tritonclient_reads_our_responses(triton: ModuleType, datatype: str, binary: bool) -> None:
    """InferResult.from_response_body parses our responses (FP16 only binary); as_numpy equals the model's arrays."""
    array = SAMPLES[datatype]
    outputs = [("y", array), ("n", np.array([[1.5, 2.5]], np.float32))]
    response = v2.encode_response("m", "id-2", outputs, binary={"y": binary, "n": not binary})
    result = _triton_result(triton, response)
    got = result.as_numpy("y")
    assert got.shape == array.shape
    if datatype == "BYTES" and not binary:  # JSON strings come back as str, as tritonclient always gives them
        assert got.tolist() == [[item.decode() for item in row] for row in array.tolist()]
    else:
        assert got.dtype == array.dtype
        assert got.tolist() == array.tolist()
    assert result.as_numpy("n").tolist() == [[1.5, 2.5]]
    assert result.get_response()["id"] == "id-2"
    assert result.get_response()["model_name"] == "m"


def test_tritonclient_round_trip_through_respond(triton: ModuleType) -> None:
    """A tritonclient request, decoded, answered with respond, parses in tritonclient (BYTES, BOOL, FP16 ...)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    names = ["BYTES", "BOOL", "FP16", "INT64", "FP32"]
    inputs = [triton.InferInput(n, list(SAMPLES[n].shape), n).set_data_from_numpy(SAMPLES[n]) for n in names]
    body, header_length = _triton_request(triton, inputs)
    request = v2.decode_request(body, header_length)
    prediction = dict(request.inputs) | {"bf16": np.array([1.0, 0.5], dtype=ml_dtypes.bfloat16)}
    result = _triton_result(triton, v2.respond("m", request, prediction))
    for name in names:
        assert result.as_numpy(name).tolist() == SAMPLES[name].tolist()
    assert result.as_numpy("bf16").tolist() == [1.0, 0.5]
    assert result.get_output("bf16")["datatype"] == "BF16"


# -- properties ------------------------------------------------------------------------------------------------------

NUMERIC = [name for name in SAMPLES if name not in ("BYTES", "BF16")]


@st.composite
def _arrays(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    datatype = draw(st.sampled_from([*NUMERIC, "BYTES"]))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    if datatype == "BYTES":
        elements = st.one_of(st.binary(max_size=8), st.text(max_size=4).map(str.encode))
        return datatype, _object_array(
            draw(st.lists(elements, min_size=math.prod(shape), max_size=math.prod(shape))), shape
        )
    dtype = v2.DATATYPES[datatype].dtype
    elements = st.floats(width=8 * dtype.itemsize, allow_nan=False, allow_infinity=False) if dtype.kind == "f" else None
    return datatype, draw(hnp.arrays(dtype, shape, elements=elements))


def _jsonable(array: np.ndarray) -> bool:
    """Whether JSON can carry the array: not FP16, and BYTES only of UTF-8."""
    if array.dtype == object:
        try:
            [item.decode() for item in array.flat]
        except UnicodeDecodeError:
            return False
    return array.dtype != np.float16


@settings(max_examples=150, deadline=None)
@given(tensors=st.lists(_arrays(), max_size=4), binary=st.lists(st.booleans(), min_size=4, max_size=4))
def test_random_tensors_round_trip_both_ways(tensors: list[tuple[str, np.ndarray]], binary: list[bool]) -> None:
    """Random tensors of every datatype round-trip request -> decode and encode -> decode, JSON and binary."""
    named = [
        (f"t{i}", datatype, array, binary[i] or not _jsonable(array)) for i, (datatype, array) in enumerate(tensors)
    ]
    body, header_length = _request(named)
    request = v2.decode_request(body, header_length)
    for name, _, array, _ in named:
        _assert_same(request.inputs[name], array)
    flags = {name: as_binary for name, _, _, as_binary in named}
    response = v2.encode_response("m", None, [(name, array) for name, _, array, _ in named], binary=flags)
    body = _join(response.body)
    header_length = response.header_length or len(body)
    outputs = orjson.loads(body[:header_length])["outputs"]
    as_request = orjson.dumps({"inputs": outputs})  # an output is an input with the same fields
    again = v2.decode_request(as_request + body[header_length:], len(as_request))
    for name, _, array, _ in named:
        _assert_same(again.inputs[name], array)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), max_size=20))
def test_fp32_json_is_exact(values: list[float]) -> None:
    """FP32 written as JSON (shortest float32 digits) reads back bit for bit, by us and by numpy's float parse."""
    array = np.array(values, dtype=np.float32)
    (output,) = orjson.loads(_join(v2.encode_response("m", None, [("y", array)]).body))["outputs"]
    assert np.array(output["data"], dtype=np.float32).tobytes() == array.tobytes()
    request_body, _ = _body([{"name": "y", "shape": [len(values)], "datatype": "FP32", "data": output["data"]}])
    assert v2.decode_request(request_body).inputs["y"].tobytes() == array.tobytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=256), header_length=st.one_of(st.none(), st.integers(-3, 300)))
def test_random_bytes_only_ever_raise_decode_error(body: bytes, header_length: int | None) -> None:
    """Arbitrary bodies and header lengths decode or raise DecodeError, never anything else."""
    with contextlib.suppress(DecodeError):
        v2.decode_request(body, header_length, Limits(max_decompressed_bytes=1 << 16))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=12,
)
_PARAMETERS = st.dictionaries(
    st.sampled_from(["binary_data_size", "binary_data", "binary_data_output", "shared_memory_region", "x"]),
    st.one_of(st.integers(-2, 40), st.booleans(), _JSON),
    max_size=2,
)
_DIMS = st.one_of(st.integers(-1, 4), st.sampled_from([2**31, 2**60, 2**62, 2**63, 2**64 - 1]))
_LOOSE_INPUT = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.sampled_from(["a", "b"]), _JSON),
        "shape": st.one_of(st.lists(_DIMS, max_size=3), _JSON),
        "datatype": st.one_of(st.sampled_from(list(v2.DATATYPES)), _JSON),
        "data": _JSON,
        "parameters": st.one_of(_PARAMETERS, _JSON),
    },
)
_CLOSE_INPUT = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["a", "b", "c"]),
        "shape": st.lists(_DIMS, max_size=3),
        "datatype": st.sampled_from(list(v2.DATATYPES)),
    },
    optional={"data": _JSON, "parameters": st.fixed_dictionaries({"binary_data_size": st.integers(-1, 40)})},
)
_INPUT = st.one_of(_LOOSE_INPUT, _CLOSE_INPUT)
_REQUEST = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=3), _JSON),
        "inputs": st.one_of(st.lists(_INPUT, max_size=3), _JSON),
        "outputs": st.one_of(
            st.lists(st.fixed_dictionaries({"name": _JSON}, optional={"parameters": _PARAMETERS})), _JSON
        ),
        "parameters": st.one_of(_PARAMETERS, _JSON),
    },
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=_REQUEST, tail=st.binary(max_size=48), header=st.sampled_from(["exact", "none", "off"]))
def test_random_requests_only_ever_raise_decode_error(request: dict[str, Any], tail: bytes, header: str) -> None:
    """Structurally plausible but random requests and binary tails decode or raise DecodeError, nothing else."""
    head = orjson.dumps(request)
    header_length = {"exact": len(head), "none": None, "off": max(0, len(head) - 1)}[header]
    try:
        request_ = v2.decode_request(head + tail, header_length, Limits(max_decompressed_bytes=1 << 16))
    except DecodeError:
        return
    for array in request_.inputs.values():
        assert isinstance(array, np.ndarray)
        assert array.dtype != object or all(type(item) is bytes for item in array.flat)


# -- the client's side: encode_request and decode_response ------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(tensors=st.lists(_arrays(), max_size=4), binary=st.lists(st.booleans(), min_size=4, max_size=4))
def test_encode_request_and_decode_response_round_trip(
    tensors: list[tuple[str, np.ndarray]], binary: list[bool]
) -> None:
    """Random tensors sent by encode_request decode as the server decodes them, and the server's response of the
    same tensors decodes with decode_response, JSON and binary."""
    named = [(f"t{i}", array) for i, (_, array) in enumerate(tensors)]
    flags = {name: binary[i] or not _jsonable(array) for i, (name, array) in enumerate(named)}
    request = v2.encode_request(named, binary=flags, request_id="r-1")
    decoded = v2.decode_request(_join(request.body), request.header_length)
    assert decoded.id == "r-1"
    assert decoded.binary_data_output is True
    for name, array in named:
        _assert_same(decoded.inputs[name], array)
    response = v2.encode_response("m", "r-1", named, binary=flags)
    answer = v2.decode_response(_join(response.body), response.header_length)
    assert (answer.model_name, answer.id) == ("m", "r-1")
    for name, array in named:
        _assert_same(answer.outputs[name], array)


def test_encode_request_sends_the_arrays_own_memory_and_asks_for_outputs() -> None:
    """Binary inputs are the arrays' own memory (no copy); outputs and binary_output become the request's
    outputs and binary_data_output; a JSON request has no header length."""
    array = np.arange(6, dtype=np.float64).reshape(2, 3)
    request = v2.encode_request([("x", array)], ["y"], binary_output=False, parameters={"priority": 1})
    assert request.content_type == "application/octet-stream"
    assert np.shares_memory(np.frombuffer(request.body[1], np.float64), array)
    fields = orjson.loads(request.body[0])
    assert fields["outputs"] == [{"name": "y"}]
    assert fields["parameters"] == {"priority": 1, "binary_data_output": False}
    assert request.header_length == len(request.body[0])
    plain = v2.encode_request([("x", array)], binary=False)
    assert (plain.content_type, plain.header_length) == ("application/json", None)
    assert orjson.loads(plain.body[0])["inputs"][0]["data"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_inputs_json_cannot_carry_are_encode_errors_naming_the_input() -> None:
    """An FP16 input or one without a v2 datatype sent as JSON is an EncodeError that names the input."""
    with pytest.raises(EncodeError, match="input 'h' is FP16, which cannot be sent as JSON; send it as binary data"):
        v2.encode_request([("h", np.ones(2, np.float16))], binary=False)
    with pytest.raises(EncodeError, match="input 'c' has dtype complex128"):
        v2.encode_request([("c", np.ones(2, complex))])


def test_binary_outputs_of_a_response_are_views_on_the_body() -> None:
    """decode_response makes binary outputs np.frombuffer views on the body it is given, as decode_request does."""
    response = v2.encode_response("m", None, [("y", np.arange(4, dtype=np.int32))], binary=True)
    body = bytearray(_join(response.body))
    answer = v2.decode_response(body, response.header_length)
    assert np.shares_memory(answer.outputs["y"], np.frombuffer(body, np.uint8))
    assert answer.datatypes == {"y": "INT32"}


@pytest.mark.parametrize(
    ("body", "header_length", "expected"),
    [
        (b'{"outputs": []}', None, "model_name must be a string, not null"),
        (b'{"model_name": "m"}', None, "the inference response has no outputs array"),
        (b'{"model_name": "m", "id": 3, "outputs": []}', None, "the response id must be a string"),
        (b"[1]", None, "the inference response must be a JSON object, not array"),
        (
            b'{"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [2], '
            b'"parameters": {"binary_data_size": 8}}]}',
            None,
            "output 'y': has binary_data_size 8, but there is no Inference-Header-Content-Length header",
        ),
        (
            b'{"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [3], "data": [1, 2]}]}',
            None,
            "output 'y': data has 2 elements, but shape [3] needs 3",
        ),
    ],
)
def test_invalid_responses_are_decode_errors_naming_the_output(
    body: bytes, header_length: int | None, expected: str
) -> None:
    """A malformed response is a DecodeError whose message names the output (not an input) and the problem."""
    with pytest.raises(DecodeError) as info:
        v2.decode_response(body, header_length)
    assert expected in str(info.value)
