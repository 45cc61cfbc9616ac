"""The inference messages of the Open Inference Protocol over gRPC, with the raw tensor contents never copied on
the way in.

``ModelInferRequest.raw_input_contents`` (field 7) holds each input's bytes as Triton's binary tensor data does
(little-endian, row-major; ``BOOL`` one byte; a ``BYTES`` element a 4-byte length and its bytes): the request's
top-level fields are walked here, those of field 7 kept as views on the message's own buffer (what reaches
``predict_fn`` are ``np.frombuffer`` views on them, as over HTTP), and only the other fields (names, shapes,
parameters: small) are given to protobuf's parser. Inputs sent as typed ``contents`` are new arrays. The answer's
``raw_output_contents`` (field 6) are written after the rest of the message from the arrays' own memory; the server
joins them into the one buffer gRPC sends.

Datatypes, limits and messages are those of :mod:`inference_server.codecs.v2` (the same functions decide them).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from inference_server.codecs import v2
from inference_server.codecs._registry import Buffer, Limits
from inference_server.codecs.v2 import _binary, _Budget, _fail, _from_binary, _object_array
from inference_server.errors import DecodeError, EncodeError
from inference_server.grpc._messages import message

#: ``raw_input_contents``'s field number in ModelInferRequest, and ``raw_output_contents``'s in ModelInferResponse.
RAW_INPUTS, RAW_OUTPUTS = 7, 6
_LENGTH_DELIMITED = 2
#: The typed contents field that carries each datatype (InferTensorContents), and the dtype it is read into.
_CONTENTS = {
    "BOOL": ("bool_contents", np.bool_),
    "INT8": ("int_contents", np.int8),
    "INT16": ("int_contents", np.int16),
    "INT32": ("int_contents", np.int32),
    "INT64": ("int64_contents", np.int64),
    "UINT8": ("uint_contents", np.uint8),
    "UINT16": ("uint_contents", np.uint16),
    "UINT32": ("uint_contents", np.uint32),
    "UINT64": ("uint64_contents", np.uint64),
    "FP32": ("fp32_contents", np.float32),
    "FP64": ("fp64_contents", np.float64),
    "BYTES": ("bytes_contents", None),
}


def _varint(data: memoryview, position: int) -> tuple[int, int]:
    """The varint at ``position`` and where it ends."""
    value = shift = 0
    end = len(data)
    while position < end:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
        if shift > 63:
            break
    raise DecodeError("the ModelInferRequest is not a protobuf message: a varint runs past its end or 10 bytes")


def _split(body: Buffer, field: int, limit: int) -> tuple[bytes, list[memoryview]]:
    """The message's top-level fields other than ``field`` (re-joined, for protobuf's parser), and the values of
    ``field`` (length-delimited) as views on ``body``; a :class:`DecodeError` past ``limit`` top-level fields (a
    request of a few tensors has a few dozen: millions of tiny fields would cost seconds and memory here)."""
    data = memoryview(body).cast("B")
    kept: list[memoryview] = []  # runs of neighbouring fields kept
    values: list[memoryview] = []
    position, end, run_start, fields = 0, len(data), 0, 0
    while position < end:
        fields += 1
        if fields > limit:
            raise DecodeError(f"the ModelInferRequest has over {limit} fields")
        start = position
        key = data[position]  # (a one-byte key, the usual: fields 1 to 15)
        if key < 0x80:
            position += 1
        else:
            key, position = _varint(data, position)
        wire = key & 7
        if wire == 0:
            _, position = _varint(data, position)
        elif wire == 1:
            position += 8
        elif wire == 5:
            position += 4
        elif wire == _LENGTH_DELIMITED:
            length = data[position] if position < end else 0x80
            if length < 0x80:
                position += 1
            else:
                length, position = _varint(data, position)
            if key >> 3 == field:
                if position + length > end:
                    break
                if start > run_start:
                    kept.append(data[run_start:start])
                values.append(data[position : position + length])
                position += length
                run_start = position
                continue
            position += length
        else:
            raise DecodeError(f"the ModelInferRequest is not a protobuf message: wire type {wire} at byte {start}")
        if position > end:
            break
    else:
        if end > run_start:
            kept.append(data[run_start:end])
        return b"".join(kept), values
    raise DecodeError("the ModelInferRequest is cut short: a field runs past the end of the message")


def _field_limit(limits: Limits) -> int:
    """The most top-level fields a ModelInferRequest may have: its inputs, requested outputs and raw contents (each
    at most ``max_archive_members``), its parameters, and a few more."""
    return 4 * limits.max_archive_members + 64


def _parameter(value: Any) -> Any:
    """An InferParameter as the Python value it holds (None when none is set)."""
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)


def _parameters(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _parameter(value) for key, value in fields.items()}


class Parsed(NamedTuple):
    """A serialised ModelInferRequest read once: the message without its raw contents (its names, shapes and
    parameters), and the raw contents as views on the message's bytes."""

    request: Any
    raw: list[memoryview]


def parse(body: Buffer, limits: Limits | None = None) -> Parsed:
    """``body`` read as a ModelInferRequest, its tensors not decoded yet (a :class:`DecodeError`, a 400, if it is not
    one): what :func:`decode_request` decodes, and where the front finds the model's name."""
    rest, raw = _split(body, RAW_INPUTS, _field_limit(limits or Limits()))
    return Parsed(_parsed(rest), raw)


def _parsed(rest: bytes) -> Any:
    try:
        return message("ModelInferRequest").FromString(rest)
    except Exception as exc:  # protobuf's DecodeError (its module is the extra's)
        raise DecodeError(f"the ModelInferRequest is not a valid protobuf message: {exc}") from None


