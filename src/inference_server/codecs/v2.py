"""The Open Inference Protocol v2 inference body, with Triton's binary tensor data extension: pure functions.

Followed as written in:

- kserve/open-inference-protocol ``specification/protocol/inference_rest.md``: "Inference Request JSON Object"
  (``id``, ``parameters``, ``inputs``, ``outputs``; the ``id`` "must be returned in the response"), "Request Input"
  (``name``, ``shape`` of dims "representable as an unsigned 64-bit integer", ``datatype``, ``parameters``,
  ``data``), "Request Output" (``name``, ``parameters``; no ``outputs``: every output "with default settings"),
  "Inference Response JSON Object" (``model_name``; ``model_version`` left out, as "servers that do not implement
  versioning should not provide this field"; ``id`` "given in the request, if any"), "Response Output",
  "Parameters", "Tensor Data" (a JSON array, row-major, "in their nature multi-dimensional representation, or as a
  flattened one-dimensional representation"; the server "can decide to coerce ... or return an error": we return
  an error, see below) and "Tensor Data Types" (the table of :data:`DATATYPES`, plus Triton's ``BF16``).
- triton-inference-server/server ``docs/protocol/extension_binary_data.md``: binary tensor data is little-endian,
  row-major, without stride or padding; ``BOOL`` is one byte, 1 or 0; a ``BYTES`` element is a 4-byte unsigned
  little-endian length then the bytes; ``parameters.binary_data_size`` on a request input or response output gives
  its size; ``parameters.binary_data`` (bool) on a requested output overrides the request's
  ``parameters.binary_data_output`` (bool); the binary data follows the JSON object "in the same order as the order
  of the input or output tensors are specified in the JSON"; ``Inference-Header-Content-Length`` gives the JSON
  object's length whenever binary data is present. The responses' ``Content-Type`` is ``application/octet-stream``
  with binary data and ``application/json`` without, as Triton's ``http_server.cc`` sets it.
- triton-inference-server/server ``src/http_server.cc`` for what the extension leaves unsaid: FP16 and BF16 travel
  only as binary data (``ReadDataFromJson``/``WriteDataToJson`` refuse them); an input sets exactly one of ``data``
  and ``binary_data_size`` (``ValidateInputContentType``); the request ``id`` is a string.
- ``tritonclient.http`` (``_utils._get_inference_request``, ``InferInput``, ``InferRequestedOutput``,
  ``InferResult``): what the real client sends and how it reads our answers (the tests run it).

Representations (what ``predict_fn`` receives and may return):

- Numeric and ``BOOL`` tensors sent as binary data are ``np.frombuffer`` views on the body: no copy, read-only when
  the body is ``bytes``, and possibly unaligned (the JSON header has any length). ``BOOL`` bytes other than 0 and 1
  are refused, so the ``bool`` view holds only real booleans. Tensors sent as JSON are new, writable arrays.
- ``BYTES`` tensors are ``object`` arrays of Python ``bytes`` (JSON strings are encoded as UTF-8, so a model sees
  ``bytes`` whatever the transport), as ``tritonclient`` and Triton's Python backend use. Such an array holds only
  ``bytes`` objects we made, so nothing is unpickled or evaluated. A fixed-width ``S<n>`` array was rejected: numpy
  drops trailing NUL bytes from its elements (corrupting binary payloads), and its width is that of the longest
  element, so one long element among many short ones would inflate memory without bound. The copy is unavoidable,
  and bounded: each element counts :data:`BYTES_OVERHEAD` bytes plus its length against
  :attr:`Limits.max_decompressed_bytes`. Outputs may be ``object`` arrays of ``bytes``/``str``, or ``S``/``U``
  arrays (``str`` is sent as UTF-8).
- ``BF16`` has no numpy dtype (``ml_dtypes`` is not a dependency): a BF16 input is a zero-copy ``uint16`` view of
  its raw bits (``torch.from_numpy(a).view(torch.bfloat16)``, or ``a.view(ml_dtypes.bfloat16)``, reads it; its
  :attr:`InferenceRequest.datatypes` entry says ``BF16``). An output is sent as BF16 when its dtype is named
  ``bfloat16`` (``ml_dtypes``), or when ``datatypes`` declares a ``uint16`` output ``BF16``.
- ``FP16`` is ``float16``; FP16 and BF16 are refused as JSON both ways (400 on input, 406 on output).

Strictness: JSON ``data`` must be of the datatype's JSON type, with no coercion: integers (within the type's range)
for the integer types, numbers for FP32/FP64 (finite in FP32's range), booleans for BOOL, strings for BYTES; nested
exactly as ``shape`` or flat. JSON cannot carry NaN or infinities, nor bytes that are not UTF-8: such an output
requested as JSON is a 406 that says to request it with ``binary_data``. Raw binary requests
(``Inference-Header-Content-Length: 0``, which need the model's tensor metadata) and the shared memory and
classification extensions are refused with a 400 saying so.

Limits: at most :attr:`Limits.max_archive_members` input tensors (and requested outputs), and at most
:attr:`Limits.max_decompressed_bytes` bytes of arrays built from JSON data and of ``BYTES`` elements (views on the
body cost nothing: the body is bounded by ``MaxPayloadInMB``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import orjson

from inference_server.codecs._registry import Buffer, Limits
from inference_server.errors import DecodeError, EncodeError, NotAcceptable

__all__ = [
    "BYTES_OVERHEAD",
    "DATATYPES",
    "HEADER_LENGTH",
    "Datatype",
    "EncodedBody",
    "EncodedResponse",
    "InferenceRequest",
    "InferenceResponse",
    "Request",
    "RequestedOutput",
    "datatype_of",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "named_outputs",
    "parse_header_length",
    "respond",
]

#: The HTTP header that gives the JSON object's length when binary tensor data follows it.
HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
#: What one ``BYTES`` element costs beyond its length, as counted against the limits: a ``bytes`` object's header
#: (33 bytes in CPython) and the array's pointer to it, rounded up.
BYTES_OVERHEAD = 48
#: The most dimensions a tensor may have (numpy 1.x's limit; numpy 2's is 64).
MAX_DIMS = 32
_MAX_SIZE = (1 << 63) - 1  # numpy's sizes are signed 64-bit
_LENGTH = struct.Struct("<I")


@dataclasses.dataclass(frozen=True)
class Datatype:
    """A v2 tensor datatype: its name, the numpy dtype of the arrays we make for it, and its element size."""

    name: str
    #: The dtype of decoded arrays: little-endian; ``uint16`` raw bits for BF16, ``object`` (of bytes) for BYTES.
    dtype: np.dtype[Any]
    #: Bytes per element in binary data; 0 for BYTES (variable: a 4-byte length, then the bytes).
    size: int
    #: Whether the datatype may travel as JSON ``data`` (FP16 and BF16 may not).
    json: bool = True
    #: The JSON types its ``data`` elements must have.
    kinds: frozenset[type] = frozenset()


_INTEGER = frozenset({int})
_NUMBER = frozenset({int, float})

#: The one table of datatypes, by v2 name (``inference_rest.md`` "Tensor Data Types", plus Triton's BF16).
DATATYPES: Mapping[str, Datatype] = {
    datatype.name: datatype
    for datatype in (
        Datatype("BOOL", np.dtype(np.bool_), 1, kinds=frozenset({bool})),
        Datatype("UINT8", np.dtype("<u1"), 1, kinds=_INTEGER),
        Datatype("UINT16", np.dtype("<u2"), 2, kinds=_INTEGER),
        Datatype("UINT32", np.dtype("<u4"), 4, kinds=_INTEGER),
        Datatype("UINT64", np.dtype("<u8"), 8, kinds=_INTEGER),
        Datatype("INT8", np.dtype("<i1"), 1, kinds=_INTEGER),
        Datatype("INT16", np.dtype("<i2"), 2, kinds=_INTEGER),
        Datatype("INT32", np.dtype("<i4"), 4, kinds=_INTEGER),
        Datatype("INT64", np.dtype("<i8"), 8, kinds=_INTEGER),
        Datatype("FP16", np.dtype("<f2"), 2, json=False),
        Datatype("FP32", np.dtype("<f4"), 4, kinds=_NUMBER),
        Datatype("FP64", np.dtype("<f8"), 8, kinds=_NUMBER),
        Datatype("BF16", np.dtype("<u2"), 2, json=False),
        Datatype("BYTES", np.dtype(object), 0, kinds=frozenset({str})),
    )
}
#: The datatype of an array, by (dtype kind, item size): BF16 and BYTES are told apart otherwise.
_BY_KIND = {
    (datatype.dtype.kind, datatype.size): datatype
    for datatype in DATATYPES.values()
    if datatype.name not in ("BF16", "BYTES")
}
_EXPECTED = {frozenset({bool}): "true or false", _INTEGER: "integers", _NUMBER: "numbers", frozenset({str}): "strings"}
_JSON_NAMES = {bool: "boolean", int: "integer", float: "non-integer number", str: "string", list: "array"}
_JSON_NAMES.update({dict: "object", type(None): "null"})


def _json_name(kind: type) -> str:
    return _JSON_NAMES.get(kind, kind.__name__)


# -- requests --------------------------------------------------------------------------------------------------------
class RequestedOutput(NamedTuple):
    """An entry of the request's ``outputs``: its name, whether to send it as binary data, and its parameters."""

    name: str
    binary: bool
    parameters: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class InferenceRequest:
    """A decoded inference request: everything :func:`respond` needs to answer it."""

    #: The request's ``id``, echoed in the response; ``None`` when absent.
    id: str | None
    #: The request's ``parameters`` (``binary_data_output`` included), as sent.
    parameters: dict[str, Any]
    #: The input tensors by name, in the request's order (binary ones are views on the body).
    inputs: dict[str, np.ndarray[Any, Any]]
    #: Each input's v2 datatype (``BF16`` inputs are ``uint16`` arrays: this says what they hold).
    datatypes: dict[str, str]
    #: Each input's ``parameters``, as sent (``binary_data_size`` included).
    input_parameters: dict[str, dict[str, Any]]
    #: The requested outputs in the request's order, or ``None`` for every output the model produces.
    outputs: tuple[RequestedOutput, ...] | None
    #: The request's ``binary_data_output``: the default for outputs with no ``binary_data`` of their own.
    binary_data_output: bool = False

    def binary(self, name: str) -> bool:
        """Whether output ``name`` is to be sent as binary data (its ``binary_data``, else ``binary_data_output``)."""
        return self.binary_flags().get(name, self.binary_data_output)

    def binary_flags(self) -> dict[str, bool]:
        """The requested outputs' resolved binary flags, by name (empty when every output is sent)."""
        return {output.name: output.binary for output in self.outputs or ()}


#: The name the brief and the routes use for :class:`InferenceRequest`.
Request = InferenceRequest

_DIGITS = re.compile(r"[0-9]{1,19}")


def parse_header_length(value: str | None) -> int | None:
    """The value of an ``Inference-Header-Content-Length`` header as an int (``None`` when absent)."""
    if value is None:
        return None
    if not _DIGITS.fullmatch(value.strip()):
        raise DecodeError(f"{HEADER_LENGTH} must be a non-negative integer, not {value[:40]!r}")
    return int(value)


def _entry_name(where: str, index: int, entry: Any) -> str:
    """The name of ``where[index]``, a JSON object with a string ``name``, else a :class:`DecodeError`."""
    if not isinstance(entry, dict):
        raise DecodeError(f"{where}[{index}] must be a JSON object, not {_json_name(type(entry))}")
    name = entry.get("name")
    if not isinstance(name, str):
        problem = "has no name" if name is None else f"has a {_json_name(type(name))} name; names are strings"
        raise DecodeError(f"{where}[{index}] {problem}")
    return name


def _fail(kind: str, name: str, problem: str) -> DecodeError:
    return DecodeError(f"{kind} {name!r}: {problem}")


def _parameters(owner: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    parameters = fields.get("parameters", {})
    if not isinstance(parameters, dict):
        raise DecodeError(f"{owner}: parameters must be a JSON object, not {_json_name(type(parameters))}")
    return parameters


def _flag(owner: str, parameters: Mapping[str, Any], key: str, default: bool) -> bool:
    value = parameters.get(key, default)
    if type(value) is not bool:
        raise DecodeError(f"{owner}: parameters.{key} must be true or false, not {_json_name(type(value))}")
    return value


def _shape(name: str, shape: Any, kind: str = "input") -> tuple[int, ...]:
    if not isinstance(shape, list):
        raise _fail(kind, name, f"shape must be a JSON array of integers, not {_json_name(type(shape))}")
    if len(shape) > MAX_DIMS:
        raise _fail(kind, name, f"shape has {len(shape)} dimensions; at most {MAX_DIMS} are allowed")
    for index, dim in enumerate(shape):
        if type(dim) is not int:
            raise _fail(kind, name, f"shape has a {_json_name(type(dim))} dimension (#{index}); dims are integers")
        if dim < 0:
            raise _fail(kind, name, f"shape {shape} has a negative dimension")
    if math.prod(dim for dim in shape if dim) * 8 > _MAX_SIZE:  # numpy's bound on any array of 8-byte items
        raise _fail(kind, name, f"shape {shape} is too large")
    return tuple(shape)


class _Budget:
    """Bytes left under ``max_decompressed_bytes`` for arrays built (not viewed) from the body, and what the tensors
    decoded are called in messages (``input`` in a request, ``output`` in a response)."""

    def __init__(self, limits: Limits, kind: str) -> None:
        self.limit = limits.max_decompressed_bytes
        self.used = 0
        self.kind = kind

    def take(self, name: str, nbytes: int) -> None:
        self.used += nbytes
        if self.used > self.limit:
            raise _fail(self.kind, name, f"decoding it would take over {self.limit} bytes (the limit)")


def _json_header(body: Buffer, header_length: int | None, what: str) -> tuple[memoryview, int, dict[str, Any]]:
    """The body as bytes, where its JSON object ends, and the object itself."""
    view = memoryview(body)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if header_length is None:
        header_end = view.nbytes
    elif header_length < 0 or header_length > view.nbytes:
        raise DecodeError(f"{HEADER_LENGTH} is {header_length}, but the body has only {view.nbytes} bytes")
    elif header_length == 0:
        raise DecodeError(
            f"raw binary {what}s ({HEADER_LENGTH}: 0) are not supported: send the JSON inference {what} first"
        )
    else:
        header_end = header_length
    try:
        fields = orjson.loads(view[:header_end])
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"the inference {what} is not valid JSON: {exc}{_hint(view, header_length, exc)}") from None
    if not isinstance(fields, dict):
        raise DecodeError(f"the inference {what} must be a JSON object, not {_json_name(type(fields))}")
    return view, header_end, fields