def decode_request(
    body: Buffer, limits: Limits | None = None, parsed: Parsed | None = None
) -> tuple[str, v2.InferenceRequest]:
    """The model's name and the inference request of a serialised ``ModelInferRequest`` (``parsed``: what
    :func:`parse` made of it already, if anything): raw contents as views on ``body``, typed contents as new arrays;
    every output is answered in the raw contents."""
    limits = limits or Limits()
    request, raw = parsed if parsed is not None else parse(body, limits)
    if len(request.inputs) > limits.max_archive_members:
        raise DecodeError(
            f"the request has {len(request.inputs)} inputs; at most {limits.max_archive_members} are allowed"
        )
    if raw and len(raw) != len(request.inputs):
        raise DecodeError(
            f"the request has {len(request.inputs)} inputs but {len(raw)} raw_input_contents: give every input's "
            "contents there, in the order of the inputs, or none"
        )
    budget = _Budget(limits, "input")
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    datatypes: dict[str, str] = {}
    input_parameters: dict[str, dict[str, Any]] = {}
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        if not name:
            raise DecodeError(f"inputs[{index}] has no name")
        if name in inputs:
            raise _fail("input", name, "is given twice")
        datatype = v2.DATATYPES.get(tensor.datatype)
        if datatype is None:
            shown = repr(tensor.datatype)[:40]
            raise _fail("input", name, f"unknown datatype {shown}; the datatypes are {', '.join(v2.DATATYPES)}")
        shape = v2._shape(name, list(tensor.shape))
        if raw and tensor.HasField("contents"):
            raise _fail("input", name, "has contents, but the request has raw_input_contents: give one or the other")
        if raw:
            array = _from_binary(name, datatype, shape, raw[index], budget)
        else:
            array = _from_contents(name, datatype.name, shape, tensor, budget)
        inputs[name] = array
        datatypes[name] = datatype.name
        input_parameters[name] = _parameters(tensor.parameters)
    if len(request.outputs) > limits.max_archive_members:
        raise DecodeError(
            f"the request asks for {len(request.outputs)} outputs; at most {limits.max_archive_members} are allowed"
        )
    outputs = tuple(v2.RequestedOutput(output.name, True, _parameters(output.parameters)) for output in request.outputs)
    decoded = v2.InferenceRequest(
        request.id or None,
        _parameters(request.parameters),
        inputs,
        datatypes,
        input_parameters,
        outputs or None,
        binary_data_output=True,
    )
    return request.model_name, decoded


def _from_contents(
    name: str, datatype: str, shape: tuple[int, ...], tensor: Any, budget: _Budget
) -> np.ndarray[Any, Any]:
    """An input sent as typed ``contents``: a new array (of ``object``, holding ``bytes``, for BYTES)."""
    field, dtype = _CONTENTS.get(datatype, (None, None))
    if field is None:
        raise _fail("input", name, f"is {datatype}, which travels only in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise _fail(
            "input", name, f"has {len(values)} values in contents.{field}, but shape {list(shape)} holds {count}"
        )
    if dtype is None:
        budget.take(name, sum(len(value) + v2.BYTES_OVERHEAD for value in values))
        return _object_array([bytes(value) for value in values], shape)
    budget.take(name, count * np.dtype(dtype).itemsize)
    try:
        return np.array(values, dtype=dtype).reshape(shape)
    except OverflowError:
        raise _fail("input", name, f"has a value out of {datatype}'s range in contents.{field}") from None


def encode_response(
    model_name: str, request: v2.InferenceRequest, prediction: Any, datatypes: Mapping[str, str] | None = None
) -> list[Buffer]:
    """The ``ModelInferResponse`` answering ``request`` with the model's ``prediction`` (the outputs requested, else
    every one), as buffers to join: the message without its raw contents, then each output's field 6 from the
    array's own memory."""
    requested = None if request.outputs is None else [output.name for output in request.outputs]
    outputs = v2.named_outputs(prediction, requested)
    response = message("ModelInferResponse")(model_name=model_name, id=request.id or "")
    tail: list[Buffer] = []
    for name, array in outputs:
        datatype = v2.datatype_of(array, name)
        declared = (datatypes or {}).get(name)
        if declared is not None and declared != datatype:
            if not (declared == "BF16" and datatype == "UINT16"):
                raise EncodeError(f"output {name!r} is declared {declared}, but its dtype {array.dtype} is {datatype}")
            datatype = declared
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        data = _binary(name, datatype, array)
        size = memoryview(data).nbytes
        tail += (field_header(RAW_OUTPUTS, size), data)
    return [response.SerializeToString(), *tail]


def field_header(field: int, length: int) -> bytes:
    """The key and length of a length-delimited field."""
    out = bytearray([(field << 3) | _LENGTH_DELIMITED])
    while length >= 0x80:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out)


_FRAME = struct.Struct("<Q")


def framed(buffers: list[Buffer]) -> bytes:
    """One message of a stream of messages: its length, then its bytes (what :func:`unframed` reads)."""
    size = sum(memoryview(buffer).nbytes for buffer in buffers)
    return b"".join([_FRAME.pack(size), *buffers])


def unframed(chunks: Iterable[Buffer]) -> Iterator[bytes]:
    """The messages of a stream :func:`framed` wrote, however its chunks cut it."""
    pending = bytearray()
    for chunk in chunks:
        pending += chunk
        while len(pending) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(pending)
            end = _FRAME.size + size
            if len(pending) < end:
                break
            yield bytes(pending[_FRAME.size : end])
            del pending[:end]
    if pending:
        raise EncodeError(f"a stream of ModelInferResponses ended within a message ({len(pending)} bytes left)")