def decode_request(body: Buffer, header_length: int | None = None, limits: Limits | None = None) -> InferenceRequest:
    """Decode an inference request body: the JSON object, then (when ``header_length`` is given: the value of
    ``Inference-Header-Content-Length``) binary tensor data. Anything invalid raises :class:`DecodeError` (400)
    naming the tensor and the problem."""
    limits = limits or Limits()
    view, header_end, fields = _json_header(body, header_length, "request")
    request_id = fields.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise DecodeError(f"the request id must be a string, not {_json_name(type(request_id))}")
    parameters = _parameters("the request", fields)
    binary_data_output = _flag("the request", parameters, "binary_data_output", False)
    outputs = _requested_outputs(fields.get("outputs"), binary_data_output, limits)
    inputs, datatypes, input_parameters = _tensors(view, header_end, header_length, fields, "input", limits)
    return InferenceRequest(request_id, parameters, inputs, datatypes, input_parameters, outputs, binary_data_output)


def _tensors(
    view: memoryview, header_end: int, header_length: int | None, fields: dict[str, Any], kind: str, limits: Limits
) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, str], dict[str, dict[str, Any]]]:
    """The tensors of ``fields[kind + "s"]`` (``inputs`` or ``outputs``), their datatypes and parameters; the binary
    data after the JSON object must be theirs exactly."""
    key, what = f"{kind}s", ("request" if kind == "input" else "response")
    entries = fields.get(key)
    if not isinstance(entries, list):
        raise DecodeError(
            f"the inference {what} has no {key} array"
            if entries is None
            else f"{key} must be a JSON array, not {_json_name(type(entries))}"
        )
    if len(entries) > limits.max_archive_members:
        raise DecodeError(f"the {what} has {len(entries)} {key}; at most {limits.max_archive_members} are allowed")
    budget = _Budget(limits, kind)
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    datatypes: dict[str, str] = {}
    all_parameters: dict[str, dict[str, Any]] = {}
    offset, last_binary = header_end, None
    for index, entry in enumerate(entries):
        name = _entry_name(key, index, entry)
        if name in arrays:
            raise _fail(kind, name, "is given twice")
        for field in ("shape", "datatype"):
            if field not in entry:
                raise _fail(kind, name, f"has no {field}")
        datatype_name = entry["datatype"]
        datatype = DATATYPES.get(datatype_name) if isinstance(datatype_name, str) else None
        if datatype is None:
            shown = repr(datatype_name)[:40]
            raise _fail(kind, name, f"unknown datatype {shown}; the datatypes are {', '.join(DATATYPES)}")
        shape = _shape(name, entry["shape"], kind)
        own = _parameters(f"{kind} {name!r}", entry)
        if "shared_memory_region" in own:
            raise _fail(kind, name, "the shared memory extension is not supported: send data or binary data")
        if "binary_data_size" in own:
            if "data" in entry:
                raise _fail(kind, name, "has both data and parameters.binary_data_size; give one")
            size = own["binary_data_size"]
            if type(size) is not int or size < 0:
                shown = orjson.dumps(size).decode()[:40]
                raise _fail(kind, name, f"binary_data_size must be a non-negative integer, not {shown}")
            end = offset + size
            if end > view.nbytes:
                if header_length is None:
                    raise _fail(kind, name, f"has binary_data_size {size}, but there is no {HEADER_LENGTH} header")
                raise _fail(
                    kind,
                    name,
                    f"its binary_data_size {size} runs past the body: {view.nbytes - offset} bytes of binary data "
                    "are left for it",
                )
            array = _from_binary(name, datatype, shape, view[offset:end], budget)
            offset, last_binary = end, name
        elif "data" in entry:
            array = _from_json(name, datatype, shape, entry["data"], budget)
        else:
            raise _fail(kind, name, "has neither data nor parameters.binary_data_size")
        arrays[name] = array
        datatypes[name] = datatype.name
        all_parameters[name] = own
    if offset != view.nbytes:
        left = view.nbytes - offset
        if last_binary is None:
            raise DecodeError(f"{left} bytes follow the JSON object, but no {kind} has binary_data_size")
        raise _fail(kind, last_binary, f"is the last binary {kind}, but {left} more bytes follow its data")
    return arrays, datatypes, all_parameters


def _hint(view: memoryview, header_length: int | None, exc: orjson.JSONDecodeError) -> str:
    """Why a body with binary data but no header length fails to parse, when that is why."""
    if header_length is not None or not 0 < exc.pos < view.nbytes:
        return ""
    try:
        orjson.loads(view[: exc.pos])
    except orjson.JSONDecodeError:
        return ""
    return f" (binary tensor data after the JSON object needs an {HEADER_LENGTH} header giving the JSON's length)"


def _requested_outputs(
    outputs_json: Any, binary_data_output: bool, limits: Limits
) -> tuple[RequestedOutput, ...] | None:
    if outputs_json is None:
        return None
    if not isinstance(outputs_json, list):
        raise DecodeError(f"outputs must be a JSON array, not {_json_name(type(outputs_json))}")
    if len(outputs_json) > limits.max_archive_members:
        raise DecodeError(
            f"the request asks for {len(outputs_json)} outputs; at most {limits.max_archive_members} are allowed"
        )
    requested: dict[str, RequestedOutput] = {}
    for index, entry in enumerate(outputs_json):
        name = _entry_name("outputs", index, entry)
        if name in requested:
            raise _fail("output", name, "is requested twice")
        own = _parameters(f"output {name!r}", entry)
        if "shared_memory_region" in own:
            raise _fail("output", name, "the shared memory extension is not supported")
        if "classification" in own:
            raise _fail("output", name, "the classification extension is not supported")
        binary = _flag(f"output {name!r}", own, "binary_data", binary_data_output)
        requested[name] = RequestedOutput(name, binary, own)
    return tuple(requested.values()) or None  # none requested: every output, as the spec says when absent


def _from_binary(
    name: str, datatype: Datatype, shape: tuple[int, ...], data: memoryview, budget: _Budget
) -> np.ndarray[Any, Any]:
    count = math.prod(shape)
    if datatype.name == "BYTES":
        return _bytes_from_binary(name, shape, count, data, budget)
    expected = count * datatype.size
    if data.nbytes != expected:
        raise _fail(
            budget.kind,
            name,
            f"binary_data_size is {data.nbytes}, but shape {list(shape)} of {datatype.name} needs {expected} bytes",
        )
    if count == 0:
        return np.empty(shape, datatype.dtype)
    if datatype.name == "BOOL":
        raw = np.frombuffer(data, np.uint8)
        if (raw > 1).any():
            raise _fail(budget.kind, name, "BOOL binary data holds a byte other than 0 and 1")
    return np.frombuffer(data, datatype.dtype).reshape(shape)


def _bytes_from_binary(
    name: str, shape: tuple[int, ...], count: int, data: memoryview, budget: _Budget
) -> np.ndarray[Any, Any]:
    size = data.nbytes
    if count > size // 4:
        raise _fail(
            budget.kind,
            name,
            f"shape {list(shape)} needs {count} BYTES elements, but {size} bytes hold at most {size // 4}",
        )
    budget.take(name, count * BYTES_OVERHEAD + size)
    raw = bytes(data)
    elements: list[bytes] = []
    offset = 0
    for index in range(count):
        if offset + 4 > size:
            raise _fail(
                budget.kind,
                name,
                f"its {size} bytes of BYTES data end after {index} elements; shape {list(shape)} needs {count}",
            )
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > size:
            raise _fail(
                budget.kind,
                name,
                f"BYTES element {index} has length {length}, which runs past the tensor's {size} bytes",
            )
        elements.append(raw[offset : offset + length])
        offset += length
    if offset != size:
        raise _fail(
            budget.kind,
            name,
            f"its {size} bytes of BYTES data hold more than the {count} elements of shape {list(shape)} "
            f"({size - offset} bytes left over)",
        )
    return _object_array(elements, shape)


def _object_array(elements: list[Any], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    array: np.ndarray[Any, Any] = np.empty(len(elements), dtype=object)
    array[:] = elements  # element by element: never a nested conversion of the items themselves
    return array.reshape(shape)


def _leaves(name: str, shape: tuple[int, ...], count: int, data: Any, kind: str = "input") -> list[Any]:
    """The elements of JSON ``data`` given flat or nested exactly as ``shape``, in row-major order."""
    if not isinstance(data, list):
        raise _fail(kind, name, f"data must be a JSON array, not {_json_name(type(data))}")
    if len(data) == count and (len(shape) < 2 or not data or type(data[0]) is not list):
        return data  # flat (and nested too, for one dimension)
    if len(shape) < 2:
        raise _fail(kind, name, f"data has {len(data)} elements, but shape {list(shape)} needs {count}")
    rows: list[Any] = [data]
    for depth, dim in enumerate(shape):
        for row in rows:
            if type(row) is not list or len(row) != dim:
                found = f"a list of {len(row)}" if type(row) is list else f"a {_json_name(type(row))}"
                raise _fail(
                    kind,
                    name,
                    f"data is neither flat with {count} elements nor nested as shape {list(shape)}: "
                    f"found {found} at depth {depth} where a list of {dim} belongs",
                )
        if depth < len(shape) - 1:
            rows = list(itertools.chain.from_iterable(rows))
    return list(itertools.chain.from_iterable(rows))


def _from_json(
    name: str, datatype: Datatype, shape: tuple[int, ...], data: Any, budget: _Budget
) -> np.ndarray[Any, Any]:
    if not datatype.json:
        raise _fail(
            budget.kind,
            name,
            f"{datatype.name} data cannot be sent as JSON; send it as binary data (parameters.binary_data_size)",
        )
    count = math.prod(shape)
    leaves = _leaves(name, shape, count, data, budget.kind)  # as many as the body held: the budget is for what we build
    budget.take(name, count * (BYTES_OVERHEAD if datatype.name == "BYTES" else datatype.size))
    kinds = set(map(type, leaves))
    if list in kinds:
        raise _fail(budget.kind, name, f"data nests deeper than shape {list(shape)}")
    wrong = kinds - datatype.kinds
    if wrong:
        bad = next(leaf for leaf in leaves if type(leaf) in wrong)
        found = _json_name(type(bad))
        if isinstance(bad, (bool, int, float)):  # numbers help; strings may be someone's data: not echoed
            found += f" ({orjson.dumps(bad).decode()})"
        article = "an" if found[0] in "aeiou" else "a"
        raise _fail(
            budget.kind, name, f"{datatype.name} data must be {_EXPECTED[datatype.kinds]}, but holds {article} {found}"
        )
    if datatype.name == "BYTES":
        try:
            encoded = [leaf.encode("utf-8") for leaf in leaves]
        except UnicodeEncodeError:  # orjson refuses lone surrogates already; kept for any other JSON parser
            raise _fail(budget.kind, name, "BYTES data holds a string that is not valid Unicode") from None
        budget.take(name, sum(map(len, encoded)))
        return _object_array(encoded, shape)
    if datatype.name != "BOOL" and datatype.dtype.kind in "iu" and leaves:
        info = np.iinfo(datatype.dtype)
        low, high = min(leaves), max(leaves)
        if low < info.min or high > info.max:
            value = low if low < info.min else high
            raise _fail(budget.kind, name, f"{datatype.name} data holds {value}, outside [{info.min}, {info.max}]")
    if datatype.dtype.kind == "f":
        try:
            wide = np.array(leaves, dtype=np.float64)
        except OverflowError:
            raise _fail(budget.kind, name, f"{datatype.name} data holds an integer too large for a float") from None
        with np.errstate(over="ignore", under="ignore"):
            array = wide.astype(datatype.dtype)
        if not np.isfinite(array).all():
            raise _fail(budget.kind, name, f"{datatype.name} data holds a number outside the range of {datatype.name}")
        return array.reshape(shape)
    return np.array(leaves, dtype=datatype.dtype).reshape(shape)


# -- responses -------------------------------------------------------------------------------------------------------
class EncodedBody(NamedTuple):
    """An inference request or response: the body (the concatenation of ``body``), its ``Content-Type``, and the value
    of ``Inference-Header-Content-Length`` (``None``: no binary data, leave the header out)."""

    body: list[Buffer]
    content_type: str
    header_length: int | None


#: What :func:`encode_response` returns.
EncodedResponse = EncodedBody


def datatype_of(array: np.ndarray[Any, Any], output: str = "output", kind: str = "output") -> str:
    """The v2 datatype of an array; :class:`EncodeError` (500) if it has none. ``kind`` and ``output`` name the
    tensor in messages."""
    dtype = array.dtype
    if dtype.kind in "SU":
        return "BYTES"
    if dtype.kind == "O":
        for item in array.flat:
            if not isinstance(item, (bytes, bytearray, str)):
                raise EncodeError(
                    f"{kind} {output!r} is an object array holding {type(item).__name__}; only bytes and str "
                    "can be sent (as BYTES)"
                )
        return "BYTES"
    datatype = _BY_KIND.get((dtype.kind, dtype.itemsize))
    if datatype is not None:
        return datatype.name
    if dtype.name == "bfloat16" and dtype.itemsize == 2:  # (ml_dtypes' kind is "V": no numpy kind of its own)
        return "BF16"
    raise EncodeError(f"{kind} {output!r} has dtype {dtype}, which has no v2 datatype")


def named_outputs(prediction: Any, requested: Sequence[str] | None = None) -> list[tuple[str, np.ndarray[Any, Any]]]:
    """A prediction as named output tensors, keeping those ``requested`` (in their order; ``None``: all).

    A dict gives its keys (strings) as names; a tuple, or a list of ndarrays, gives ``output_0``, ``output_1``, ...;
    anything else (an ndarray, a scalar, a list of numbers) is one tensor, ``output_0``. Values become arrays with
    ``np.asarray``. A requested name the prediction lacks is a :class:`DecodeError` (400) naming it.
    """
    if isinstance(prediction, Mapping):
        items = list(prediction.items())
        for key, _ in items:
            if not isinstance(key, str):
                raise EncodeError(f"the prediction is a dict with a {type(key).__name__} key; output names are str")
    elif isinstance(prediction, tuple) or (
        isinstance(prediction, list) and prediction and all(isinstance(item, np.ndarray) for item in prediction)
    ):
        items = [(f"output_{index}", item) for index, item in enumerate(prediction)]
    else:
        items = [("output_0", prediction)]
    named = dict(items)
    if requested is not None:
        missing = [name for name in requested if name not in named]
        if missing:
            available = ", ".join(repr(name) for name in named) or "none"
            raise DecodeError(f"requested output {missing[0]!r} is not among the model's outputs: {available}")
        items = [(name, named[name]) for name in requested]
    outputs = []
    for name, value in items:
        try:
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise EncodeError(f"output {name!r} cannot be made an array: {exc}") from None
        outputs.append((name, array))
    return outputs


def _little(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    byteorder = array.dtype.byteorder
    if byteorder == ">" or (byteorder == "=" and sys.byteorder == "big"):
        return array.astype(array.dtype.newbyteorder("<"))
    return array


def _binary(name: str, datatype: str, array: np.ndarray[Any, Any], kind: str = "output") -> Buffer:
    """The tensor's binary data: the array's own memory when it is C-contiguous and little-endian."""
    if datatype == "BYTES":
        parts: list[bytes] = []
        for item in array.reshape(-1).tolist():
            data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
            if len(data) > 0xFFFFFFFF:
                raise EncodeError(f"{kind} {name!r} has a BYTES element over 4 GiB, more than its length can say")
            parts += (_LENGTH.pack(len(data)), data)
        return b"".join(parts)
    contiguous = np.ascontiguousarray(_little(array))
    return contiguous.reshape(-1).view(np.uint8).data


def _json_data(name: str, datatype: str, array: np.ndarray[Any, Any], kind: str = "output") -> Any:
    """The tensor's ``data``: flat, row-major; an array for orjson to write (no Python objects) but for BYTES. What
    JSON cannot carry is :class:`NotAcceptable` (406) for an output, :class:`EncodeError` for an input."""
    fix = "request it with parameters.binary_data" if kind == "output" else "send it as binary data"
    refuse = NotAcceptable if kind == "output" else EncodeError
    if datatype in ("FP16", "BF16"):
        raise refuse(f"{kind} {name!r} is {datatype}, which cannot be sent as JSON; {fix}")
    flat = array.reshape(-1)
    if datatype == "BYTES":
        try:
            return [item.decode("utf-8") if not isinstance(item, str) else item for item in flat.tolist()]
        except UnicodeDecodeError:
            raise refuse(f"{kind} {name!r} holds bytes that are not UTF-8, which JSON cannot carry; {fix}") from None
    if datatype in ("FP32", "FP64") and not np.isfinite(flat).all():
        raise refuse(f"{kind} {name!r} holds NaN or infinity, which JSON cannot carry; {fix}")
    native = flat.astype(flat.dtype.newbyteorder("=")) if not flat.dtype.isnative else flat
    return np.ascontiguousarray(native)


def _encode_tensors(
    kind: str,
    tensors: Sequence[tuple[str, np.ndarray[Any, Any]]],
    binary: bool | Mapping[str, bool],
    datatypes: Mapping[str, str] | None,
) -> tuple[list[dict[str, Any]], list[Buffer], bool]:
    """The JSON entries of named arrays, the binary data that follows the JSON object, and whether any is binary."""
    entries: list[dict[str, Any]] = []
    tail: list[Buffer] = []
    any_binary = False
    for name, array in tensors:
        datatype = datatype_of(array, name, kind)
        declared = (datatypes or {}).get(name)
        if declared is not None and declared != datatype:
            if not (declared == "BF16" and datatype == "UINT16"):
                raise EncodeError(f"{kind} {name!r} is declared {declared}, but its dtype {array.dtype} is {datatype}")
            datatype = declared
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        as_binary = binary if isinstance(binary, bool) else binary.get(name, False)
        if as_binary:
            any_binary = True
            data = _binary(name, datatype, array, kind)
            size = memoryview(data).nbytes
            entry["parameters"] = {"binary_data_size": size}
            if size:
                tail.append(data)
        else:
            entry["data"] = _json_data(name, datatype, array, kind)
        entries.append(entry)
    return entries, tail, any_binary


def _encoded(fields: dict[str, Any], tail: list[Buffer], any_binary: bool) -> EncodedBody:
    header = orjson.dumps(fields, option=orjson.OPT_SERIALIZE_NUMPY)
    if not any_binary:
        return EncodedBody([header], JSON_TYPE, None)
    return EncodedBody([header, *tail], BINARY_TYPE, len(header))


def encode_response(
    model_name: str,
    request_id: str | None,
    outputs: Sequence[tuple[str, np.ndarray[Any, Any]]],
    binary: bool | Mapping[str, bool] = False,
    datatypes: Mapping[str, str] | None = None,
) -> EncodedBody:
    """The inference response for ``outputs`` (named arrays, in order): JSON ``data`` for some, binary data for those
    ``binary`` says (a flag for all, or per name: absent names are JSON). ``datatypes`` may declare a ``uint16``
    output ``BF16`` (its raw bits). An output JSON cannot carry is :class:`NotAcceptable` (406); one with no v2
    datatype is :class:`EncodeError` (500)."""
    response: dict[str, Any] = {"model_name": model_name}
    if request_id is not None:
        response["id"] = request_id
    entries, tail, any_binary = _encode_tensors("output", outputs, binary, datatypes)
    response["outputs"] = entries
    return _encoded(response, tail, any_binary)


def respond(
    model_name: str,
    request: InferenceRequest,
    prediction: Any,
    datatypes: Mapping[str, str] | None = None,
) -> EncodedResponse:
    """The response to ``request`` for the model's ``prediction``: :func:`named_outputs` keeping the requested
    outputs, each as binary data or JSON as the request asks, then :func:`encode_response`."""
    requested = None if request.outputs is None else [output.name for output in request.outputs]
    outputs = named_outputs(prediction, requested)
    flags = request.binary_flags()
    binary = {name: flags.get(name, request.binary_data_output) for name, _ in outputs}
    return encode_response(model_name, request.id, outputs, binary, datatypes)


# -- the client's side: requests made, responses read ----------------------------------------------------------------
def encode_request(
    inputs: Sequence[tuple[str, np.ndarray[Any, Any]]],
    outputs: Sequence[str] | None = None,
    *,
    binary: bool | Mapping[str, bool] = True,
    binary_output: bool = True,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    datatypes: Mapping[str, str] | None = None,
) -> EncodedBody:
    """An inference request for ``inputs`` (named arrays, in order), each as binary data or JSON as ``binary`` says
    (a flag for all, or per name: absent names are JSON), asking for ``outputs`` (``None``: every output) as binary
    data (``binary_output``, the request's ``binary_data_output``) or JSON. Binary data is the arrays' own memory when
    C-contiguous and little-endian. An input that cannot be sent (no v2 datatype; FP16 as JSON) is
    :class:`EncodeError`."""
    request: dict[str, Any] = {}
    if request_id is not None:
        request["id"] = request_id
    request["parameters"] = {**(parameters or {}), "binary_data_output": binary_output}
    entries, tail, any_binary = _encode_tensors("input", inputs, binary, datatypes)
    request["inputs"] = entries
    if outputs is not None:
        request["outputs"] = [{"name": name} for name in outputs]
    return _encoded(request, tail, any_binary)


@dataclasses.dataclass(frozen=True)
class InferenceResponse:
    """A decoded inference response."""

    #: The response's ``model_name``.
    model_name: str
    #: The request's ``id`` as echoed, or ``None``.
    id: str | None
    #: The output tensors by name, in the response's order (binary ones are views on the body).
    outputs: dict[str, np.ndarray[Any, Any]]
    #: Each output's v2 datatype (``BF16`` outputs are ``uint16`` arrays of their raw bits).
    datatypes: dict[str, str]
    #: The response's ``parameters``, as sent.
    parameters: dict[str, Any]


def decode_response(body: Buffer, header_length: int | None = None, limits: Limits | None = None) -> InferenceResponse:
    """Decode an inference response body as :func:`decode_request` decodes a request: the same representations
    (binary tensors as views on ``body``, BYTES as object arrays of ``bytes``) and checks; anything invalid raises
    :class:`DecodeError` naming the output and the problem."""
    limits = limits or Limits()
    view, header_end, fields = _json_header(body, header_length, "response")
    model_name = fields.get("model_name")
    if not isinstance(model_name, str):
        raise DecodeError(f"the response's model_name must be a string, not {_json_name(type(model_name))}")
    response_id = fields.get("id")
    if response_id is not None and not isinstance(response_id, str):
        raise DecodeError(f"the response id must be a string, not {_json_name(type(response_id))}")
    parameters = _parameters("the response", fields)
    outputs, datatypes, _ = _tensors(view, header_end, header_length, fields, "output", limits)
    return InferenceResponse(model_name, response_id, outputs, datatypes, parameters)
